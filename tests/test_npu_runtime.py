"""The NPU simulator's C runtime (polyc_npu.h) through small C programs loaded with ctypes.

The cycle model is deterministic, so its numbers are asserted exactly. `Core` below is
the model written out again in Python from the runtime's header comment (a scoreboard of
pipes, a GM channel and per-buffer ready/free times), so that the C and this independent
copy must agree; the simplest cases are also spelled out as literal numbers.
"""
from __future__ import annotations

import ctypes
import subprocess
from collections import defaultdict
from functools import partial

import numpy as np
import pytest
import simharness
from simharness import Record, data, declare_run_api, declare_scenarios, launch_once

from polyc.codegen.build import cc
from polyc.targets.npu.machine import RUNTIME

build = partial(simharness.build, runtime=RUNTIME)
L1, L0A, L0B, L0C, UB = range(5)
LEVELS = ["L1", "L0A", "L0B", "L0C", "UB"]
CAPACITY = [1 << 20, 1 << 16, 1 << 16, 1 << 18, 1 << 18]
ALIGN = [32, 512, 512, 512, 32]
F16, F32 = 0, 1
PIPES = ["M", "V", "MTE2", "MTE3", "MTE1", "FIX"]
STATS = (["cycles", "flops", "gm_l1", "gm_ub", "l1_l0a", "l1_l0b", "l0c_ub", "ub_gm",
          "transfers"] + [f"hw_{level}" for level in LEVELS] + ["launches"]
         + [f"busy_{pipe}" for pipe in PIPES] + ["channel", "cube_f16", "cube_f32"]
         + [f"zero{i}" for i in range(24, 32)])
assert len(STATS) == 32


# --- the cycle model, written out -------------------------------------------------------

def gm(nbytes: int, cores: int = 1) -> int:
    """Busy cycles of a GM transfer: a fixed share of 64 / P B/cycle."""
    return -(-nbytes * cores // 64)


def mte1(grid_rows: int, grid_cols: int, elem_bytes: int) -> int:
    return -(-grid_rows * grid_cols * 256 * elem_bytes // 256)


def fix(rows: int, cols: int) -> int:
    return -(-rows * cols * 4 // 256)


def cube(m: int, n: int, k: int, dtype: int) -> int:
    return m * n * k * (1 if dtype == F16 else 4)


def vec(elements: int, ops: int) -> int:
    return ops * -(-elements // 64)


class Core:
    """One AI core's scoreboard; buffers and regions ("gm:x") by name."""

    def __init__(self, cores: int = 1):
        self.cores = cores
        self.pipe = dict.fromkeys(PIPES, 0)
        self.spans: list[tuple[int, int]] = []  # the GM channel's busy spans
        self.ready: dict[str, int] = defaultdict(int)
        self.free: dict[str, int] = defaultdict(int)
        self.busy = dict.fromkeys([*PIPES, "channel"], 0)

    def op(self, pipe, cycles, reads=(), writes=()):
        through_gm = pipe in ("MTE2", "MTE3")
        # a put does not wait for the previous put's data to land (MTE3 writes land in
        # issue order); every other write waits for the last one's
        landed = () if pipe == "MTE3" else writes
        start = max([self.pipe[pipe], *(self.ready[b] for b in (*reads, *landed)),
                     *(self.free[b] for b in writes)])
        end = start + cycles
        if through_gm:  # the channel's free spans from `start` on, first come first served
            t, left = start, cycles
            for lo, hi in sorted(self.spans):
                if hi <= t:
                    continue
                take = min(left, max(0, lo - t))
                if take:
                    self.spans.append((t, t + take))
                    left -= take
                if not left:
                    break
                t = max(t, hi)
            if left:
                self.spans.append((t, t + left))
                t += left
            end = t
        self.pipe[pipe] = end
        self.busy[pipe] += cycles
        if through_gm:
            self.busy["channel"] += cycles
        for b in writes:
            self.ready[b] = end + (300 if through_gm else 0)
        for b in reads:
            self.free[b] = max(self.free[b], end)
        return self

    def copy_in(self, dst, src, nbytes):
        return self.op("MTE2", gm(nbytes, self.cores), [src], [dst])

    def copy_out(self, dst, src, nbytes):
        return self.op("MTE3", gm(nbytes, self.cores), [src], [dst])

    @property
    def time(self) -> int:
        return max([*self.pipe.values(), *self.ready.values()])


# --- the harness ---------------------------------------------------------------------------

# Each scenario wraps x and y (nx and ny bytes) as GM regions and launches its body on
# `cores` cores as the kernel named after it; P(0..7) are its parameters. xr and yr are
# the host's own view of x and y, for peeking at on-chip buffers that no copy reaches.
HARNESS = r"""
#include "polyc_npu.h"
POLYC_NPU_EXPORTS

typedef struct { polyc_gm x, y; void *xr, *yr; size_t nx, ny; long long p[8]; } args_t;

#define SCENARIO(name)                                                                       \
  static void name##_body(polyc_npu_core *core, const args_t *t);                            \
  static void name##_entry(polyc_npu_core *core, const void *a) { name##_body(core, a); }    \
  void name(polyc_npu_run *run, int cores, void *x, size_t nx, void *y, size_t ny,           \
            const long long *p)                                                              \
  {                                                                                          \
    args_t t = {polyc_gm_wrap(run, x, nx, "x"), polyc_gm_wrap(run, y, ny, "y"), x, y, nx, ny, \
                {0}};                                                                        \
    memcpy(t.p, p, sizeof t.p);                                                              \
    polyc_npu_launch(run, #name, cores, name##_entry, &t);                                   \
  }                                                                                          \
  static void name##_body(polyc_npu_core *core, const args_t *t)

#define P(i) (t->p[i])
#define ID ((size_t)polyc_npu_id(core))
#define BLOCKS(n) (((n) + 15) / 16)
#define DEPS(...) (const void *const[]){__VA_ARGS__}
#define OUTS(...) (void *const[]){__VA_ARGS__}

SCENARIO(sc_get)  /* each core copies its p0 bytes of x into UB */
{
  char *ub = polyc_npu_alloc(core, POLYC_UB, "ub", P(0));
  polyc_npu_copy_in(core, ub, t->x, ID * P(0), 1, P(0), 0, 0);
}

SCENARIO(sc_box)  /* p0 runs of p1 bytes, p2 apart from byte p4 of x, packed in a buffer of
                     level p3; from UB back to the same places of y, from L1 peeked */
{
  char *buf = polyc_npu_alloc(core, P(3), "box", P(0) * P(1));
  polyc_npu_copy_in(core, buf, t->x, P(4), P(0), P(1), P(2), P(1));
  if (P(3) == POLYC_UB)
    polyc_npu_copy_out(core, t->y, P(4), buf, P(0), P(1), P(2), P(1));
  else
    memcpy(t->yr, buf, P(0) * P(1));
}

SCENARIO(sc_nz)  /* p0 x p1 elements of p2 bytes, rows p3 elements apart in x, into a grid of
                    p4 x p5 blocks in L1, peeked */
{
  size_t bytes = P(4) * P(5) * 256 * P(2);
  char *l1 = polyc_npu_alloc(core, POLYC_L1, "l1", bytes);
  polyc_npu_copy_in_nz(core, l1, t->x, 0, P(0), P(1), P(2), P(3) * P(2), P(4), P(5));
  memcpy(t->yr, l1, bytes);
}

SCENARIO(sc_load)  /* the float16 p0 x p1 matrix of x into L1, then the p4 x p5 blocks from
                      block (p2, p3) into L0A and into L0B, both peeked */
{
  long gr = BLOCKS(P(0)), gc = BLOCKS(P(1));
  size_t bytes = P(4) * P(5) * 512;
  char *l1 = polyc_npu_alloc(core, POLYC_L1, "l1", gr * gc * 512);
  char *a = polyc_npu_alloc(core, POLYC_L0A, "a", bytes), *b = polyc_npu_alloc(core, POLYC_L0B, "b", bytes);
  polyc_npu_copy_in_nz(core, l1, t->x, 0, P(0), P(1), 2, P(1) * 2, gr, gc);
  polyc_npu_load_l0(core, a, l1, gc, P(2), P(3), P(4), P(5), 2);
  polyc_npu_load_l0(core, b, l1, gc, P(2), P(3), P(4), P(5), 2);
  memcpy(t->yr, a, bytes);
  memcpy((char *)t->yr + bytes, b, bytes);
}

SCENARIO(sc_mma)  /* x = A (M x K) then B (K x N), row-major of dtype p0; M, N, K = p1, p2, p3;
                     y = A B as out dtype p4. p5 > 0: the first p5 blocks of K by one mma
                     (overwrite), the rest by a second (accumulate) through the same L0
                     buffers; else one mma */
{
  int dtype = P(0), out = P(4);
  long m = P(1), n = P(2), k = P(3), mb = BLOCKS(m), nb = BLOCKS(n), kb = BLOCKS(k);
  size_t eb = dtype == POLYC_NPU_F16 ? 2 : 4, oeb = out == POLYC_NPU_F16 ? 2 : 4;
  char *a1 = polyc_npu_alloc(core, POLYC_L1, "a1", mb * kb * 256 * eb);
  char *b1 = polyc_npu_alloc(core, POLYC_L1, "b1", kb * nb * 256 * eb);
  char *a0 = polyc_npu_alloc(core, POLYC_L0A, "a0", mb * kb * 256 * eb);
  char *b0 = polyc_npu_alloc(core, POLYC_L0B, "b0", kb * nb * 256 * eb);
  float *c0 = polyc_npu_alloc(core, POLYC_L0C, "c0", mb * nb * 1024);
  char *ub = polyc_npu_alloc(core, POLYC_UB, "ub", m * n * oeb);
  polyc_npu_copy_in_nz(core, a1, t->x, 0, m, k, eb, k * eb, mb, kb);
  polyc_npu_copy_in_nz(core, b1, t->x, m * k * eb, k, n, eb, n * eb, kb, nb);
  long first = P(5) > 0 ? P(5) : kb;
  polyc_npu_load_l0(core, a0, a1, kb, 0, 0, mb, first, eb);
  polyc_npu_load_l0(core, b0, b1, nb, 0, 0, first, nb, eb);
  polyc_npu_mma(core, c0, a0, b0, mb, nb, first, dtype, 0);
  if (first < kb) {
    polyc_npu_load_l0(core, a0, a1, kb, 0, first, mb, kb - first, eb);
    polyc_npu_load_l0(core, b0, b1, nb, first, 0, kb - first, nb, eb);
    polyc_npu_mma(core, c0, a0, b0, mb, nb, kb - first, dtype, 1);
  }
  polyc_npu_l0c_to_ub(core, ub, c0, nb, m, n, n, out);
  polyc_npu_copy_out(core, t->y, 0, ub, 1, m * n * oeb, 0, 0);
}

SCENARIO(sc_to_ub)  /* a p0 x p1 float32 fractal grid from x through L0C (peeked in as is) to
                       p2 x p3 elements in UB, rows p4 apart, as out dtype p5, then to y */
{
  size_t oeb = P(5) == POLYC_NPU_F16 ? 2 : 4, bytes = P(0) * P(1) * 1024;
  size_t out = ((P(2) - 1) * P(4) + P(3)) * oeb;
  float *c = polyc_npu_alloc(core, POLYC_L0C, "c", bytes);
  char *ub = polyc_npu_alloc(core, POLYC_UB, "ub", out);
  memcpy(c, t->xr, bytes);
  polyc_npu_l0c_to_ub(core, ub, c, P(1), P(2), P(3), P(4), P(5));
  polyc_npu_copy_out(core, t->y, 0, ub, 1, out, 0, 0);
}

SCENARIO(sc_chain)  /* p0 tiles of p2 floats: y = 2 x, p3 vector ops per element; p1 = 1: one
                       UB buffer (in, vector, out, in, ...); 2: two alternating, the next
                       tile's copy issued before this tile's vector */
{
  long tiles = P(0), nbuf = P(1), n = P(2);
  size_t bytes = n * sizeof(float);
  float *buf[2];
  buf[0] = polyc_npu_alloc(core, POLYC_UB, "ping", bytes);
  buf[1] = nbuf == 2 ? polyc_npu_alloc(core, POLYC_UB, "pong", bytes) : buf[0];
  polyc_npu_copy_in(core, buf[0], t->x, 0, 1, bytes, 0, 0);
  for (long i = 0; i < tiles; i++) {
    float *cur = buf[i % nbuf];
    if (nbuf == 2 && i + 1 < tiles)
      polyc_npu_copy_in(core, buf[(i + 1) % 2], t->x, (i + 1) * bytes, 1, bytes, 0, 0);
    for (long e = 0; e < n; e++)
      cur[e] *= 2;
    polyc_npu_vector(core, n, P(3), DEPS(cur), 1, OUTS(cur), 1);
    polyc_npu_copy_out(core, t->y, i * bytes, cur, 1, bytes, 0, 0);
    if (nbuf == 1 && i + 1 < tiles)
      polyc_npu_copy_in(core, cur, t->x, (i + 1) * bytes, 1, bytes, 0, 0);
  }
}

SCENARIO(sc_durations)  /* L1 -> L0A (m x k) and L0B (k x n), mma of dtype p3, L0C -> UB, a
                           vector op of p4 elements x p5 ops and p6 scalar ops on UB */
{
  long m = P(0), k = P(1), n = P(2);
  size_t eb = P(3) == POLYC_NPU_F16 ? 2 : 4;
  char *a1 = polyc_npu_alloc(core, POLYC_L1, "a1", m * k * 256 * eb);
  char *b1 = polyc_npu_alloc(core, POLYC_L1, "b1", k * n * 256 * eb);
  char *a0 = polyc_npu_alloc(core, POLYC_L0A, "a0", m * k * 256 * eb);
  char *b0 = polyc_npu_alloc(core, POLYC_L0B, "b0", k * n * 256 * eb);
  char *c0 = polyc_npu_alloc(core, POLYC_L0C, "c0", m * n * 1024);
  char *ub = polyc_npu_alloc(core, POLYC_UB, "ub", m * n * 1024);
  polyc_npu_load_l0(core, a0, a1, k, 0, 0, m, k, eb);
  polyc_npu_load_l0(core, b0, b1, n, 0, 0, k, n, eb);
  polyc_npu_mma(core, c0, a0, b0, m, n, k, P(3), 0);
  polyc_npu_l0c_to_ub(core, ub, c0, n, m * 16, n * 16, n * 16, POLYC_NPU_F32);
  polyc_npu_vector(core, P(4), P(5), DEPS(ub), 1, OUTS(ub), 1);
  polyc_npu_scalar(core, P(6), DEPS(ub + 4), 1, OUTS(ub + 8), 1);
}

SCENARIO(sc_channel)  /* p0 bytes in to one UB buffer, then p0 bytes out of another: only the
                         GM channel orders them */
{
  char *a = polyc_npu_alloc(core, POLYC_UB, "a", P(0)), *b = polyc_npu_alloc(core, POLYC_UB, "b", P(0));
  polyc_npu_copy_in(core, a, t->x, ID * P(0), 1, P(0), 0, 0);
  polyc_npu_copy_out(core, t->y, ID * P(0), b, 1, P(0), 0, 0);
}

SCENARIO(sc_overtake)  /* a put that waits for the vector unit (p1 ops on a), then a get of
                          p0 bytes into b issued after it, then a get of 4 p0 bytes into c */
{
  char *a = polyc_npu_alloc(core, POLYC_UB, "a", P(0)), *b = polyc_npu_alloc(core, POLYC_UB, "b", P(0));
  char *c = polyc_npu_alloc(core, POLYC_UB, "c", 4 * P(0));
  void *w[] = {a};
  polyc_npu_vector(core, 64, P(1), NULL, 0, w, 1);
  polyc_npu_copy_out(core, t->y, 0, a, 1, P(0), 0, 0);
  polyc_npu_copy_in(core, b, t->x, 0, 1, P(0), 0, 0);
  polyc_npu_copy_in(core, c, t->x, 0, 1, 4 * P(0), 0, 0);
}

SCENARIO(sc_all)  /* every operation once; odd first buffers show the alignment padding */
{
  char *pad_ub = polyc_npu_alloc(core, POLYC_UB, "pad_ub", 10);
  char *pad_a = polyc_npu_alloc(core, POLYC_L0A, "pad_a", 1);
  char *a1 = polyc_npu_alloc(core, POLYC_L1, "a1", 1024), *b1 = polyc_npu_alloc(core, POLYC_L1, "b1", 1024);
  char *a0 = polyc_npu_alloc(core, POLYC_L0A, "a0", 1024), *b0 = polyc_npu_alloc(core, POLYC_L0B, "b0", 1024);
  char *c0 = polyc_npu_alloc(core, POLYC_L0C, "c0", 1024);
  char *ub = polyc_npu_alloc(core, POLYC_UB, "ub", 1024), *ub2 = polyc_npu_alloc(core, POLYC_UB, "ub2", 256);
  (void)pad_ub, (void)pad_a;
  polyc_npu_copy_in_nz(core, a1, t->x, 0, 16, 32, 2, 64, 1, 2);
  polyc_npu_copy_in_nz(core, b1, t->x, 0, 32, 16, 2, 32, 2, 1);
  polyc_npu_load_l0(core, a0, a1, 2, 0, 0, 1, 2, 2);
  polyc_npu_load_l0(core, b0, b1, 1, 0, 0, 2, 1, 2);
  polyc_npu_mma(core, c0, a0, b0, 1, 1, 2, POLYC_NPU_F16, 0);
  polyc_npu_l0c_to_ub(core, ub, c0, 1, 16, 16, 16, POLYC_NPU_F32);
  polyc_npu_copy_in(core, ub2, t->x, 0, 1, 256, 0, 0);
  polyc_npu_vector(core, 256, 2, DEPS(ub, ub2 + 100), 2, OUTS(ub + 512), 1);
  polyc_npu_scalar(core, 5, DEPS(ub), 1, OUTS(ub), 1);
  polyc_npu_flops(core, 100);
  polyc_npu_copy_out(core, t->y, ID * 1024, ub, 1, 1024, 0, 0);
}

SCENARIO(sc_empty)  /* every operation empty: nothing moves, nothing is timed */
{
  char *l1 = polyc_npu_alloc(core, POLYC_L1, "l1", 512), *a = polyc_npu_alloc(core, POLYC_L0A, "a", 512);
  char *b = polyc_npu_alloc(core, POLYC_L0B, "b", 512), *c = polyc_npu_alloc(core, POLYC_L0C, "c", 1024);
  char *ub = polyc_npu_alloc(core, POLYC_UB, "ub", 1024);
  polyc_npu_copy_in(core, ub, t->x, 0, 0, 64, 64, 64);
  polyc_npu_copy_in(core, ub, t->x, 0, 4, 0, 64, 64);
  polyc_npu_copy_out(core, t->y, 0, ub, 1, 0, 0, 0);
  polyc_npu_copy_in_nz(core, l1, t->x, 0, 0, 16, 2, 32, 1, 1);
  polyc_npu_load_l0(core, a, l1, 1, 0, 0, 0, 1, 2);
  polyc_npu_mma(core, c, a, b, 1, 1, 0, POLYC_NPU_F16, 0);
  polyc_npu_l0c_to_ub(core, ub, c, 1, 16, 0, 16, POLYC_NPU_F32);
  polyc_npu_vector(core, 0, 5, DEPS(ub), 1, OUTS(ub), 1);
  polyc_npu_vector(core, 64, 0, DEPS(ub), 1, OUTS(ub), 1);
  polyc_npu_scalar(core, 0, DEPS(ub), 1, OUTS(ub), 1);
  memcpy(t->yr, l1, 512);
}

SCENARIO(sc_addresses)  /* per level: buffers of 3 and 5 bytes; peeks the second's offset
                           from the first and each start's remainder modulo 512 */
{
  long long *out = t->yr;
  for (int level = 0; level < POLYC_NPU_LEVELS; level++) {
    char *first = polyc_npu_alloc(core, level, "first", 3), *second = polyc_npu_alloc(core, level, "second", 5);
    out[3 * level] = second - first;
    out[3 * level + 1] = (uintptr_t)first % 512;
    out[3 * level + 2] = (unsigned char)first[0];
  }
}

SCENARIO(sc_capacity)  /* level p0: p1 bytes fit, p2 more do not, p3 more fit again */
{
  char *first = polyc_npu_alloc(core, P(0), "first", P(1));
  char *second = polyc_npu_alloc(core, P(0), "second", P(2));
  memset(second, 1, P(2));  /* the block outside the arena is writable: no crash */
  char *third = polyc_npu_alloc(core, P(0), "third", P(3));
  ((char *)t->yr)[0] = second[0];
  ((char *)t->yr)[1] = third[0];  /* fresh: 0xff */
  ((char *)t->yr)[2] = third >= first && third < first + P(1) + 512;  /* right after first */
}

SCENARIO(sc_align)  /* fractal operands off their level's alignment */
{
  char *l1 = polyc_npu_alloc(core, POLYC_L1, "l1", 4096), *a = polyc_npu_alloc(core, POLYC_L0A, "a", 2048);
  char *b = polyc_npu_alloc(core, POLYC_L0B, "b", 2048), *c = polyc_npu_alloc(core, POLYC_L0C, "c", 4096);
  char *ub = polyc_npu_alloc(core, POLYC_UB, "ub", 4096);
  switch (P(0)) {
  case 0: polyc_npu_mma(core, c, a + 256, b, 1, 1, 1, POLYC_NPU_F16, 0); break;
  case 1: polyc_npu_load_l0(core, b + 32, l1, 1, 0, 0, 1, 1, 2); break;
  case 2: polyc_npu_copy_in_nz(core, l1 + 16, t->x, 0, 16, 16, 2, 32, 1, 1); break;
  case 3: polyc_npu_l0c_to_ub(core, ub, c + 100, 1, 16, 16, 16, POLYC_NPU_F32); break;
  case 4: polyc_npu_load_l0(core, a, l1 + 8, 1, 0, 0, 1, 1, 2); break;
  case 5: polyc_npu_mma(core, c + 1024, a + 512, b + 512, 1, 1, 1, POLYC_NPU_F16, 0); break;
  }
}

SCENARIO(sc_level)  /* an operation on a buffer of a level it does not allow */
{
  char *l1 = polyc_npu_alloc(core, POLYC_L1, "l1", 1024), *a = polyc_npu_alloc(core, POLYC_L0A, "a", 512);
  char *b = polyc_npu_alloc(core, POLYC_L0B, "b", 512), *c = polyc_npu_alloc(core, POLYC_L0C, "c", 1024);
  char *ub = polyc_npu_alloc(core, POLYC_UB, "ub", 1024);
  switch (P(0)) {
  case 0: polyc_npu_mma(core, c, l1, b, 1, 1, 1, POLYC_NPU_F16, 0); break;
  case 1: polyc_npu_copy_in(core, a, t->x, 0, 1, 64, 0, 0); break;
  case 2: polyc_npu_copy_out(core, t->y, 0, l1, 1, 64, 0, 0); break;
  case 3: polyc_npu_load_l0(core, a, ub, 1, 0, 0, 1, 1, 2); break;
  case 4: polyc_npu_load_l0(core, c, l1, 1, 0, 0, 1, 1, 2); break;
  case 5: polyc_npu_l0c_to_ub(core, l1, c, 1, 16, 16, 16, POLYC_NPU_F32); break;
  case 6: polyc_npu_mma(core, ub, a, b, 1, 1, 1, POLYC_NPU_F16, 0); break;
  case 7: polyc_npu_copy_in_nz(core, ub, t->x, 0, 16, 16, 2, 32, 1, 1); break;
  case 8: polyc_npu_mma(core, c, a, a, 1, 1, 1, POLYC_NPU_F16, 0); break;
  }
}

SCENARIO(sc_oob_gm)  /* GM boxes past their region, handles not of this run */
{
  char *ub = polyc_npu_alloc(core, POLYC_UB, "ub", 2048), *l1 = polyc_npu_alloc(core, POLYC_L1, "l1", 512);
  polyc_gm none = {0}, foreign = {0};
  polyc_npu_run *other = NULL;
  switch (P(0)) {
  case 0: polyc_npu_copy_in(core, ub, t->x, t->nx - 32, 1, 64, 0, 0); break;
  case 1: polyc_npu_copy_out(core, t->y, t->ny - 32, ub, 1, 64, 0, 0); break;
  case 2: polyc_npu_copy_in(core, ub, t->x, 0, 4, 16, 64, 16); break;
  case 3: polyc_npu_copy_in_nz(core, l1, t->x, 64, 16, 16, 2, 64, 1, 1); break;
  case 4: polyc_npu_copy_in(core, ub, none, 0, 1, 64, 0, 0); break;
  case 5:
    other = polyc_npu_run_new();
    foreign = polyc_gm_wrap(other, t->xr, t->nx, "other");
    polyc_npu_copy_out(core, foreign, 0, ub, 1, 64, 0, 0);
    polyc_npu_run_free(other);
    break;
  }
}

SCENARIO(sc_oob_chip)  /* on-chip ranges past their buffer, pointers in no buffer, bad shapes */
{
  char stack[64] = {0};
  char *ub = polyc_npu_alloc(core, POLYC_UB, "ub", 256), *a_l1 = polyc_npu_alloc(core, POLYC_L1, "a_l1", 65536);
  char *l1 = polyc_npu_alloc(core, POLYC_L1, "l1", 1024), *a = polyc_npu_alloc(core, POLYC_L0A, "a", 512);
  char *b = polyc_npu_alloc(core, POLYC_L0B, "b", 512), *c = polyc_npu_alloc(core, POLYC_L0C, "c", 1024);
  char *last = polyc_npu_alloc(core, POLYC_UB, "last", 100);
  switch (P(0)) {
  case 0: polyc_npu_copy_in(core, stack, t->x, 0, 1, 64, 0, 0); break;
  case 1: polyc_npu_copy_in(core, ub + 128, t->x, 0, 2, 100, 100, 128); break;
  case 2: polyc_npu_copy_in_nz(core, a_l1, t->x, 0, 16, 16, 2, 32, 12, 16); break;
  case 3: polyc_npu_vector(core, 64, 1, DEPS(stack), 1, OUTS(ub), 1); break;
  case 4: polyc_npu_mma(core, c, a, b, 2, 2, 1, POLYC_NPU_F16, 0); break;
  case 5: polyc_npu_load_l0(core, a, l1, 2, 0, 1, 1, 2, 2); break;
  case 6: polyc_npu_copy_in_nz(core, l1, t->x, 0, 20, 16, 2, 32, 1, 1); break;
  case 7: polyc_npu_load_l0(core, a, l1, 1, 0, 0, 1, 1, 3); break;
  case 8: polyc_npu_mma(core, c, a, b, 1, 1, 1, 9, 0); break;
  case 9: polyc_npu_copy_in(core, ub, t->x, 0, -1, 64, 0, 0); break;
  case 10: polyc_npu_load_l0(core, a, l1, 2, 1, 0, 1, 2, 2); break;
  case 11: polyc_npu_scalar(core, 1, DEPS(ub), 1, OUTS(last + 100), 1); break;
  case 12: polyc_npu_l0c_to_ub(core, ub, c, 1, 2, 16, 8, POLYC_NPU_F32); break;
  case 13: polyc_npu_mma(core, c, a, b, 1, 1, 1, POLYC_NPU_F16, 2); break;
  case 14: polyc_npu_l0c_to_ub(core, ub, c, 1, 16, 16, 16, 7); break;
  case 15: polyc_npu_copy_out(core, t->y, 0, ub + 200, 1, 64, 0, 0); break;
  }
}

SCENARIO(sc_two_errors)
{
  char *ub = polyc_npu_alloc(core, POLYC_UB, "ub", 64);
  polyc_npu_copy_in(core, ub, t->x, t->nx, 1, 64, 0, 0);
  polyc_npu_alloc(core, POLYC_UB, "huge", 262145);
}

SCENARIO(sc_every_core_fails)  /* core 0 fails last in host time: it works first */
{
  (void)t;
  if (polyc_npu_id(core) == 0) {
    char *tile = polyc_npu_alloc(core, POLYC_UB, "tile", 200000);
    for (int i = 0; i < 20; i++) {
      memset(tile, i, 200000);
      __asm__ volatile("" ::: "memory");
    }
  }
  polyc_npu_alloc(core, POLYC_UB, "huge", 262145);
}

static void inner_body(polyc_npu_core *core, const void *a) { (void)core, (void)a; }

SCENARIO(sc_nested)
{
  (void)t;
  polyc_npu_launch(core->run, "inner", 2, inner_body, NULL);
}

SCENARIO(sc_region_from_core)
{
  (void)t;
  polyc_gm_alloc(core->run, 64, "late");
}

SCENARIO(sc_ids)  /* every core puts (id, count) at y[2 id] */
{
  int *pair = polyc_npu_alloc(core, POLYC_UB, "pair", 8);
  pair[0] = polyc_npu_id(core);
  pair[1] = polyc_npu_count(core);
  polyc_npu_copy_out(core, t->y, ID * 8, pair, 1, 8, 0, 0);
}
"""

@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib = build(tmp_path_factory.mktemp("npu"), "harness", HARNESS)
    declare_run_api(lib, "polyc_npu")
    declare_scenarios(lib, HARNESS, [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                     ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                                     ctypes.POINTER(ctypes.c_longlong)])
    return lib


class Run(simharness.Run):
    prefix = "polyc_npu"
    STATS = STATS

    def launch(self, scenario, cores=1, x=None, y=None, p=(), nx=None, ny=None):
        nx = (0 if x is None else x.nbytes) if nx is None else nx
        ny = (0 if y is None else y.nbytes) if ny is None else ny
        params = (ctypes.c_longlong * 8)(*p)
        getattr(self.lib, scenario)(self.ptr, cores, self.address(x), nx, self.address(y), ny,
                                    params)
        return self


def launch(lib, scenario, **kw) -> Record:
    return launch_once(Run, lib, scenario, **kw)


def fractal(matrix: np.ndarray, grid_rows: int, grid_cols: int) -> np.ndarray:
    """The blocks of `matrix` zero-padded to the grid, as (grid_rows, grid_cols, 16, 16)."""
    padded = np.zeros((grid_rows * 16, grid_cols * 16), matrix.dtype)
    padded[:matrix.shape[0], :matrix.shape[1]] = matrix
    return padded.reshape(grid_rows, 16, grid_cols, 16).transpose(0, 2, 1, 3)


def blocks(n: int) -> int:
    return -(-n // 16)


# --- copies and their data ------------------------------------------------------------

@pytest.mark.parametrize("level", [UB, L1])
def test_copy_in_and_out_move_a_strided_box(lib, level):
    x = data(16 * 64)
    y = np.zeros_like(x)
    # 6 runs of 40 bytes, every other 64-byte row from byte 72
    r = launch(lib, "sc_box", x=x, y=y, p=(6, 40, 128, level, 72))
    assert r.error is None
    runs = [slice(72 + 128 * i, 112 + 128 * i) for i in range(6)]
    if level == UB:
        box = np.zeros_like(x)
        for run in runs:
            box[run] = x[run]
        np.testing.assert_array_equal(y, box)  # the same places, nothing between
        assert (r.stats["gm_ub"], r.stats["ub_gm"], r.stats["gm_l1"]) == (240, 240, 0)
        assert r.stats["transfers"] == 2
        # the copy out waits for the data of the copy in: both latencies on the path
        assert r.stats["cycles"] == 2 * (gm(240) + 300) == 2 * (4 + 300)
    else:
        np.testing.assert_array_equal(y[:240], np.concatenate([x[run] for run in runs]))
        assert (r.stats["gm_l1"], r.stats["gm_ub"], r.stats["transfers"]) == (240, 0, 1)
        assert r.stats["cycles"] == gm(240) + 300


@pytest.mark.parametrize("dtype, rows, cols, stride, grid", [
    (np.float16, 20, 40, 43, (2, 3)),   # padding at the right and the bottom
    (np.float16, 32, 16, 16, (3, 2)),   # a grid larger than the matrix
    (np.float32, 17, 33, 40, (2, 3)),
    (np.float32, 16, 16, 16, (1, 1)),
])
def test_copy_in_nz_lays_out_blocks_and_zeroes_the_padding(lib, dtype, rows, cols, stride, grid):
    rng = np.random.default_rng(rows * cols)
    full = rng.standard_normal((rows, stride)).astype(dtype)  # rows `stride` elements apart
    eb = np.dtype(dtype).itemsize
    y = np.full(grid[0] * grid[1] * 256, 7, dtype)
    r = launch(lib, "sc_nz", x=full, y=y, p=(rows, cols, eb, stride, *grid))
    assert r.error is None
    np.testing.assert_array_equal(y, fractal(full[:, :cols], *grid).ravel())
    assert r.stats["gm_l1"] == rows * cols * eb and r.stats["transfers"] == 1
    assert r.stats["cycles"] == gm(rows * cols * eb) + 300


@pytest.mark.parametrize("row0, col0, grid_rows, grid_cols", [
    (0, 0, 4, 3), (1, 1, 2, 2), (3, 0, 1, 3), (2, 2, 2, 1)])
def test_load_l0_takes_a_sub_grid_of_blocks(lib, row0, col0, grid_rows, grid_cols):
    rows, cols = 64, 48
    a = np.random.default_rng(5).standard_normal((rows, cols)).astype(np.float16)
    n = grid_rows * grid_cols * 256
    y = np.zeros(2 * n, np.float16)
    r = launch(lib, "sc_load", x=a, y=y, p=(rows, cols, row0, col0, grid_rows, grid_cols))
    assert r.error is None
    want = fractal(a, 4, 3)[row0:row0 + grid_rows, col0:col0 + grid_cols].ravel()
    np.testing.assert_array_equal(y[:n], want)
    np.testing.assert_array_equal(y[n:], want)
    assert r.stats["l1_l0a"] == r.stats["l1_l0b"] == n * 2
    # both loads wait for the L1 data, then queue on MTE1
    assert r.stats["cycles"] == gm(rows * cols * 2) + 300 + 2 * mte1(grid_rows, grid_cols, 2)
    assert r.stats["busy_MTE1"] == 2 * mte1(grid_rows, grid_cols, 2)


def mma_model(dtype, m, n, k, out, split) -> Core:
    """sc_mma's operations replayed on the model."""
    eb, oeb = (2 if dtype == F16 else 4), (2 if out == F16 else 4)
    mb, nb, kb = blocks(m), blocks(n), blocks(k)
    first = split if split > 0 else kb
    c = Core()
    c.copy_in("a1", "gm:x", m * k * eb).copy_in("b1", "gm:x", k * n * eb)
    c.op("MTE1", mte1(mb, first, eb), ["a1"], ["a0"])
    c.op("MTE1", mte1(first, nb, eb), ["b1"], ["b0"])
    c.op("M", cube(mb, nb, first, dtype), ["a0", "b0"], ["c0"])
    if first < kb:
        c.op("MTE1", mte1(mb, kb - first, eb), ["a1"], ["a0"])
        c.op("MTE1", mte1(kb - first, nb, eb), ["b1"], ["b0"])
        c.op("M", cube(mb, nb, kb - first, dtype), ["a0", "b0"], ["c0"])
    c.op("FIX", fix(m, n), ["c0"], ["ub"])
    return c.copy_out("gm:y", "ub", m * n * oeb)


@pytest.mark.parametrize("dtype, m, n, k, out, split", [
    (F16, 32, 32, 32, F32, 0),
    (F16, 20, 24, 40, F32, 0),   # every dimension padded
    (F16, 48, 16, 64, F32, 1),   # accumulate: K blocks 0 | 1..3
    (F16, 33, 17, 50, F16, 2),   # accumulate, results rounded to float16
    (F32, 20, 24, 40, F32, 0),
    (F32, 16, 48, 48, F32, 2),
])
def test_mma_computes_a_matmul_in_float32(lib, dtype, m, n, k, out, split):
    rng = np.random.default_rng(m * n * k)
    np_type = np.float16 if dtype == F16 else np.float32
    a = rng.standard_normal((m, k)).astype(np_type)
    b = rng.standard_normal((k, n)).astype(np_type)
    out_type = np.float16 if out == F16 else np.float32
    y = np.zeros((m, n), out_type)
    r = launch(lib, "sc_mma", x=np.concatenate([a.ravel(), b.ravel()]), y=y,
               p=(dtype, m, n, k, out, split))
    assert r.error is None
    want = a.astype(np.float64) @ b.astype(np.float64)  # float16 products are exact in float32
    if out == F16:
        np.testing.assert_allclose(y.astype(np.float64), want, rtol=2e-3, atol=2e-3)
    else:
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    assert r.stats["flops"] == 8192 * blocks(m) * blocks(n) * blocks(k)
    unit = "cube_f16" if dtype == F16 else "cube_f32"
    assert r.stats[unit] == r.stats["flops"] and r.stats[
        "cube_f32" if dtype == F16 else "cube_f16"] == 0
    assert r.stats["cycles"] == mma_model(dtype, m, n, k, out, split).time


def test_mma_pipeline_cycles_written_out(lib):
    y = np.zeros((32, 32), np.float32)
    r = launch(lib, "sc_mma", x=np.ones(2 * 32 * 32, np.float16), y=y, p=(F16, 32, 32, 32, F32, 0))
    np.testing.assert_array_equal(y, np.full((32, 32), 32, np.float32))
    # A in 0..32 (ready 332), B 32..64 (364); L0A 332..340, L0B 364..372; mma 372..380;
    # FIX 380..396; out 396..460, there at 760
    assert r.stats["cycles"] == 760
    assert (r.stats["busy_MTE2"], r.stats["busy_MTE1"], r.stats["busy_M"], r.stats["busy_FIX"],
            r.stats["busy_MTE3"], r.stats["channel"]) == (64, 16, 8, 16, 64, 128)


@pytest.mark.parametrize("out, rows, cols, stride", [(F32, 20, 30, 30), (F16, 32, 40, 48),
                                                      (F32, 17, 33, 35), (F16, 1, 5, 0)])
def test_l0c_to_ub_turns_fractal_into_rows(lib, out, rows, cols, stride):
    grid = (2, 3)
    c = np.random.default_rng(1).standard_normal((32, 48)).astype(np.float32) * 1000
    out_type = np.float16 if out == F16 else np.float32
    y = np.full((rows - 1) * stride + cols, 9, out_type)
    r = launch(lib, "sc_to_ub", x=np.ascontiguousarray(fractal(c, *grid)), y=y,
               p=(*grid, rows, cols, stride, out))
    assert r.error is None
    got = np.stack([y[i * stride:i * stride + cols] for i in range(rows)])
    np.testing.assert_array_equal(got, c[:rows, :cols].astype(out_type))  # nearest even
    if stride > cols:
        assert (y[cols:stride].view(np.uint8) == 0xFF).all()  # the gap keeps the fresh bytes
    assert r.stats["l0c_ub"] == rows * cols * 4
    assert r.stats["busy_FIX"] == fix(rows, cols)


# --- the cycle model --------------------------------------------------------------------

@pytest.mark.parametrize("cores, nbytes", [(1, 4096), (4, 4096), (32, 4096), (1, 100), (3, 1000)])
def test_one_transfer_costs_its_share_of_the_bandwidth_then_the_latency(lib, cores, nbytes):
    r = launch(lib, "sc_get", cores=cores, x=data(nbytes * cores), p=(nbytes,))
    assert r.error is None
    assert r.stats["cycles"] == gm(nbytes, cores) + 300
    assert {(1, 4096): 364, (4, 4096): 556, (32, 4096): 2348, (1, 100): 302,
            (3, 1000): 347}[cores, nbytes] == r.stats["cycles"]
    assert r.stats["gm_ub"] == nbytes * cores and r.stats["transfers"] == cores


def chain_model(tiles: int, buffers: int, nbytes: int, ops: int) -> Core:
    """sc_chain's operations replayed on the model."""
    c = Core()
    names = ["ping", "pong"] if buffers == 2 else ["ping", "ping"]
    c.copy_in(names[0], "gm:x", nbytes)
    for i in range(tiles):
        cur = names[i % 2]
        if buffers == 2 and i + 1 < tiles:
            c.copy_in(names[(i + 1) % 2], "gm:x", nbytes)
        c.op("V", vec(nbytes // 4, ops), [cur], [cur])
        c.copy_out("gm:y", cur, nbytes)
        if buffers == 1 and i + 1 < tiles:
            c.copy_in(cur, "gm:x", nbytes)
    return c


@pytest.mark.parametrize("buffers, cycles", [
    # one buffer: in 0..64, there 364; vector 364..428; out 428..492 (there 792); the next
    # in waits for the out to read the buffer: 492..556, 856; vector 856..920; out
    # 920..984, there 1284
    (1, 1284),
    # two: in 0..64 and 64..128; vector 364..428 (ping), 428..492 (pong: ready 428); out
    # of ping 428..492 (there 792); out of pong right after it (puts land in order):
    # 492..556, there 856
    (2, 856),
])
def test_a_chain_through_ub_serialises_on_one_buffer_and_overlaps_on_two(lib, buffers, cycles):
    x = np.random.default_rng(2).standard_normal(2 * 1024).astype(np.float32)
    y = np.zeros_like(x)
    r = launch(lib, "sc_chain", x=x, y=y, p=(2, buffers, 1024, 4))
    assert r.error is None
    np.testing.assert_array_equal(y, 2 * x)
    assert r.stats["cycles"] == cycles == chain_model(2, buffers, 4096, 4).time


@pytest.mark.parametrize("tiles, ops", [(5, 1), (5, 20), (8, 6)])
def test_longer_chains_follow_the_model(lib, tiles, ops):
    x = np.arange(tiles * 256, dtype=np.float32)
    one, two = (launch(lib, "sc_chain", x=x, y=np.zeros_like(x), p=(tiles, b, 256, ops))
                for b in (1, 2))
    assert one.stats["cycles"] == chain_model(tiles, 1, 1024, ops).time
    assert two.stats["cycles"] == chain_model(tiles, 2, 1024, ops).time
    assert two.stats["cycles"] < one.stats["cycles"]
    assert one.stats["busy_V"] == two.stats["busy_V"] == tiles * vec(256, ops)


@pytest.mark.parametrize("m, k, n, dtype", [(2, 3, 1, F16), (2, 3, 1, F32), (1, 1, 4, F16)])
def test_mte1_cube_fix_and_vector_durations(lib, m, k, n, dtype):
    eb = 2 if dtype == F16 else 4
    r = launch(lib, "sc_durations", p=(m, k, n, dtype, 100, 3, 7))
    assert r.error is None
    durations = {"MTE1": mte1(m, k, eb) + mte1(k, n, eb), "M": cube(m, n, k, dtype),
                 "FIX": fix(16 * m, 16 * n), "V": vec(100, 3) + 7}
    assert durations["M"] == m * n * k * (1 if dtype == F16 else 4)
    assert durations["V"] == 3 * 2 + 7
    for pipe, cycles in durations.items():
        assert r.stats[f"busy_{pipe}"] == cycles
    assert r.stats["cycles"] == sum(durations.values())  # each waits for the one before
    assert r.stats["flops"] == 8192 * m * n * k


@pytest.mark.parametrize("cores", [1, 2, 8, 32])
def test_copies_in_and_out_share_the_core_gm_channel(lib, cores):
    nbytes = 2048
    r = launch(lib, "sc_channel", cores=cores, x=data(nbytes * cores),
               y=np.zeros(nbytes * cores, np.uint8), p=(nbytes,))
    assert r.error is None
    g = gm(nbytes, cores)
    # independent buffers and regions: the copy out still waits for the channel
    assert r.stats["cycles"] == 2 * g + 300
    assert (r.stats["busy_MTE2"], r.stats["busy_MTE3"], r.stats["channel"]) == (g, g, 2 * g)


def test_a_get_issued_after_a_waiting_put_goes_first_and_a_long_one_fills_the_gaps(lib):
    nbytes, ops = 1024, 40  # the put waits 40 cycles for the vector unit; a get takes 16
    r = launch(lib, "sc_overtake", x=data(4 * nbytes), y=np.zeros(nbytes, np.uint8),
               p=(nbytes, ops))
    assert r.error is None
    # the channel: get b 0..16, get c 16..40 then (the put's span 40..56) 56..96; c is
    # there at 396
    assert r.stats["cycles"] == 396
    c = Core()
    c.op("V", vec(64, ops), [], ["a"]).copy_out("gm:y", "a", nbytes)
    c.copy_in("b", "gm:x", nbytes).copy_in("c", "gm:x", 4 * nbytes)
    assert c.time == 396 and c.pipe["MTE3"] == 56


# --- stats ------------------------------------------------------------------------------

def all_model(cores: int) -> Core:
    """sc_all's operations replayed on the model."""
    c = Core(cores)
    c.copy_in("a1", "gm:x", 1024).copy_in("b1", "gm:x", 1024)
    c.op("MTE1", mte1(1, 2, 2), ["a1"], ["a0"]).op("MTE1", mte1(2, 1, 2), ["b1"], ["b0"])
    c.op("M", cube(1, 1, 2, F16), ["a0", "b0"], ["c0"])
    c.op("FIX", fix(16, 16), ["c0"], ["ub"])
    c.copy_in("ub2", "gm:x", 256)
    c.op("V", vec(256, 2), ["ub", "ub2"], ["ub"]).op("V", 5, ["ub"], ["ub"])
    return c.copy_out("gm:y", "ub", 1024)


def test_every_stats_field_over_two_launches(lib):
    x, y = data(1024), np.zeros(2048, np.uint8)
    with Run(lib) as run:
        run.launch("sc_all", cores=2, x=x, y=y).launch("sc_all", cores=1, x=x, y=y)
        assert run.error is None
        s = run.stats
    two, one = all_model(2), all_model(1)
    want = dict.fromkeys(STATS, 0)
    want.update(
        cycles=two.time + one.time, flops=3 * (8192 * 2 + 100), cube_f16=3 * 8192 * 2,
        gm_l1=3 * 2048, gm_ub=3 * 256, l1_l0a=3 * 1024, l1_l0b=3 * 1024, l0c_ub=3 * 1024,
        ub_gm=3 * 1024, transfers=3 * 4,
        hw_L1=2048, hw_L0A=512 + 1024, hw_L0B=1024, hw_L0C=1024, hw_UB=32 + 1024 + 256,
        launches=2, channel=two.busy["channel"] + one.busy["channel"],
        **{f"busy_{p}": two.busy[p] + one.busy[p] for p in PIPES})
    assert s == want
    assert (s["busy_MTE2"], s["busy_V"]) == (2 * (16 + 16 + 4) + (16 + 16 + 4), 2 * (8 + 5))


def test_high_water_is_per_core_and_the_most_over_the_run(lib):
    with Run(lib) as run:
        run.launch("sc_capacity", y=np.zeros(4, np.uint8), p=(UB, 1000, 300000, 10))
        # 1000 bytes, then 10 at 1024; the over-capacity block is not in the arena
        assert run.stats["hw_UB"] == 1034
        run.launch("sc_get", cores=4, x=data(4 * 2000), p=(2000,))
        assert run.stats["hw_UB"] == 2000  # one core's, not the four's 8000
        run.launch("sc_get", cores=1, x=data(500), p=(500,))
        s = run.stats
    assert s["hw_UB"] == 2000 and s["hw_L1"] == 0
    assert s["launches"] == 3


def test_a_clean_run_has_no_error_and_zero_stats(lib):
    with Run(lib) as run:
        assert run.error is None
        assert set(run.stats.values()) == {0}


def test_empty_operations_move_nothing_and_cost_nothing(lib):
    y = np.zeros(512, np.uint8)
    r = launch(lib, "sc_empty", x=data(4096), y=y)
    assert r.error is None
    assert (y == 0xFF).all()  # the empty copy_in_nz did not even zero its padding
    busy = {k: v for k, v in r.stats.items() if not k.startswith(("hw_", "launches"))}
    assert set(busy.values()) == {0}


def test_buffers_start_aligned_to_their_level_and_fresh_ones_are_0xff(lib):
    y = np.zeros(15, np.int64)
    r = launch(lib, "sc_addresses", y=y)
    assert r.error is None
    got = y.reshape(5, 3)
    assert list(got[:, 0]) == ALIGN
    assert list(got[:, 1]) == [0] * 5  # the arenas start 512-byte aligned
    assert list(got[:, 2]) == [0xFF] * 5
    assert [r.stats[f"hw_{level}"] for level in LEVELS] == [a + 5 for a in ALIGN]


# --- checks -----------------------------------------------------------------------------

@pytest.mark.parametrize("level", range(5))
def test_over_capacity_is_an_error_naming_the_level_not_a_crash(lib, level):
    cap, align = CAPACITY[level], ALIGN[level]
    first = cap - 20000 - 3
    y = np.zeros(3, np.uint8)
    r = launch(lib, "sc_capacity", cores=2, y=y, p=(level, first, 30000, 100))
    assert r.error == (f"kernel sc_capacity: {LEVELS[level]} buffer second of 30000 bytes does not "
                       f"fit: {first} of {cap} bytes in use")
    assert list(y) == [1, 0xFF, 1]  # the block was writable; third fitted after first
    assert r.stats[f"hw_{LEVELS[level]}"] == -(-first // align) * align + 100


@pytest.mark.parametrize("case, message", [
    (0, "mma from L0A buffer a: offset 256 is not 512-byte aligned"),
    (1, "load_l0 into L0B buffer b: offset 32 is not 512-byte aligned"),
    (2, "copy_in_nz into L1 buffer l1: offset 16 is not 32-byte aligned"),
    (3, "l0c_to_ub from L0C buffer c: offset 100 is not 512-byte aligned"),
    (4, "load_l0 from L1 buffer l1: offset 8 is not 32-byte aligned"),
    (5, None),  # inside the buffers, on block boundaries: fine
])
def test_fractal_operands_must_be_aligned(lib, case, message):
    r = launch(lib, "sc_align", x=data(1024), p=(case,))
    assert r.error == (None if message is None else f"kernel sc_align: {message}")
    assert r.stats["cycles"] == (1 if message is None else 0)


@pytest.mark.parametrize("case, message", [
    (0, "mma from L1 buffer l1: must be in L0A"),
    (1, "copy_in into L0A buffer a: must be in L1 or UB"),
    (2, "copy_out from L1 buffer l1: must be in UB"),
    (3, "load_l0 from UB buffer ub: must be in L1"),
    (4, "load_l0 into L0C buffer c: must be in L0A or L0B"),
    (5, "l0c_to_ub into L1 buffer l1: must be in UB"),
    (6, "mma into UB buffer ub: must be in L0C"),
    (7, "copy_in_nz into UB buffer ub: must be in L1"),
    (8, "mma from L0A buffer a: must be in L0B"),
])
def test_operations_refuse_buffers_of_other_levels(lib, case, message):
    y = np.full(1024, 7, np.uint8)
    r = launch(lib, "sc_level", x=data(1024), y=y, p=(case,))
    assert r.error == f"kernel sc_level: {message}"
    assert (y == 7).all()
    assert r.stats["cycles"] == r.stats["transfers"] == r.stats["flops"] == 0


@pytest.mark.parametrize("case, n, message", [
    (0, 1024, "copy_in from region x: box of 1 rows x 64 bytes (stride 0) at byte 992 reaches "
              "byte 1056, past its 1024 bytes"),
    (1, 1024, "copy_out into region y: box of 1 rows x 64 bytes (stride 0) at byte 992 reaches "
              "byte 1056, past its 1024 bytes"),
    (2, 200, "copy_in from region x: box of 4 rows x 16 bytes (stride 64) at byte 0 reaches "
             "byte 208, past its 200 bytes"),
    (3, 1024, "copy_in_nz from region x: box of 16 rows x 32 bytes (stride 64) at byte 64 "
              "reaches byte 1056, past its 1024 bytes"),
    (4, 1024, "copy_in from handle 0: not a GM region of this run"),
])
def test_gm_boxes_outside_their_region_are_refused(lib, case, n, message):
    y = np.full(n + 64, 7, np.uint8)  # the region is its first n bytes
    r = launch(lib, "sc_oob_gm", x=data(n), y=y, ny=n, p=(case,))
    assert r.error == f"kernel sc_oob_gm: {message}"
    assert (y == 7).all()
    assert r.stats["transfers"] == 0 and r.stats["cycles"] == 0


def test_a_handle_of_another_run_is_refused(lib):
    x = data(1024)
    r = launch(lib, "sc_oob_gm", x=x, y=np.zeros(1024, np.uint8), p=(5,))
    assert r.error.startswith("kernel sc_oob_gm: copy_out into handle 0x")
    assert r.error.endswith(": not a GM region of this run")
    np.testing.assert_array_equal(x, data(1024))  # the other run's region was not written
    assert r.stats["transfers"] == 0


@pytest.mark.parametrize("case, message", [
    (0, "copy_in into 64 bytes at an address in no buffer of this core"),
    (1, "copy_in into UB buffer ub: 228 bytes from offset 128 exceed its 256"),
    (2, "copy_in_nz into L1 buffer a_l1: 98304 bytes from offset 0 exceed its 65536"),
    (3, "vector from an address in no buffer of this core"),
    (4, "mma into L0C buffer c: 4096 bytes from offset 0 exceed its 1024"),
    (5, "load_l0: block columns 1..2 are outside a grid 2 blocks wide"),
    (6, "copy_in_nz: 20 rows x 16 cols do not fit a grid of 1 x 1 blocks"),
    (7, "load_l0: elem_bytes 3 is neither 2 nor 4"),
    (8, "mma: dtype 9 is neither POLYC_NPU_F16 nor POLYC_NPU_F32"),
    (9, "copy_in: rows -1 is negative"),
    (10, "load_l0 from L1 buffer l1: 2048 bytes from offset 0 exceed its 1024"),
    (11, "scalar into an address in no buffer of this core"),  # one past the last buffer
    (12, "l0c_to_ub: rows of 16 elements 8 elements apart overlap"),
    (13, "mma: accumulate 2 is neither 0 nor 1"),
    (14, "l0c_to_ub: out_dtype 7 is neither POLYC_NPU_F16 nor POLYC_NPU_F32"),
    (15, "copy_out from UB buffer ub: 64 bytes from offset 200 exceed its 256"),
])
def test_on_chip_ranges_and_shapes_are_checked(lib, case, message):
    y = np.full(1024, 7, np.uint8)
    r = launch(lib, "sc_oob_chip", x=data(1024), y=y, p=(case,))
    assert r.error == f"kernel sc_oob_chip: {message}"
    assert (y == 7).all()
    assert r.stats["cycles"] == r.stats["transfers"] == r.stats["flops"] == 0


def test_only_the_first_error_is_kept(lib):
    r = launch(lib, "sc_two_errors", x=data(64))
    assert r.error == ("kernel sc_two_errors: copy_in from region x: box of 1 rows x 64 bytes "
                       "(stride 0) at byte 64 reaches byte 128, past its 64 bytes")


def test_the_error_of_a_launch_is_its_lowest_failing_core(lib):
    r = launch(lib, "sc_every_core_fails", cores=8)
    assert r.error == ("kernel sc_every_core_fails: UB buffer huge of 262145 bytes does not fit: "
                       "200000 of 262144 bytes in use")


def test_the_management_side_keeps_its_error_before_a_launch(lib):
    with Run(lib) as run:
        run.launch("sc_ids", cores=0).launch("sc_two_errors", x=data(64))
        assert run.error == "kernel sc_ids: launch of 0 cores (the chip has 1..32)"


@pytest.mark.parametrize("scenario, message", [
    ("sc_nested", "kernel sc_nested: core 0: launches kernel inner from an AI core"),
    ("sc_region_from_core", "kernel sc_region_from_core: core 0: GM region late made by an AI core"),
])
def test_an_ai_core_cannot_manage(lib, scenario, message):
    r = launch(lib, scenario, cores=3)
    assert r.error == message
    assert r.stats["launches"] == 1


def test_a_launch_of_32_cores(lib):
    y = np.full(64, -1, np.int32)
    r = launch(lib, "sc_ids", cores=32, y=y)
    assert r.error is None
    np.testing.assert_array_equal(y.reshape(32, 2), np.stack([np.arange(32), np.full(32, 32)], 1))
    assert r.stats["cycles"] == gm(8, 32) + 300 == 304
    assert r.stats["transfers"] == 32 and r.stats["ub_gm"] == 256


@pytest.mark.parametrize("cores", [0, 33, -1])
def test_a_launch_needs_1_to_32_cores(lib, cores):
    r = launch(lib, "sc_ids", cores=cores, y=np.zeros(66, np.int32))
    assert r.error == f"kernel sc_ids: launch of {cores} cores (the chip has 1..32)"
    assert r.stats["launches"] == 0


DEREF = """
#include "polyc_npu.h"
float f(polyc_gm h) { return EXPR; }
"""


def test_ai_core_code_cannot_dereference_a_gm_handle(tmp_path):
    def compiles(e):
        c_file = tmp_path / "deref.c"
        c_file.write_text(DEREF.replace("EXPR", e))
        return subprocess.run([cc(), "-fsyntax-only", "-std=gnu11", f"-I{RUNTIME}", str(c_file)],
                              capture_output=True).returncode == 0
    assert compiles("(float)h.id")  # the snippet itself is fine
    for expr in ["*h", "h[0]", "*(h + 1)", "((float *)h)[0]", "*(float *)h"]:
        assert not compiles(expr), expr
