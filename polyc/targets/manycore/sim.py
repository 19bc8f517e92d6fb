"""Running compiled many-core kernels in the simulator (runtime/polyc_manycore.h).

A `ManycoreProgram` is a `polyc.codegen.runtime.Program` whose kernels take the run
first: `void NAME(polyc_mc_run *run, T *p0, ..., T *pn)`. Each call makes one run (the
simulated chip's record: cycles, bytes moved, the first error), calls the kernels in
order and frees the run; `profile` returns that record with the outputs. The runtime's
functions are static in every generated unit, so the shared object exports the run's
entry points through `POLYC_MC_EXPORTS` (`polyc_mc_run_new_x`, ...).
"""
from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from ...codegen.runtime import Program
from ...errors import PolycError
from ...graph.ir import Graph
from ...kernel import Kernel
from .machine import CORES, PEAK_FLOPS

_STATS = ("cycles", "flops", "main->ldm", "ldm->main", "transfers", "high_water", "launches")


class SimulatorError(PolycError):
    """A kernel broke the chip's rules (LDM capacity, a DMA out of bounds...): the
    runtime's message, naming the kernel and the buffer or region."""


class ManycoreProgram(Program):
    """Runs a compiled graph's kernels in the simulator; the same call contract as
    `Program` (inputs by name -> outputs by name), plus `profile()`."""
    simulated = True

    def __init__(self, graph: Graph, kernels: tuple[Kernel, ...], so_path: Path):
        super().__init__(graph, kernels, so_path)
        for k, fn in zip(kernels, self._fns):
            fn.argtypes = [ctypes.c_void_p] * (1 + len(k.params))
        lib = self._lib
        lib.polyc_mc_run_new_x.restype = ctypes.c_void_p
        lib.polyc_mc_run_new_x.argtypes = []
        lib.polyc_mc_run_free_x.restype = None
        lib.polyc_mc_run_free_x.argtypes = [ctypes.c_void_p]
        lib.polyc_mc_run_error_x.restype = ctypes.c_char_p
        lib.polyc_mc_run_error_x.argtypes = [ctypes.c_void_p]
        lib.polyc_mc_run_stats_x.restype = None
        lib.polyc_mc_run_stats_x.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_ulonglong)]

    def bind(self, inputs: Mapping[str, np.ndarray], out: Mapping[str, np.ndarray] | None = None
             ) -> tuple[dict[str, np.ndarray], list[Callable[[], None]]]:
        """As `Program.bind`; each call makes a run of its own (its record is lost: use
        `profile` for the figures)."""
        results, calls = super().bind(inputs, out)
        return results, [functools.partial(self._alone, call) for call in calls]

    def _alone(self, call: functools.partial) -> None:
        run = self._new_run()
        try:
            self._call(run, call)
        finally:
            self._lib.polyc_mc_run_free_x(run)

    def __call__(self, inputs: Mapping[str, np.ndarray],
                 out: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        return self._run(inputs, out)[0]

    def profile(self, inputs: Mapping[str, np.ndarray]) -> dict:
        """The outputs and the run's record: cycles, flops, peak_fraction (of 64 cores'
        16 FLOP/cycle), bytes each way, transfers, the LDM high-water mark and the same
        per kernel call."""
        results, total, per_kernel = self._run(inputs, None)
        return {"outputs": results, **_record(total),
                "kernels": [{"name": k.name, **_record(s, high_water=False)}
                            for k, s in zip(self.kernels, per_kernel)]}

    def _run(self, inputs, out):
        results, calls = super().bind(inputs, out)
        run = self._new_run()
        try:
            before, per_kernel = self._stats(run), []
            for call in calls:
                self._call(run, call)
                after = self._stats(run)
                # a kernel's share of every sum (its high-water mark is lost in the
                # run's maximum: _record leaves it out)
                per_kernel.append([a - b for a, b in zip(after, before)])
                before = after
            return results, before, per_kernel
        finally:
            self._lib.polyc_mc_run_free_x(run)

    def _new_run(self) -> int:
        run = self._lib.polyc_mc_run_new_x()
        if not run:
            raise MemoryError("polyc_mc_run_new: out of host memory")
        return run

    def _call(self, run: int, call: functools.partial) -> None:
        """One kernel with `run` before its buffers; the runtime's first error raised."""
        call.func(run, *call.args)
        error = self._lib.polyc_mc_run_error_x(run)
        if error is not None:
            raise SimulatorError(error.decode("utf-8", "replace"))

    def _stats(self, run) -> list[int]:
        out = (ctypes.c_ulonglong * 8)()
        self._lib.polyc_mc_run_stats_x(run, out)
        return list(out)


def _record(stats: list[int], high_water: bool = True) -> dict:
    s = dict(zip(_STATS, stats))
    cycles, flops = s["cycles"], s["flops"]
    record = {"cycles": cycles, "flops": flops,
              "peak_fraction": flops / (cycles * PEAK_FLOPS * CORES) if cycles else 0.0,
              "bytes": {"main->ldm": s["main->ldm"], "ldm->main": s["ldm->main"]},
              "transfers": s["transfers"], "launches": s["launches"]}
    if high_water:
        record["high_water"] = {"LDM": s["high_water"]}
    return record
