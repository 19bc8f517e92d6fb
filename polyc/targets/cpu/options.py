"""The cpu target's options: the common ones, the OpenMP team, and the microkernel choice."""
from __future__ import annotations

from dataclasses import dataclass

from ...microkernels import registry
from ...options import MAX_TILE, Options
from .winograd import TILES

MAX_THREADS = 1024  # an OpenMP team; more is a typo, and would spawn them all
ISAS = ("", *registry.ISAS)  # microkernel_isa: '' is the fastest measured on the host
GEMM_KERNELS = ("", *(m.name for m in registry.REGISTRY if m.kind == "gemm" and m.target == "cpu"))


@dataclass(frozen=True)
class CpuOptions(Options):
    microkernel_isa: str = ""  # '' the fastest measured, else 'avx512' | 'avx2' | 'portable'
    gemm_kernel: str = ""  # '' the fastest measured for the shape, else a registry name
    # (kernel, gemm kernel) pairs: that kernel's contraction on that one, over gemm_kernel
    # (a symbolic compile's probes keep each kernel's choice at its first probe)
    kernel_gemm: tuple[tuple[str, str], ...] = ()
    microkernel_tiles: tuple[tuple[str, int], ...] = ()  # (("kc", 256),): over model and tuning
    # the OpenMP team of every parallel loop (0: OMP_NUM_THREADS; column sums are then
    # blocked for one thread per core)
    threads: int = 0
    # tiles and gemm blocks cut each extent into equal parts (their sizes follow the
    # extent); False: the memory model's sizes alone, the same at every size, as a
    # symbolic compile needs (a remainder tile where they do not divide the extent)
    balance_tiles: bool = True
    # batch dims only a contraction's B reads become columns of its C (conv2d's images:
    # `plan.cpu_gemm_view`); False keeps a batch loop, as a symbolic batch needs (its
    # columns would be a block that grows with it), and B read in place is copied image
    # by image (`BRows.slices`), not as a copy of all images, which would grow with it
    fold_batch: bool = True
    # 3x3 convolutions of stride 1 by Winograd's F(2x2, 3x3) or F(4x4, 3x3) where it
    # pays (`winograd.py`); False: the direct convolution
    winograd: bool = True
    # the largest tile the plan may choose where it pays: 2, F(2x2, 3x3), whose rounding
    # is about a reordered sum's; 4, F(4x4, 3x3) too, faster on 28x28 images and larger,
    # its rounding about seven times 2's
    winograd_max_tile: int = 2
    # 2 or 4: that tile wherever the convolution is one, paying or not; 0: the plan's
    winograd_tile: int = 0

    def named_kernels(self) -> list[tuple[str, str]]:
        return super().named_kernels() + [(f"kernel_gemm.{k}", name)
                                          for k, (name, _) in enumerate(self.kernel_gemm)]

    def checks(self) -> list[tuple[str, bool, str]]:
        tiles_ok = all(len(t) == 2 and t[0] in ("mc", "nc", "kc") and 1 <= t[1] <= MAX_TILE
                       for t in self.microkernel_tiles)
        return super().checks() + [
            ("threads", 0 <= self.threads <= MAX_THREADS,
             f"must be 0 (OMP_NUM_THREADS) to {MAX_THREADS}, got {self.threads}"),
            ("microkernel_isa", self.microkernel_isa in ISAS,
             f"must be one of {', '.join(map(repr, ISAS))}, got {self.microkernel_isa!r}"),
            ("gemm_kernel", self.gemm_kernel in GEMM_KERNELS,
             f"must be one of {', '.join(map(repr, GEMM_KERNELS))}, got {self.gemm_kernel!r}"),
            ("kernel_gemm", all(len(p) == 2 and isinstance(p[0], str) and p[0]
                                and p[1] in GEMM_KERNELS[1:] for p in self.kernel_gemm)
             and len({p[0] for p in self.kernel_gemm}) == len(self.kernel_gemm),
             f"must be pairs of a kernel name, each once, and one of "
             f"{', '.join(map(repr, GEMM_KERNELS[1:]))}"),
            ("winograd_max_tile", self.winograd_max_tile in TILES,
             f"must be one of {', '.join(map(str, TILES))}, got {self.winograd_max_tile}"),
            ("winograd_tile", self.winograd_tile in (0, *TILES),
             f"must be 0 (the plan chooses) or one of {', '.join(map(str, TILES))}, "
             f"got {self.winograd_tile}"),
            ("microkernel_tiles", tiles_ok, "must be pairs of 'mc', 'nc' or 'kc' and a size "
             f"1 to {MAX_TILE}, got {[list(t) for t in self.microkernel_tiles]}"),
        ]
