"""Measured speed of each gemm microkernel on this host: what picks the default kernel.

The widest ISA is not always the fastest: Zen 4 runs a 512-bit FMA as two 256-bit
halves, so its avx512 14x32 kernel wins nothing there and loses at the edges. So the
first compile on a machine times every gemm kernel the target's flags can build and the
host can run, on packed operands that stay in cache (a 256-deep panel product over a
~96 x 192 block, the shape of the inner loops of the tiled GEMM), best of three short
rounds taken in turns, a few hundred milliseconds in all, timed in the thread's CPU
time: on a shared machine the time other tenants hold the core is no part of a kernel's
speed (timed by the clock, a loaded 2-core host measured the avx512 kernels at 39 and
52 GFLOP/s; in CPU time, 232 and 233, their speed on a quiet one). The rates are kept
in `calibration.json` in the cache directory, keyed by CPU model, core count, arch and
features, compiler, polyc version, the gemm kernels' C and METHOD: a new CPU, toolchain,
polyc, kernel or way of measuring measures again.

`registry.select` weighs each rate by the share of the kernel's multiply-adds that
land inside C (its edge waste) to choose; a target the host cannot run keeps the
registry's rank order.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os

from ...budget import once
from ...codegen.build import build_shared_object, compiler_version
from ...machine import Machine
from ...microkernels.registry import REGISTRY, c_source, unit_source
from ...paths import read_cache_json, write_cache_json
from .machine import cpu_model, cpu_toolchain, host_can_run

KC = 256  # panel depth: the memory model's usual kc
ROWS, COLS = 96, 192  # the block of C each round sweeps (rounded up to whole tiles)
ROUND_SECONDS = 0.03
ROUNDS = 3
METHOD = "thread CPU time, kernels in turns"  # part of the cache key

_HARNESS = r"""
#include <stdlib.h>
#include <time.h>
static double polyc_cal_now(void) {
  struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + 1e-9 * t.tv_nsec;
}
"""

_ONE = r"""
double polyc_calibrate_{name}(double seconds, int rounds) {{
  enum {{ KC = {kc}, MB = {mb}, NB = {nb}, MR = {mr}, NR = {nr} }};
  float *A = aligned_alloc(64, sizeof(float) * KC * MB);
  float *B = aligned_alloc(64, sizeof(float) * KC * NB);
  float *C = aligned_alloc(64, sizeof(float) * MB * NB);
  if (!A || !B || !C) {{ free(A); free(B); free(C); return 0.0; }}
  for (long i = 0; i < KC * MB; i++) A[i] = 1e-3f * (float)(i % 17);
  for (long i = 0; i < KC * NB; i++) B[i] = 1e-3f * (float)(i % 13);
  for (long i = 0; i < MB * NB; i++) C[i] = 0.0f;
  double best = 0.0;
  for (int round = 0; round < rounds; round++) {{
    long calls = 0;
    double start = polyc_cal_now(), now;
    do {{
      for (long jr = 0; jr < NB; jr += NR)
        for (long ir = 0; ir < MB; ir += MR)
          {fn}(KC, A + ir * KC, B + jr * KC, C + ir * NB + jr, NB, 1);
      calls += (MB / MR) * (NB / NR);
      now = polyc_cal_now();
    }} while (now - start < seconds);
    double rate = 2.0 * MR * NR * KC * calls / (now - start) / 1e9;
    if (rate > best) best = rate;
  }}
  free(A); free(B); free(C);
  return best;
}}
"""


def _up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


@functools.lru_cache(maxsize=None)
def _key(machine: Machine) -> str:
    from ...version import __version__
    model = cpu_model()
    toolchain = cpu_toolchain(machine)
    kernels = c_source([m for m in REGISTRY if m.kind == "gemm" and m.target == "cpu"])
    text = "\n".join([model, str(os.cpu_count()), machine.arch, ",".join(sorted(machine.features)),
                      compiler_version(toolchain.cc), __version__, METHOD, kernels])
    return hashlib.sha256(text.encode()).hexdigest()


_seen: dict[tuple[str, tuple[str, ...]], dict[str, float]] = {}  # this process's answers


FILE = "calibration.json"


def measure(machine: Machine, kernels) -> dict[str, float]:
    """GFLOP/s of each of `kernels` (gemm registry entries) on this host, built with the
    target's flags; {} when the host cannot run the target's code."""
    if not kernels or not host_can_run(machine.arch):
        return {}
    # linked as the kernels that call them will be: the parts are built once, here
    source = [_HARNESS, unit_source(list(kernels))]
    for m in kernels:
        source.append(_ONE.format(name=m.name, kc=KC, mb=_up(ROWS, m.mr), nb=_up(COLS, m.nr),
                                  mr=m.mr, nr=m.nr, fn=m.c_function))
    lib = ctypes.CDLL(str(build_shared_object("\n".join(source), cpu_toolchain(machine))))
    fns = {}
    for m in kernels:
        fn = getattr(lib, f"polyc_calibrate_{m.name}")
        fn.restype, fn.argtypes = ctypes.c_double, [ctypes.c_double, ctypes.c_int]
        fns[m.name] = fn
    best = dict.fromkeys(fns, 0.0)
    for _ in range(ROUNDS):  # in turns: a spell of cache or memory contention hits them alike
        for name, fn in fns.items():
            best[name] = max(best[name], float(fn(ROUND_SECONDS, 1)))
    return {name: round(rate, 1) for name, rate in best.items()}


def rates(machine: Machine, kernels) -> dict[str, float]:
    """The measured GFLOP/s of `kernels` on this host for `target`: from the cache file,
    else measured now and stored (written atomically: compilers may race)."""
    key = _key(machine)
    names = tuple(m.name for m in kernels)
    if (key, names) in _seen:
        return dict(_seen[key, names])
    entry = read_cache_json(FILE).get(key)
    if entry is not None and all(n in entry["rates"] for n in names):
        _seen[key, names] = entry["rates"]
        return dict(entry["rates"])
    with once():
        measured = measure(machine, kernels)
    if not measured:
        return {}
    _seen[key, names] = measured
    data = read_cache_json(FILE)
    data[key] = {"arch": machine.arch, "rates": measured}
    write_cache_json(FILE, data)
    return measured
