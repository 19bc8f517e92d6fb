"""The many-core target: a Sunway-like core group, simulated on the host.

64 compute cores with 256 KiB of LDM each reach main memory only by DMA; the management
core launches them (DESIGN.md, "Targets"). polyc's C for it compiles with gcc against
the simulator's runtime header (`runtime/polyc_manycore.h`: opaque main-memory handles,
LDM allocation with capacity checks, DMA with bounds checks and counters, the cycle model)
and runs here, compute cores as host threads; `sim.py` drives it from Python.

Its passes after the neutral ones:

    microkernels    contractions onto the fixed-shape 64x64x32 kernel (`gemm.py`): C
                    blocks per core in the LDM, A and B panels double-buffered
    tile-ldm        the outermost band cut into tiles whose buffers fit the LDM, every
                    array a tile touches promoted (`scratchpad/tiles.py`)
    recompute       what no buffer holds is recomputed where read
    lower-manycore  the tile loop dealt to the cores, vector loops marked
                    (`scratchpad/lower.py`)
    copies          the DMA copies grafted into the tree as statements (same)

then `builder.py` writes the compute-core and management-core functions.
"""
from __future__ import annotations

import islpy as isl

from ...codegen.cexpr import PRELUDE
from ...schedule_tree.passes import RECOMPUTE
from ...schedule_tree.state import Pass
from ..backend import Backend
from ..scratchpad.lower import copies_pass, lower_pass
from ..scratchpad.tiles import tile_pass
from .builder import ManycoreBuilder
from .gemm import MICROKERNELS, microkernel_name
from .machine import RUNTIME, manycore_machine, manycore_toolchain
from .options import ManycoreOptions
from .sim import ManycoreProgram

TILE = Pass("tile-ldm", tile_pass, changes_schedule=True)
LOWER = Pass("lower-manycore", lower_pass, changes_schedule=True)
# the copies move no statement instance: the tree before them was checked, and isl
# cannot flatten a tree with extension nodes into the map the check needs
COPIES = Pass("copies", copies_pass, changes_schedule=True, verify=False)


class ManycoreBackend(Backend):
    name = "manycore"
    options_type = ManycoreOptions

    def machine(self):
        return manycore_machine()

    def microkernels(self, machine, options):
        return lambda kernel, min_flops: microkernel_name(kernel, min_flops)

    def passes(self):
        return (MICROKERNELS, TILE, RECOMPUTE, LOWER, COPIES)

    def codegen(self, state, machine, options):
        build = isl.AstBuild.from_context(isl.Set.read_from_str(state.ctx, "{ : }"))
        builder = ManycoreBuilder(state.kernel, state.promotions, options.double_buffer)
        return str(builder.function(build.node_from_schedule(state.schedule))), ()

    def prelude(self, machine):
        return "#include <polyc_manycore.h>\nPOLYC_MC_EXPORTS\n" + PRELUDE

    def toolchain(self, machine):
        return manycore_toolchain(machine)

    def program(self, graph, kernels, so_path, machine, options):
        return ManycoreProgram(graph, kernels, so_path)


__all__ = ["ManycoreBackend", "ManycoreOptions", "RUNTIME", "manycore_machine"]
