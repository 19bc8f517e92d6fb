"""What this machine can do, measured in the same run as the benchmarks that cite it.

- `stream_triad_gbs(threads)`: STREAM triad a[i] = b[i] + s * c[i] over arrays far larger
  than the caches, counted as 3 x 8 bytes per element (two reads, one write), best of
  several runs and of the run's earlier measurements; a small C program built with the
  same gcc and flags polyc uses.
- `set_threads(n)`: the OpenMP thread count of polyc's kernels (and torch's, if loaded).
- `best_times(fns)`: the best time per call of several functions measured in turns.
- `spread_best_times(cases)`: `best_times` of many cases, each case's rounds spread over
  the whole run.
- `clock_for(threads)`: the clock to time calls with: on one thread, the calling thread's
  CPU time (numpy, PyTorch and polyc all run a one-thread call on the calling thread),
  so the time other tenants of a shared machine hold the core is not counted; on more,
  the wall clock (the best of many turns).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Mapping

TRIAD_C = r"""
#include <omp.h>
#include <stdlib.h>
double triad(long n, int reps, int threads) {
  double *a = aligned_alloc(64, n * 8), *b = aligned_alloc(64, n * 8), *c = aligned_alloc(64, n * 8);
  omp_set_num_threads(threads);
  #pragma omp parallel for schedule(static)
  for (long i = 0; i < n; i++) { a[i] = 0; b[i] = 1; c[i] = 2; }
  double best = 1e30;
  for (int r = 0; r < reps; r++) {
    double t = omp_get_wtime();
    #pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) a[i] = b[i] + 3.0 * c[i];
    t = omp_get_wtime() - t;
    if (t < best) best = t;
  }
  volatile double sink = a[n / 2]; (void)sink;
  free(a); free(b); free(c);
  return 3.0 * 8.0 * n / best / 1e9;
}
"""

_lib = None


def _triad_lib():
    global _lib
    if _lib is None:
        tmp = Path(tempfile.mkdtemp(prefix="polyc-bench-"))
        (tmp / "triad.c").write_text(TRIAD_C)
        subprocess.run(["gcc", "-O3", "-march=native", "-fopenmp", "-fPIC", "-shared",
                        "-o", str(tmp / "triad.so"), str(tmp / "triad.c")], check=True)
        _lib = ctypes.CDLL(str(tmp / "triad.so"))
        _lib.triad.restype = ctypes.c_double
        _lib.triad.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_int]
    return _lib


_best_triad: dict[tuple[int, int], float] = {}


def stream_triad_gbs(threads: int, elements: int = 1 << 25) -> float:
    """GB/s of the STREAM triad on `threads` threads (3 arrays of 256 MiB by default): the
    best this run has measured so far. A busy neighbour only ever lowers a measurement
    (one of 0.5 GB/s on a 20 GB/s host made a softmax run at "2357%" of it)."""
    gbs = _triad_lib().triad(elements, 10, threads)
    key = (threads, elements)
    _best_triad[key] = max(gbs, _best_triad.get(key, 0.0))
    return _best_triad[key]


def set_threads(n: int) -> None:
    gomp = ctypes.CDLL(ctypes.util.find_library("gomp") or "libgomp.so.1")
    gomp.omp_set_num_threads(n)
    try:
        import torch
        torch.set_num_threads(n)
    except ImportError:
        pass


def clock_for(threads: int) -> Callable[[], float]:
    return time.thread_time if threads == 1 else time.perf_counter


def clock_name(threads: int) -> str:
    return "thread CPU time" if threads == 1 else "wall clock"


def best_times(fns: Mapping[str, Callable[[], object]], *, rounds: int = 5, calls: int = 3,
               turn_s: float = 0.05, budget_s: float = 20.0,
               clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Seconds per call of each function, the best seen: other tenants of a shared
    machine only ever add time. The functions take turns, each turn at least `calls`
    timed calls and about `turn_s` seconds of them (after one untimed call), so a noisy
    spell hits every library alike instead of whichever one was being measured at the
    time, and a sub-millisecond kernel gets many chances at a quiet moment; rounds stop
    early past `budget_s`. `clock` times the calls (`clock_for`)."""
    best = {name: float("inf") for name in fns}
    start = time.perf_counter()
    for r in range(rounds):
        for name, fn in fns.items():
            # the previous library's thread pool (OpenMP, OpenBLAS, torch) spins for a
            # while after its last call: let it go idle first, so no one is timed against it
            time.sleep(0.3)
            t = time.perf_counter()
            fn()
            n = max(calls, int(turn_s / max(time.perf_counter() - t, 1e-6)))
            for _ in range(n):
                t = clock()
                fn()
                best[name] = min(best[name], clock() - t)
        if r and time.perf_counter() - start > budget_s:
            break
    return best


def paired_ratio(a: Callable[[], object], b: Callable[[], object], *, pairs: int = 40,
                 clock: Callable[[], float] = time.perf_counter,
                 settle_s: float = 0.0) -> tuple[float, float, float]:
    """Time of `a` over time of `b`, call by call: each pair's two calls back to back (in
    alternating order), the quartiles of the pairs' ratios. Best times taken apart miss
    a few percent: a slow spell of a shared machine moves both calls of a pair, not one
    row of a table against another (linear+gelu over its matmul alone, Zen 3: +5.9% at
    1 thread and -6.9% at 2 in one run of separate rows). `settle_s` is slept before
    each call: where a and b are libraries with thread pools of their own, the one that
    ran last spins for a few milliseconds after its call (libgomp's default), on the
    cores the other is timed on. After it, untimed calls for `settle_s` / 4 wake the
    pool again: its threads sleep by then, and the first calls timed what the host
    takes to wake an idle core, not the call (Zen 5 VM, batched 16x(256x64 @ 64x256) at
    2 threads, 20 ms after the last call, median of 30: polyc 7.5 ms, torch 7.1 ms; one
    call after a first untimed one 3.0 and 0.76 ms, after three 0.30 and 0.66 ms, as
    back to back)."""
    a(), b()
    ratios = []
    for i in range(pairs):
        times = {}
        for name, fn in (("a", a), ("b", b)) if i % 2 else (("b", b), ("a", a)):
            if settle_s:
                time.sleep(settle_s)
                woken = time.perf_counter() + settle_s / 4
                while time.perf_counter() < woken:
                    fn()
            t = clock()
            fn()
            times[name] = clock() - t
        ratios.append(times["a"] / times["b"])
    q1, median, q3 = statistics.quantiles(ratios, n=4)
    return median, q1, q3


def spread_best_times(cases: Mapping[str, Mapping[str, Callable[[], object]]], *,
                      rounds: int = 5, clock: Callable[[], float] = time.perf_counter,
                      progress: Callable[[int], None] | None = None
                      ) -> dict[str, dict[str, float]]:
    """`best_times` of each case (its functions in turns), with round r of every case
    before round r + 1 of any. A slow spell of a shared machine can last tens of seconds
    (Zen 3 VMs: ~42 against ~60 GFLOP/s, and not every library alike): taken case by
    case it may cover all of one case's rounds, and that case's ratios; spread so, it
    covers one round of several cases, each of which has its other rounds."""
    best = {case: {name: float("inf") for name in fns} for case, fns in cases.items()}
    for r in range(rounds):
        for case, fns in cases.items():
            for name, t in best_times(fns, rounds=1, clock=clock).items():
                best[case][name] = min(best[case][name], t)
        if progress is not None:
            progress(r)
    return best
