"""The many-core simulator's run record (runtime/polyc_manycore.h) as a profile."""
from __future__ import annotations

from ..scratchpad.sim import SimulatedProgram, SimulatorError
from .machine import CORES, PEAK_FLOPS

_STATS = ("cycles", "flops", "main->ldm", "ldm->main", "transfers", "high_water", "launches")


class ManycoreProgram(SimulatedProgram):
    prefix = "polyc_mc_run"
    n_stats = 8

    def record(self, stats: list[int], whole_run: bool) -> dict:
        """cycles, flops, peak_fraction (of 64 cores' 16 FLOP/cycle), bytes each way,
        transfers, launches and the LDM high-water mark."""
        s = dict(zip(_STATS, stats))
        cycles, flops = s["cycles"], s["flops"]
        out = {"cycles": cycles, "flops": flops,
               "peak_fraction": flops / (cycles * PEAK_FLOPS * CORES) if cycles else 0.0,
               "bytes": {"main->ldm": s["main->ldm"], "ldm->main": s["ldm->main"]},
               "transfers": s["transfers"], "launches": s["launches"]}
        if whole_run:
            out["high_water"] = {"LDM": s["high_water"]}
        return out


__all__ = ["ManycoreProgram", "SimulatorError"]
