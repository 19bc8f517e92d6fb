"""Checking a compiled graph against the reference executor, and timing its kernels.

What `polyc run` prints and the service's run endpoint answers: the largest absolute and
relative error of each output against `graph.reference.run_reference`, and the median
time of each kernel alone (host targets; a simulated chip reports its profile instead).
"""
from __future__ import annotations

import time
from typing import Callable, Mapping

import numpy as np

from .ir import Graph


def compare_outputs(graph: Graph, got: Mapping[str, np.ndarray], ref: Mapping[str, np.ndarray],
                    *, rtol: float, atol: float) -> list[dict]:
    """Per output: name, type, max_abs_err, max_rel_err, ok (numpy's allclose)."""
    rows = []
    for name in graph.outputs:
        a, r = got[name].astype(np.float64), ref[name].astype(np.float64)
        abs_err = float(np.max(np.abs(a - r))) if a.size else 0.0
        rel_err = float(np.max(np.abs(a - r) / np.maximum(np.abs(r), 1e-6))) if a.size else 0.0
        rows.append({"name": name, "type": str(graph.types[name]), "max_abs_err": abs_err,
                     "max_rel_err": rel_err, "ok": bool(np.allclose(a, r, rtol=rtol, atol=atol))})
    return rows


# how long calls run untimed before any is timed: a team's cores that slept (while gcc or
# the reference ran) wake and clock up over the first calls (Zen 5 VM, 2 threads,
# 8x2048x7x7 to 512 1x1: the best of 5 single calls 3.48 ms, in steady calls 1.73)
WARM_S = 0.05


def warm_up(calls: list[Callable[[], None]], seconds: float = WARM_S) -> float:
    """Run `calls` in order, again and again, for at least `seconds`; the seconds one
    round took on average."""
    rounds, start = 0, time.perf_counter()
    while not rounds or time.perf_counter() - start < seconds:
        for call in calls:
            call()
        rounds += 1
    return (time.perf_counter() - start) / rounds


def kernel_times(calls: list[Callable[[], None]], repeat: int) -> list[float]:
    """The median seconds of each bound kernel call (`Program.bind`), each timed alone in
    order, so its inputs are those the kernels before it wrote, once they run at speed
    (`warm_up`)."""
    warm_up(calls)
    per_kernel: list[list[float]] = [[] for _ in calls]
    for _ in range(repeat):
        for call, times in zip(calls, per_kernel):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
    return [float(np.median(t)) for t in per_kernel]
