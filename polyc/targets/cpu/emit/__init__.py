"""The cpu backend's codegen of microkernel marks, split by job: `gemm` (the region, its
buffers, row kernels), `pack` (operand panels), `brows` (B read in place), `writeback`
(the kernel call and the epilogue on the tile)."""
from .gemm import MicrokernelEmitter, handles

__all__ = ["MicrokernelEmitter", "handles"]
