"""The NPU target: an Ascend-like AI core, simulated on the host.

GM -> L1 -> L0A / L0B -> cube -> L0C -> UB <-> vector unit -> GM (DESIGN.md, "Targets").
polyc's C for it compiles with gcc against the simulator's runtime header
(`runtime/polyc_npu.h`: opaque GM handles, buffers per level with capacity and
alignment checks, copies with bounds and layout checks, the cube, counters and the cycle
model) and runs here, AI cores as host threads; `sim.py` reads its record.

Its passes after the neutral ones:

    cube            a contraction onto the cube (`cube.py`): C blocks in L0C, operands
                    GM -> L1 -> L0A/L0B as fractal matrices, the epilogue in UB
    tile-ub         the outermost band of every other kernel cut into tiles whose
                    buffers fit the unified buffer, every array promoted
                    (`scratchpad/tiles.py`)
    recompute       what no buffer holds is recomputed where read
    lower-npu       the tile loop dealt to the AI cores, vector loops marked
    copies          the copies grafted into the tree as statements

then `builder.py` writes each AI core's function and the host's launcher.
"""
from __future__ import annotations

import islpy as isl

from ...codegen.cexpr import PRELUDE
from ...schedule_tree.passes import RECOMPUTE
from ...schedule_tree.state import Pass
from ..backend import Backend
from ..scratchpad.lower import copies_pass, lower_pass
from ..scratchpad.tiles import tile_pass
from .builder import NpuBuilder
from .cube import CUBE, microkernel_name
from .machine import RUNTIME, npu_machine, npu_toolchain
from .options import NpuOptions
from .sim import NpuProgram

TILE = Pass("tile-ub", tile_pass, changes_schedule=True)
LOWER = Pass("lower-npu", lower_pass, changes_schedule=True)
COPIES = Pass("copies", copies_pass, changes_schedule=True, verify=False)


class NpuBackend(Backend):
    name = "npu"
    options_type = NpuOptions

    def machine(self):
        return npu_machine()

    def microkernels(self, machine, options):
        return lambda kernel, min_flops: microkernel_name(kernel, min_flops)

    def passes(self):
        return (CUBE, TILE, RECOMPUTE, LOWER, COPIES)

    def codegen(self, state, machine, options):
        build = isl.AstBuild.from_context(isl.Set.read_from_str(state.ctx, "{ : }"))
        builder = NpuBuilder(state.kernel, state.promotions, options.double_buffer)
        return str(builder.function(build.node_from_schedule(state.schedule))), ()

    def prelude(self, machine):
        return "#include <polyc_npu.h>\nPOLYC_NPU_EXPORTS\n" + PRELUDE

    def toolchain(self, machine):
        return npu_toolchain(machine)

    def program(self, graph, kernels, so_path, machine, options):
        return NpuProgram(graph, kernels, so_path, options.cores)


__all__ = ["NpuBackend", "NpuOptions", "RUNTIME", "npu_machine"]
