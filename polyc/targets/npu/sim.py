"""The NPU simulator's run record (runtime/polyc_npu.h) as a profile."""
from __future__ import annotations

from ..scratchpad.sim import SimulatedProgram
from .machine import CUBE_FLOPS, VECTOR_FLOPS

LEVELS = ("L1", "L0A", "L0B", "L0C", "UB")
PIPES = ("cube", "vector", "mte2", "mte3", "mte1", "fix")
MOVES = ("gm->l1", "gm->ub", "l1->l0a", "l1->l0b", "l0c->ub", "ub->gm")


class NpuProgram(SimulatedProgram):
    prefix = "polyc_npu_run"
    n_stats = 32

    def __init__(self, graph, kernels, so_path, cores: int):
        super().__init__(graph, kernels, so_path)
        self.cores = cores

    def record(self, stats: list[int], whole_run: bool) -> dict:
        """cycles, flops, peak_fraction, bytes per level pair, GM transfers, launches,
        each pipe's busy cycles and the GM channel's, and the high-water mark of every
        level. The units work side by side, so `peak_fraction` is the busiest unit's:
        its flops over the cycles times its peak (the cube's at the operand type it
        ran, or the vector unit's), on every core; `units` has each one's."""
        cycles, flops = stats[0], stats[1]
        cube16, cube32 = stats[22], stats[23]
        work = {"cube_float16": cube16 / CUBE_FLOPS["float16"],
                "cube_float32": cube32 / CUBE_FLOPS["float32"],
                "vector": (flops - cube16 - cube32) / VECTOR_FLOPS}
        span = cycles * self.cores
        units = {unit: w / span if span else 0.0 for unit, w in work.items()}
        out = {"cycles": cycles, "flops": flops, "peak_fraction": max(units.values()),
               "units": units, "bytes": dict(zip(MOVES, stats[2:8])), "transfers": stats[8],
               "launches": stats[14], "busy": dict(zip(PIPES, stats[15:21])),
               "gm_busy": stats[21]}
        if whole_run:
            out["high_water"] = dict(zip(LEVELS, stats[9:14]))
        return out
