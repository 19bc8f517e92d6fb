"""The many-core simulator: its C runtime (polyc_manycore.h) through small C programs
loaded with ctypes, and the Python driver (ManycoreProgram) on hand-written kernels.

The cycle model is deterministic, so its numbers are asserted exactly: a transfer of b
bytes in a launch of P cores costs 500 + ceil(b * P / 32) cycles (DESIGN.md, "Targets").
"""
from __future__ import annotations

import ctypes
import subprocess
from functools import partial

import numpy as np
import pytest
import simharness
from simharness import Record, data, declare_run_api, declare_scenarios, launch_once

from polyc import GraphBuilder, GraphError
from polyc.codegen.build import cc
from polyc.kernel import Array, Kernel
from polyc.microkernels import registry
from polyc.targets.manycore.machine import RUNTIME
from polyc.targets.manycore.sim import ManycoreProgram, SimulatorError

LDM = 262144
# the fixed-shape kernel is a microkernel file of its own, on the runtime's API
KERNEL = (registry.HERE / "mc_sgemm_64x64x32.c").read_text()
build = partial(simharness.build, runtime=RUNTIME)


def dma(nbytes: int, cores: int) -> int:
    """Cycles of one transfer of `nbytes` in a launch of `cores` cores, written out."""
    return 500 + -(-nbytes * cores // 32)


# Each scenario wraps x and y (n bytes each) as regions of the run and launches its body
# on `cores` cores as the kernel named after it; p0 and p1 are its parameters.
HARNESS = r"""
#include "polyc_manycore.h"
POLYC_MC_EXPORTS
""" + KERNEL + r"""

typedef struct { polyc_mm x, y; size_t n; long long p0, p1; } args_t;

#define SCENARIO(name)                                                                        \
  static void name##_body(polyc_mc_core *core, const args_t *t);                              \
  static void name##_entry(polyc_mc_core *core, const void *a) { name##_body(core, a); }      \
  void name(polyc_mc_run *run, int cores, void *x, void *y, size_t n, long long p0, long long p1) \
  {                                                                                           \
    args_t t = {polyc_mm_wrap(run, x, x ? n : 0, "x"), polyc_mm_wrap(run, y, y ? n : 0, "y"),  \
                n, p0, p1};                                                                   \
    polyc_mc_launch(run, #name, cores, name##_entry, &t);                                    \
  }                                                                                           \
  static void name##_body(polyc_mc_core *core, __attribute__((unused)) const args_t *t)

#define ID ((size_t)polyc_mc_id(core))

SCENARIO(sc_get)  /* each core gets its p0 bytes of x */
{
  char *tile = polyc_ldm_alloc(core, "tile", t->p0);
  polyc_dma_get(core, tile, t->x, ID * t->p0, 1, t->p0, 0, 0);
}

SCENARIO(sc_copy)  /* each core copies its p0 bytes of x to y through its LDM */
{
  char *tile = polyc_ldm_alloc(core, "tile", t->p0);
  polyc_dma_get(core, tile, t->x, ID * t->p0, 1, t->p0, 0, 0);
  polyc_dma_put(core, t->y, ID * t->p0, tile, 1, t->p0, 0, 0);
}

SCENARIO(sc_async)  /* an asynchronous get of p0 bytes under p1 cycles of compute, then
                      10 cycles of compute on its data */
{
  polyc_reply reply = {0};
  char *tile = polyc_ldm_alloc(core, "tile", t->p0);
  polyc_dma_iget(core, tile, t->x, ID * t->p0, 1, t->p0, 0, 0, &reply);
  polyc_mc_scalar(core, t->p1);
  polyc_dma_wait(core, &reply);
  polyc_mc_scalar(core, 10);
}

SCENARIO(sc_queue)  /* two gets of p0 bytes on one engine, p1 cycles of compute between */
{
  polyc_reply reply = {0};
  char *a = polyc_ldm_alloc(core, "a", t->p0), *b = polyc_ldm_alloc(core, "b", t->p0);
  polyc_dma_iget(core, a, t->x, 0, 1, t->p0, 0, 0, &reply);
  polyc_mc_scalar(core, t->p1);
  polyc_dma_iget(core, b, t->x, 0, 1, t->p0, 0, 0, &reply);
  polyc_dma_wait(core, &reply);
}

SCENARIO(sc_unwaited_put)  /* a put never waited for still ends the launch when it lands */
{
  polyc_reply reply = {0};
  char *tile = polyc_ldm_alloc(core, "tile", t->p0);
  polyc_dma_iput(core, t->y, 0, tile, 1, t->p0, 0, 0, &reply);
}

SCENARIO(sc_box)  /* p0 rows of p1 bytes every other row of x, packed in LDM, to y */
{
  char *tile = polyc_ldm_alloc(core, "tile", t->p0 * t->p1);
  polyc_dma_get(core, tile, t->x, 0, t->p0, t->p1, 2 * t->p1, t->p1);
  polyc_dma_put(core, t->y, 0, tile, t->p0, t->p1, t->p1, t->p1);
}

SCENARIO(sc_compute)
{
  polyc_mc_scalar(core, 7);
  polyc_mc_vector(core, 20, 3);  /* 3 * ceil(20 / 8) */
  polyc_mc_flops(core, 100);
}

SCENARIO(sc_sgemm)  /* x = A[64][32] B[32][64] C[64][64]; y = C + A B */
{
  float *a = polyc_ldm_alloc(core, "A", 8192), *b = polyc_ldm_alloc(core, "B", 8192);
  float *c = polyc_ldm_alloc(core, "C", 16384);
  polyc_dma_get(core, a, t->x, 0, 1, 8192, 0, 0);
  polyc_dma_get(core, b, t->x, 8192, 1, 8192, 0, 0);
  polyc_dma_get(core, c, t->x, 16384, 1, 16384, 0, 0);
  polyc_mc_sgemm_64x64x32(core, a, 32, b, 64, c, 64);
  polyc_dma_put(core, t->y, 0, c, 1, 16384, 0, 0);
}

SCENARIO(sc_sgemm_only)
{
  float *a = polyc_ldm_alloc(core, "A", 8192), *b = polyc_ldm_alloc(core, "B", 8192);
  float *c = polyc_ldm_alloc(core, "C", 16384);
  polyc_mc_sgemm_64x64x32(core, a, 32, b, 64, c, 64);
}

SCENARIO(sc_sgemm_bad)  /* p0 = 0: A runs 4 bytes past its buffer; 1: B is on the stack */
{
  float stack_b[2048] = {0};
  float *a = polyc_ldm_alloc(core, "A", 8192), *b = polyc_ldm_alloc(core, "B", 8192);
  float *c = polyc_ldm_alloc(core, "C", 16384);
  polyc_mc_sgemm_64x64x32(core, t->p0 == 0 ? a + 1 : a, 32, t->p0 == 1 ? stack_b : b, 64, c, 64);
}

SCENARIO(sc_ldm_overflow)
{
  char *big = polyc_ldm_alloc(core, "big", 200000);
  char *second = polyc_ldm_alloc(core, "second", 100000);
  memset(second, 1, 100000);  /* the scratch block is writable: no crash */
  polyc_dma_get(core, second, t->x, 0, 1, 64, 0, 0);
  char *third = polyc_ldm_alloc(core, "third", 1000);  /* still fits after the failure */
  polyc_dma_get(core, third, t->x, 0, 1, 64, 0, 0);
  polyc_dma_put(core, t->y, 0, third, 1, 64, 0, 0);
  (void)big;
}

SCENARIO(sc_oob_mm)  /* p0 = 0: get past x; 1: put past y; 2: a strided box past x */
{
  char *tile = polyc_ldm_alloc(core, "tile", 1024);
  if (t->p0 == 0)
    polyc_dma_get(core, tile, t->x, t->n - 32, 1, 64, 0, 0);
  else if (t->p0 == 1)
    polyc_dma_put(core, t->y, t->n - 32, tile, 1, 64, 0, 0);
  else
    polyc_dma_get(core, tile, t->x, 0, 4, 16, 64, 16);
}

SCENARIO(sc_oob_ldm)  /* p0 = 0: get overruns tile; 1: put box overruns tile; 2: not LDM */
{
  char stack[64];
  char *tile = polyc_ldm_alloc(core, "tile", 256);
  char *guard = polyc_ldm_alloc(core, "guard", 64);
  memset(guard, 0x5a, 64);
  if (t->p0 == 0)
    polyc_dma_get(core, tile, t->x, 0, 1, 512, 0, 0);
  else if (t->p0 == 1)
    polyc_dma_put(core, t->y, 0, tile + 128, 2, 100, 100, 128);
  else
    polyc_dma_get(core, stack, t->x, 0, 1, 64, 0, 0);
  polyc_dma_put(core, t->y, 0, guard, 1, 64, 0, 0);
}

SCENARIO(sc_bad_handle)  /* p0 = 0: a zero handle; 1: a handle of another run */
{
  char *tile = polyc_ldm_alloc(core, "tile", 64);
  polyc_mm h = {0};
  polyc_mc_run *other = NULL;
  if (t->p0 == 1) {
    other = polyc_mc_run_new();
    h = polyc_mm_wrap(other, tile, 64, "other");
  }
  polyc_dma_get(core, tile, h, 0, 1, 64, 0, 0);
  polyc_mc_run_free(other);
}

SCENARIO(sc_two_errors)
{
  char *tile = polyc_ldm_alloc(core, "tile", 64);
  polyc_dma_get(core, tile, t->x, t->n, 1, 64, 0, 0);
  polyc_ldm_alloc(core, "huge", LDM_TOO_BIG);
}

SCENARIO(sc_every_core_fails)  /* core 0 fails last in host time: it works first */
{
  if (polyc_mc_id(core) == 0) {
    char *tile = polyc_ldm_alloc(core, "tile", 200000);
    for (int i = 0; i < 20; i++) {
      memset(tile, i, 200000);
      __asm__ volatile("" ::: "memory");
    }
  }
  polyc_ldm_alloc(core, "huge", LDM_TOO_BIG);
}

static void inner_body(polyc_mc_core *core, const void *a) { (void)core, (void)a; }

SCENARIO(sc_nested)
{
  (void)t;
  polyc_mc_launch(core->run, "inner", 2, inner_body, NULL);
}

SCENARIO(sc_stats)  /* 100 + 100 bytes: the second starts at 128, so 228 bytes in use */
{
  char *a = polyc_ldm_alloc(core, "a", 100), *b = polyc_ldm_alloc(core, "b", 100);
  polyc_dma_get(core, a, t->x, 0, 1, 100, 0, 0);
  polyc_dma_get(core, b, t->x, 0, 1, 100, 0, 0);
  polyc_dma_put(core, t->y, 0, b, 1, 100, 0, 0);
}

SCENARIO(sc_ids)  /* every core puts (id, count) at y[2 id] */
{
  int *pair = polyc_ldm_alloc(core, "pair", 8);
  pair[0] = polyc_mc_id(core);
  pair[1] = polyc_mc_count(core);
  polyc_dma_put(core, t->y, ID * 8, pair, 1, 8, 0, 0);
}
""".replace("LDM_TOO_BIG", str(LDM + 1))

@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib = build(tmp_path_factory.mktemp("harness"), "harness", HARNESS)
    declare_run_api(lib, "polyc_mc")
    declare_scenarios(lib, HARNESS, [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                     ctypes.c_void_p, ctypes.c_size_t, ctypes.c_longlong,
                                     ctypes.c_longlong])
    return lib


class Run(simharness.Run):
    prefix = "polyc_mc"
    STATS = ("cycles", "flops", "in", "out", "transfers", "high_water", "launches", "zero")

    def launch(self, scenario, cores=1, x=None, y=None, p0=0, p1=0, n=None):
        if n is None:
            n = x.nbytes if x is not None else (y.nbytes if y is not None else 0)
        getattr(self.lib, scenario)(self.ptr, cores, self.address(x), self.address(y), n, p0, p1)
        return self


def launch(lib, scenario, **kw) -> Record:
    return launch_once(Run, lib, scenario, **kw)


# --- the cycle model ----------------------------------------------------------------

@pytest.mark.parametrize("cores", [1, 4, 64])
def test_synchronous_get_costs_latency_plus_bytes_over_the_fair_share(lib, cores):
    r = launch(lib, "sc_get", cores=cores, x=data(4096 * cores), p0=4096)
    assert r.error is None
    # 32 / P B/cycle each: 4096 bytes take 128, 512 and 8192 cycles after the 500
    assert r.stats["cycles"] == {1: 628, 4: 1012, 64: 8692}[cores] == dma(4096, cores)
    assert r.stats["in"] == 4096 * cores and r.stats["transfers"] == cores


def test_a_transfer_rounds_up_to_whole_cycles(lib):
    assert launch(lib, "sc_get", x=data(100), p0=100).stats["cycles"] == 500 + 4  # 100 / 32


def test_copy_moves_the_data_and_costs_two_transfers(lib):
    x, y = data(3 * 1024), np.zeros(3 * 1024, np.uint8)
    r = launch(lib, "sc_copy", cores=3, x=x, y=y, p0=1024)
    assert r.error is None
    np.testing.assert_array_equal(y, x)
    assert r.stats["cycles"] == 2 * (500 + 1024 * 3 // 32)
    assert (r.stats["in"], r.stats["out"], r.stats["transfers"]) == (3072, 3072, 6)


@pytest.mark.parametrize("compute, cycles", [(5000, 5000 + 10),  # the transfer (628) is hidden
                                             (100, 628 + 10),    # the compute is hidden
                                             (0, 628 + 10)])
def test_asynchronous_get_overlaps_compute_until_the_wait(lib, compute, cycles):
    r = launch(lib, "sc_async", x=data(4096), p0=4096, p1=compute)
    assert r.error is None and r.stats["cycles"] == cycles


def test_asynchronous_get_overlaps_with_the_fair_share_of_four_cores(lib):
    r = launch(lib, "sc_async", cores=4, x=data(4 * 4096), p0=4096, p1=1000)
    assert r.stats["cycles"] == dma(4096, 4) + 10 == 1022


@pytest.mark.parametrize("compute, cycles", [
    (0, 500 + 2 * 128),      # back to back on the engine: one latency, both busy times
    (1000, 1000 + 128 + 500),  # the engine is free again when the second is issued
    (50, 128 + 128 + 500),   # issued at 50, the second waits for the engine until 128
])
def test_transfers_queue_on_the_core_engine(lib, compute, cycles):
    r = launch(lib, "sc_queue", x=data(4096), p0=4096, p1=compute)
    assert r.error is None and r.stats["cycles"] == cycles and r.stats["transfers"] == 2


def test_a_launch_ends_when_its_last_put_lands(lib):
    r = launch(lib, "sc_unwaited_put", y=np.zeros(320, np.uint8), p0=320)
    assert r.stats["cycles"] == 510 and r.stats["out"] == 320


def test_scalar_and_vector_ops_cost_cycles_flops_only_count(lib):
    r = launch(lib, "sc_compute", cores=2)
    assert (r.stats["cycles"], r.stats["flops"]) == (7 + 9, 200)


def test_box_dma_moves_strided_rows_as_one_transfer(lib):
    x, y = data(16 * 64), np.zeros(16 * 64, np.uint8)
    r = launch(lib, "sc_box", x=x, y=y, p0=8, p1=64, n=x.nbytes)
    assert r.error is None
    np.testing.assert_array_equal(y[:512].reshape(8, 64), x.reshape(16, 64)[::2])
    assert not y[512:].any()
    assert (r.stats["transfers"], r.stats["in"], r.stats["out"]) == (2, 512, 512)
    assert r.stats["cycles"] == 2 * dma(512, 1)


# --- the 64x64x32 kernel -------------------------------------------------------------

def test_sgemm_64x64x32_computes_c_plus_a_b_in_16384_cycles(lib):
    rng = np.random.default_rng(7)
    a, b, c = (rng.standard_normal(s, dtype=np.float32) for s in [(64, 32), (32, 64), (64, 64)])
    x, y = np.concatenate([a.ravel(), b.ravel(), c.ravel()]), np.zeros(64 * 64, np.float32)
    r = launch(lib, "sc_sgemm", x=x, y=y)
    assert r.error is None
    want = c + a.astype(np.float64) @ b
    np.testing.assert_allclose(y.reshape(64, 64), want, rtol=1e-4, atol=1e-4)
    assert r.stats["cycles"] == dma(8192, 1) * 2 + dma(16384, 1) * 2 + 16384 == 19920
    assert r.stats["flops"] == 2 * 64 * 64 * 32
    assert r.stats["high_water"] == 32768


def test_sgemm_on_64_cores_reaches_peak(lib):
    r = launch(lib, "sc_sgemm_only", cores=64)
    assert r.error is None
    assert (r.stats["cycles"], r.stats["flops"]) == (16384, 64 * 262144)
    assert r.stats["flops"] / (r.stats["cycles"] * 16 * 64) == 1.0


@pytest.mark.parametrize("case, message", [
    (0, "kernel sc_sgemm_bad: core 0: sgemm_64x64x32: operand A of 8192 bytes at byte 4 of "
        "LDM buffer A runs past its 8192 bytes"),
    (1, "kernel sc_sgemm_bad: core 0: sgemm_64x64x32: operand B of 8192 bytes is in no LDM "
        "buffer of this core"),
])
def test_sgemm_operands_must_lie_in_ldm_buffers(lib, case, message):
    r = launch(lib, "sc_sgemm_bad", p0=case)
    assert r.error == message
    assert r.stats["flops"] == 0 and r.stats["cycles"] == 0


# --- LDM, bounds and errors ------------------------------------------------------------

def test_ldm_over_capacity_is_an_error_naming_kernel_and_buffer_not_a_crash(lib):
    x, y = data(64), np.zeros(64, np.uint8)
    r = launch(lib, "sc_ldm_overflow", cores=2, x=x, y=y)
    assert r.error == ("kernel sc_ldm_overflow: LDM buffer second of 100000 bytes does not fit: "
                        "200000 of 262144 bytes in use")
    np.testing.assert_array_equal(y, x)  # the code went on: third fitted and moved its data
    assert r.stats["high_water"] == 200000 + 1000


@pytest.mark.parametrize("case, message", [
    (0, "kernel sc_oob_mm: core 0: dma_get: box of 1 rows x 64 bytes (stride 0) at byte 992 of "
        "region x reaches byte 1056, past its 1024 bytes"),
    (1, "kernel sc_oob_mm: core 0: dma_put: box of 1 rows x 64 bytes (stride 0) at byte 992 of "
        "region y reaches byte 1056, past its 1024 bytes"),
    (2, "kernel sc_oob_mm: core 0: dma_get: box of 4 rows x 16 bytes (stride 64) at byte 0 of "
        "region x reaches byte 208, past its 200 bytes"),
])
def test_dma_outside_its_region_is_refused(lib, case, message):
    n = 200 if case == 2 else 1024
    x = data(n)
    y = np.full(n + 64, 7, np.uint8)  # the region is its first n bytes
    r = launch(lib, "sc_oob_mm", x=x, y=y, p0=case, n=n)
    assert r.error == message
    assert (y == 7).all()  # nothing written, inside the region or past it
    assert r.stats["transfers"] == 0 and r.stats["in"] == r.stats["out"] == 0


@pytest.mark.parametrize("case, message", [
    (0, "kernel sc_oob_ldm: core 0: dma_get: box of 1 rows x 512 bytes (LDM stride 0) at byte 0 "
        "of LDM buffer tile reaches byte 512, past its 256 bytes"),
    (1, "kernel sc_oob_ldm: core 0: dma_put: box of 2 rows x 100 bytes (LDM stride 128) at byte "
        "128 of LDM buffer tile reaches byte 356, past its 256 bytes"),
    (2, "kernel sc_oob_ldm: core 0: dma_get: box of 1 rows x 64 bytes (LDM stride 0) for region "
        "x: its LDM address is in no LDM buffer of this core"),
])
def test_dma_outside_its_ldm_buffer_is_refused(lib, case, message):
    x, y = data(1024), np.zeros(1024, np.uint8)
    r = launch(lib, "sc_oob_ldm", x=x, y=y, p0=case)
    assert r.error == message
    # the guard buffer after tile kept its bytes (the only transfer made is its put)
    assert (y[:64] == 0x5A).all() and not y[64:].any()
    assert r.stats["transfers"] == 1


@pytest.mark.parametrize("case", [0, 1])
def test_a_handle_not_of_this_run_is_refused(lib, case):
    r = launch(lib, "sc_bad_handle", p0=case)
    assert r.error is not None
    assert r.error.startswith("kernel sc_bad_handle: core 0: dma_get: handle ")
    assert r.error.endswith(" is not a main-memory region of this run")
    assert r.stats["transfers"] == 0


def test_only_the_first_error_is_kept(lib):
    r = launch(lib, "sc_two_errors", x=data(64))
    assert r.error.startswith("kernel sc_two_errors: core 0: dma_get: box of 1 rows x 64 bytes")


def test_the_error_of_a_launch_is_its_lowest_failing_core(lib):
    r = launch(lib, "sc_every_core_fails", cores=8)
    assert r.error == (f"kernel sc_every_core_fails: LDM buffer huge of {LDM + 1} bytes does not "
                        f"fit: 200000 of {LDM} bytes in use")


def test_a_compute_core_cannot_launch(lib):
    r = launch(lib, "sc_nested", cores=3)
    assert r.error == "kernel sc_nested: core 0: launches kernel inner from a compute core"
    assert r.stats["launches"] == 1


def test_a_clean_run_has_no_error_and_zero_stats(lib):
    with Run(lib) as run:
        assert run.error is None
        assert set(run.stats.values()) == {0}


# --- stats and launches ------------------------------------------------------------------

def test_stats_sum_over_cores_and_launches(lib):
    x, y = data(128), np.zeros(128, np.uint8)
    with Run(lib) as run:
        run.launch("sc_stats", cores=2, x=x, y=y).launch("sc_stats", cores=1, x=x, y=y)
        s = run.stats
        assert run.error is None
    assert s["launches"] == 2
    assert (s["in"], s["out"], s["transfers"]) == (3 * 200, 3 * 100, 3 * 3)
    assert s["high_water"] == 228  # 100 bytes, 28 of padding to 64-byte alignment, 100
    assert s["cycles"] == 3 * dma(100, 2) + 3 * dma(100, 1) == 3 * 507 + 3 * 504
    assert s["zero"] == 0
    np.testing.assert_array_equal(y[:100], x[:100])


def test_a_launch_of_64_cores(lib):
    y = np.full(128, -1, np.int32)
    r = launch(lib, "sc_ids", cores=64, y=y)
    assert r.error is None
    np.testing.assert_array_equal(y.reshape(64, 2), np.stack([np.arange(64), np.full(64, 64)], 1))
    assert r.stats["cycles"] == dma(8, 64) == 516
    assert r.stats["launches"] == 1 and r.stats["transfers"] == 64


@pytest.mark.parametrize("cores", [0, 65, -1])
def test_a_launch_needs_1_to_64_cores(lib, cores):
    r = launch(lib, "sc_ids", cores=cores, y=np.zeros(130, np.int32))
    assert r.error == f"kernel sc_ids: launch of {cores} cores (the chip has 1..64)"
    assert r.stats["launches"] == 0


DEREF = """
#include "polyc_manycore.h"
float f(polyc_mm h) { return EXPR; }
"""


@pytest.mark.parametrize("expr", ["*h", "h[0]", "*(h + 1)", "((float *)h)[0]", "*(float *)h"])
def test_compute_code_cannot_dereference_a_main_memory_handle(tmp_path, expr):
    def compiles(e):
        c_file = tmp_path / "deref.c"
        c_file.write_text(DEREF.replace("EXPR", e))
        return subprocess.run([cc(), "-fsyntax-only", "-std=gnu11", f"-I{RUNTIME}", str(c_file)],
                              capture_output=True).returncode == 0
    assert compiles("(float)h.id")  # the snippet itself is fine
    assert not compiles(expr)


# --- the Python driver -------------------------------------------------------------------

KERNELS = r"""
#include "polyc_manycore.h"
POLYC_MC_EXPORTS

#define N 600  /* 20 x 30 floats: 9 tiles of 64 and one of 24 */
#define TILE 64
typedef struct { polyc_mm x, c, y; } add_args;

static void add_body(polyc_mc_core *core, const void *p)
{
  const add_args *t = p;
  float *tile = polyc_ldm_alloc(core, "tile", TILE * sizeof(float));
  float *c = polyc_ldm_alloc(core, "c", sizeof(float));
  polyc_dma_get(core, c, t->c, 0, 1, sizeof(float), 0, 0);
  for (size_t start = (size_t)polyc_mc_id(core) * TILE; start < N;
       start += (size_t)polyc_mc_count(core) * TILE) {
    size_t len = N - start < TILE ? N - start : TILE;
    polyc_dma_get(core, tile, t->x, start * sizeof(float), 1, len * sizeof(float), 0, 0);
    for (size_t i = 0; i < len; i++)
      tile[i] += c[0];
    polyc_mc_vector(core, len, 1);
    polyc_mc_flops(core, len);
    polyc_dma_put(core, t->y, start * sizeof(float), tile, 1, len * sizeof(float), 0, 0);
  }
}

/* y = x + c[0] on 4 cores */
void k_add(polyc_mc_run *run, float *x, float *c, float *y)
{
  add_args a = {polyc_mm_wrap(run, x, N * sizeof(float), "x"),
                polyc_mm_wrap(run, c, sizeof(float), "c"),
                polyc_mm_wrap(run, y, N * sizeof(float), "y")};
  polyc_mc_launch(run, "k_add", 4, add_body, &a);
}

static void huge_body(polyc_mc_core *core, const void *p)
{
  (void)p;
  polyc_ldm_alloc(core, "huge", 300000);
}

void k_huge(polyc_mc_run *run, float *x, float *c, float *y)
{
  (void)x, (void)c, (void)y;
  polyc_mc_launch(run, "k_huge", 1, huge_body, NULL);
}
"""


@pytest.fixture(scope="module")
def kernels_so(tmp_path_factory):
    d = tmp_path_factory.mktemp("kernels")
    build(d, "kernels", KERNELS)
    return d / "kernels.so"


@pytest.fixture(scope="module")
def graph():
    b = GraphBuilder("add_twice")
    x = b.input("x", [20, 30])
    one = b.constant("one", [], [1.0])
    return b.build([b.add(b.add(x, one, out="t"), one, out="y")])


def add_kernel(graph, a, b, out, name="k_add"):
    arrays = (Array(a, a, graph.types[a], "in"), Array(b, b, graph.types[b], "in"),
              Array(out, out, graph.types[out], "out"))
    return Kernel(name, (out,), (), arrays)


def program(graph, so, names=("k_add", "k_add")):
    return ManycoreProgram(graph, (add_kernel(graph, "x", "one", "t", names[0]),
                                   add_kernel(graph, "t", "one", "y", names[1])), so)


def test_driver_runs_the_kernels_in_order_through_an_intermediate(graph, kernels_so):
    x = np.random.default_rng(3).standard_normal((20, 30), dtype=np.float32)
    prog = program(graph, kernels_so)
    np.testing.assert_array_equal(prog({"x": x})["y"], x + np.float32(1) + np.float32(1))
    out = np.zeros((20, 30), np.float32)
    got = prog({"x": -x}, out={"y": out})
    assert got["y"] is out
    np.testing.assert_array_equal(out, -x + np.float32(1) + np.float32(1))


def test_driver_profile_is_the_run_record(graph, kernels_so):
    x = np.ones((20, 30), np.float32)
    p = program(graph, kernels_so).profile({"x": x})
    np.testing.assert_array_equal(p["outputs"]["y"], np.full((20, 30), 3, np.float32))
    # P = 4: the scalar c takes dma(4, 4) = 501, a tile of 64 floats 532 each way and 8
    # vector cycles: core 0 (tiles 0, 4, 8) is the longest with 501 + 3 * 1072 per kernel
    per_kernel = dma(4, 4) + 3 * (2 * dma(256, 4) + 8)
    assert per_kernel == 3717
    assert [k["cycles"] for k in p["kernels"]] == [per_kernel, per_kernel]
    assert p["cycles"] == 2 * per_kernel
    assert p["flops"] == 2 * 600
    assert p["peak_fraction"] == 1200 / (2 * per_kernel * 16 * 64)
    assert p["bytes"] == {"main->ldm": 2 * (2400 + 4 * 4), "ldm->main": 2 * 2400}
    assert p["transfers"] == 2 * (4 + 10 + 10)
    assert p["high_water"] == {"LDM": 256 + 4}
    assert [k["name"] for k in p["kernels"]] == ["k_add", "k_add"]
    for field in ("flops", "transfers", "launches"):
        assert sum(k[field] for k in p["kernels"]) == p[field]
    for way in ("main->ldm", "ldm->main"):
        assert sum(k["bytes"][way] for k in p["kernels"]) == p["bytes"][way]
    assert p["launches"] == 2


def test_driver_raises_the_run_error(graph, kernels_so):
    prog = program(graph, kernels_so, names=("k_add", "k_huge"))
    with pytest.raises(SimulatorError, match="^kernel k_huge: LDM buffer huge of 300000 bytes "
                                             "does not fit: 0 of 262144 bytes in use$"):
        prog({"x": np.zeros((20, 30), np.float32)})


def test_driver_checks_inputs(graph, kernels_so):
    prog = program(graph, kernels_so)
    with pytest.raises(GraphError, match="input 'x' must be float32"):
        prog({"x": np.zeros((20, 30), np.float64)})
    with pytest.raises(GraphError, match=r"input 'x' \(float32\[20,30\]\) is missing"):
        prog.profile({})


def test_peak_fraction_of_an_empty_run_is_zero(tmp_path):
    b = GraphBuilder("copy")
    x = b.input("x", [3])
    build(tmp_path, "empty", '#include "polyc_manycore.h"\nPOLYC_MC_EXPORTS\n')
    prog = ManycoreProgram(b.build([x]), (), tmp_path / "empty.so")
    p = prog.profile({"x": np.ones(3, np.float32)})
    assert p["cycles"] == 0 and p["peak_fraction"] == 0.0 and p["kernels"] == []
    np.testing.assert_array_equal(p["outputs"]["x"], np.ones(3, np.float32))
