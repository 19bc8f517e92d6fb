"""Measured speed of each gemm microkernel on this host: what picks the default kernel.

The widest ISA is not always the fastest: Zen 4 runs a 512-bit FMA as two 256-bit
halves, so its avx512 14x32 kernel wins nothing there and loses at the edges. So the
first compile on a machine times every gemm kernel the target's flags can build and the
host can run, on packed operands that stay in cache (a 256-deep panel product over a
~96 x 192 block, the shape of the inner loops of the tiled GEMM), best of three short
rounds of 30 ms taken in turns (with the streaming ones below, 1.1 s for six kernels on
Zen 5, their build cached), timed in the thread's CPU time: on a shared machine the
time other tenants hold the core is no part of a kernel's speed (timed by the clock, a
loaded 2-core host measured the avx512 kernels at 39 and 52 GFLOP/s; in CPU time, 232
and 233, their speed on a quiet one).

Each kernel is also timed as it runs where C cannot stay in cache (`plan.streams_b`):
K blocks as deep as `tiles.model_tiles` makes them there, B's micro-panel an eighth of
L2 and A's block a quarter, so both stream from L2 at every call. What that costs
depends on the core: on Zen 3 the 6x16 kernel, which loads fewer floats a K step, ran
1.2-1.4x the 4x24's speed on folded 1x1 convolutions where the two tied in cache; on
Zen 5 neither avx512 kernel lost anything (8x48 265 GFLOP/s, 14x32 247, as in cache),
where weighing each by its loads had chosen the 14x32 (1024 x 1024 @ 1024 x 4096: 0.91x
the 8x48's speed).

The rates are kept in `calibration.json` in the cache directory, keyed by CPU model,
core count, arch and features, compiler, polyc version, the gemm kernels' C and METHOD:
a new CPU, toolchain, polyc, kernel or way of measuring measures again.

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
from .tiles import a_block_rows, streaming_kc

KC = 256  # panel depth: the memory model's usual kc
ROWS, COLS = 96, 192  # the block of C each round sweeps (rounded up to whole tiles)
ROUND_SECONDS = 0.03
ROUNDS = 3
METHOD = "thread CPU time, kernels in turns, in cache and streaming from L2"  # in the key

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


_seen: dict[tuple[str, tuple[str, ...]], dict] = {}  # this process's answers


FILE = "calibration.json"


def _blocks(m, machine: Machine, streaming: bool) -> tuple[int, int, int]:
    """kc, and the rows and columns of the block each round sweeps (whole tiles)."""
    if not streaming:
        return KC, _up(ROWS, m.mr), _up(COLS, m.nr)
    kc = streaming_kc(m, machine)
    return kc, _up(a_block_rows(kc, machine), m.mr), 2 * m.nr


def measure(machine: Machine, kernels) -> dict[str, dict[str, float]]:
    """GFLOP/s of each of `kernels` (gemm registry entries) on this host, built with the
    target's flags, in cache (`rates`) and with both operands streaming from L2
    (`streaming`); {} when the host cannot run the target's code."""
    if not kernels or not host_can_run(machine.arch):
        return {}
    # linked as the kernels that call them will be: the parts are built once, here
    source = [_HARNESS, unit_source(list(kernels))]
    runs = [(m, way) for m in kernels for way in ("rates", "streaming")]
    for m, way in runs:
        kc, mb, nb = _blocks(m, machine, way == "streaming")
        source.append(_ONE.format(name=f"{m.name}_{way}", kc=kc, mb=mb, nb=nb, mr=m.mr,
                                  nr=m.nr, fn=m.c_function))
    lib = ctypes.CDLL(str(build_shared_object("\n".join(source), cpu_toolchain(machine))))
    fns = {}
    for m, way in runs:
        fn = getattr(lib, f"polyc_calibrate_{m.name}_{way}")
        fn.restype, fn.argtypes = ctypes.c_double, [ctypes.c_double, ctypes.c_int]
        fns[m.name, way] = fn
    best = dict.fromkeys(fns, 0.0)
    for _ in range(ROUNDS):  # in turns: a spell of cache or memory contention hits them alike
        for run, fn in fns.items():
            best[run] = max(best[run], float(fn(ROUND_SECONDS, 1)))
    return {way: {m.name: round(best[m.name, way], 1) for m in kernels}
            for way in ("rates", "streaming")}


def rates(machine: Machine, kernels, streaming: bool = False) -> dict[str, float]:
    """The measured GFLOP/s of `kernels` on this host for `target`, in cache or with
    both operands streaming from L2 (`measure`): from the cache file, else measured now
    and stored (written atomically: compilers may race)."""
    key = _key(machine)
    names = tuple(m.name for m in kernels)
    way = "streaming" if streaming else "rates"
    if (key, names) in _seen:
        return dict(_seen[key, names][way])
    entry = read_cache_json(FILE).get(key)
    if entry is not None and all(n in entry.get(w, {}) for w in ("rates", "streaming")
                                  for n in names):
        _seen[key, names] = entry
        return dict(entry[way])
    with once():
        measured = measure(machine, kernels)
    if not measured:
        return {}
    _seen[key, names] = measured
    data = read_cache_json(FILE)
    data[key] = {"arch": machine.arch, **measured}
    write_cache_json(FILE, data)
    return dict(measured[way])
