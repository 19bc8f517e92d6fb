"""Running compiled kernels in a chip's simulator (its runtime header), from Python.

A `SimulatedProgram` is a `polyc.codegen.runtime.Program` whose kernels take the run
first: `void NAME(RUN *run, T *p0, ..., T *pn)`. Each call makes one run (the simulated
chip's record: cycles, bytes moved, the first error), calls the kernels in order and
frees the run; `profile` returns that record with the outputs. The runtime's functions
are static in every generated unit, so the shared object exports the run's entry points
(`<prefix>_run_new_x`, `_free_x`, `_error_x`, `_stats_x`). A target's subclass names the
prefix and reads its record.
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


class SimulatorError(PolycError):
    """A kernel broke the chip's rules (a buffer over capacity, a copy out of bounds...):
    the runtime's message, naming the kernel and the buffer or region."""


class SimulatedProgram(Program):
    """Runs a compiled graph's kernels in the simulator; the same call contract as
    `Program` (inputs by name -> outputs by name), plus `profile()`."""
    simulated = True
    _direct = None  # each kernel takes the run first: every call makes one (`_run`)
    prefix: str  # of the run's entry points, e.g. "polyc_mc_run"
    n_stats: int  # numbers in the run's record

    def __init__(self, graph: Graph, kernels: tuple[Kernel, ...], so_path: Path):
        super().__init__(graph, kernels, so_path)
        for k, fn in zip(kernels, self._fns):
            fn.argtypes = [ctypes.c_void_p] * (1 + len(k.params))
        self._new, self._free, self._error, self._read = (
            getattr(self._lib, f"{self.prefix}_{what}_x") for what in ("new", "free", "error", "stats"))
        self._new.restype, self._new.argtypes = ctypes.c_void_p, []
        self._free.restype, self._free.argtypes = None, [ctypes.c_void_p]
        self._error.restype, self._error.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
        self._read.restype = None
        self._read.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_ulonglong)]

    def record(self, stats: list[int], whole_run: bool) -> dict:
        """The profile's figures from the run's record (`whole_run`: the run's, with its
        high-water marks; else one kernel's share of the sums)."""
        raise NotImplementedError

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
            self._free(run)

    def __call__(self, inputs: Mapping[str, np.ndarray],
                 out: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        return self._run(inputs, out)[0]

    def profile(self, inputs: Mapping[str, np.ndarray]) -> dict:
        """The outputs and the run's record (DESIGN.md: cycles, flops, peak_fraction,
        bytes, transfers, high-water), and each kernel call's share under "kernels"."""
        results, total, per_kernel = self._run(inputs, None)
        return {"outputs": results, **self.record(total, True),
                "kernels": [{"name": k.name, **self.record(s, False)}
                            for k, s in zip(self.kernels, per_kernel)]}

    def _run(self, inputs, out):
        results, calls = super().bind(inputs, out)
        run = self._new_run()
        try:
            before, per_kernel = self._stats(run), []
            for call in calls:
                self._call(run, call)
                after = self._stats(run)
                # a kernel's share of every sum (a high-water mark is the run's maximum:
                # `record` leaves it out of a kernel's)
                per_kernel.append([a - b for a, b in zip(after, before)])
                before = after
            return results, before, per_kernel
        finally:
            self._free(run)

    def _new_run(self) -> int:
        run = self._new()
        if not run:
            raise MemoryError(f"{self.prefix}_new: out of host memory")
        return run

    def _call(self, run: int, call: functools.partial) -> None:
        """One kernel with `run` before its buffers; the runtime's first error raised."""
        call.func(run, *call.args)
        error = self._error(run)
        if error is not None:
            raise SimulatorError(error.decode("utf-8", "replace"))

    def _stats(self, run) -> list[int]:
        out = (ctypes.c_ulonglong * self.n_stats)()
        self._read(run, out)
        return list(out)
