/* polyc npu runtime: an Ascend-like AI core simulated on the host.
 *
 * The chip: global memory (GM) -> L1 (1 MiB) -> L0A / L0B (64 KiB each) -> cube unit ->
 * L0C (256 KiB) -> unified buffer UB (256 KiB) <-> vector unit -> GM. A launch runs P AI
 * cores (1..32) as host threads, each with fresh buffers of every level; the data really
 * moves and is really computed (the host computes the results) while a cycle model
 * times it. One header, C11 (gnu11) + pthreads; every function is `static inline` so that
 * each generated translation unit carries its own copy and -Wall stays quiet about the
 * unused ones. float16 elements are `_Float16` (gcc >= 12 on x86-64: IEEE binary16, what
 * numpy's float16 stores); float -> _Float16 rounds to nearest even, as a C cast does.
 *
 * Fractal layout: a matrix of R x C elements (R, C multiples of 16) is a grid of
 * (R/16) x (C/16) blocks of 16 x 16 elements, the grid row-major (block (br, bc) starts
 * at element (br * (C/16) + bc) * 256), each block row-major (element (r, c) of a block
 * at r * 16 + c). A block is 512 bytes of float16, 1024 of float32. "grid_cols" is C/16
 * of the matrix a buffer holds.
 *
 * Management side (the calling thread)
 *   polyc_npu_run *polyc_npu_run_new(void);           one call of a compiled graph, or NULL
 *   void polyc_npu_run_free(polyc_npu_run *run);      frees its GM scratch too
 *   polyc_gm polyc_gm_wrap(run, void *ptr, size_t bytes, const char *name);
 *   polyc_gm polyc_gm_alloc(run, size_t bytes, const char *name);   zeroed, freed with run
 *   void polyc_npu_launch(run, const char *kernel, int cores,
 *                         void (*body)(polyc_npu_core *, const void *args), const void *args);
 *       runs body on `cores` (1..32) threads with ids 0..cores-1, each with fresh buffers
 *       of every level, joins them and adds the launch to the run's record.
 *   Names (kernel, region, buffer) are kept by pointer: pass string literals. Regions are
 *   made on the management side only: one made by an AI core of the launch is an error.
 *
 * AI core
 *   int polyc_npu_id(core), polyc_npu_count(core)     this core, the cores of the launch
 *   void *polyc_npu_alloc(core, int level, const char *buffer, size_t bytes)
 *       from the core's arena of `level` (POLYC_L1, POLYC_L0A, POLYC_L0B, POLYC_L0C,
 *       POLYC_UB: 1048576, 65536, 65536, 262144, 262144 bytes), its start aligned to
 *       32 (L1, UB) or 512 bytes (L0A, L0B, L0C), never freed during the launch, filled
 *       with 0xff bytes (NaN as float32 and float16) so that a read before a write shows
 *       in the results. Over capacity it records "kernel K: UB buffer B of N bytes does
 *       not fit: U of 262144 bytes in use" and returns a block of N bytes outside the
 *       arena instead (registered like a buffer of that level, so the code goes on).
 *   polyc_npu_copy_in(core, void *dst, polyc_gm src, offset, rows, run_bytes, gm_stride,
 *                     dst_stride)                     GM -> L1 or UB, a box (MTE2)
 *       `rows` runs of `run_bytes` bytes, `gm_stride` bytes apart from byte `offset` of
 *       the region and `dst_stride` bytes apart in the buffer.
 *   polyc_npu_copy_out(core, polyc_gm dst, offset, const void *src, rows, run_bytes,
 *                      gm_stride, src_stride)         UB -> GM, a box (MTE3)
 *   polyc_npu_copy_in_nz(core, void *dst, polyc_gm src, offset, rows, cols, elem_bytes,
 *                        gm_row_stride, grid_rows, grid_cols)      GM -> L1 fractal (MTE2)
 *       the rows x cols row-major matrix at `offset` (row r at offset + r *
 *       gm_row_stride) becomes the top-left of a fractal matrix of grid_rows x grid_cols
 *       blocks at dst; the rest of the grid (the padding) is zero. elem_bytes 2 or 4; the
 *       elements are copied, not converted.
 *   polyc_npu_load_l0(core, void *dst, const void *src, src_grid_cols, row0, col0,
 *                     grid_rows, grid_cols, elem_bytes)            L1 -> L0A or L0B (MTE1)
 *       the grid_rows x grid_cols blocks from block (row0, col0) of the fractal matrix
 *       at src (grid width src_grid_cols) become the dense fractal matrix at dst.
 *   polyc_npu_mma(core, void *l0c, const void *l0a, const void *l0b, m, n, k, dtype,
 *                 accumulate)                          the cube (M)
 *       L0C (m x n blocks, float32) = (accumulate 0) or += (accumulate 1) L0A (m x k
 *       blocks) x L0B (k x n blocks); operands POLYC_NPU_F16 (_Float16) or POLYC_NPU_F32
 *       (float), products accumulated in float32, block by block along k.
 *   polyc_npu_l0c_to_ub(core, void *dst, const void *src, src_grid_cols, rows, cols,
 *                       dst_stride, out_dtype)          L0C -> UB, fractal -> ND (FIX)
 *       the top-left rows x cols elements of the float32 fractal matrix at src become
 *       rows of `cols` elements at dst, dst_stride elements apart, as float
 *       (POLYC_NPU_F32) or _Float16 (POLYC_NPU_F16, rounded to nearest even).
 *   polyc_npu_vector(core, elements, ops, reads, n_reads, writes, n_writes)
 *   polyc_npu_scalar(core, ops, reads, n_reads, writes, n_writes)
 *       the generated C computes on its buffers itself and declares the work here: the
 *       pointers, anywhere inside buffers of this core (any level), are the dependences.
 *   polyc_npu_flops(core, flops)                         counted, not timed
 *
 * The run's record (management side, between launches)
 *   const char *polyc_npu_run_error(run)               the first error, or NULL
 *   void polyc_npu_run_stats(run, unsigned long long out[32])
 *       0 cycles, 1 flops, bytes 2 gm->l1, 3 gm->ub, 4 l1->l0a, 5 l1->l0b, 6 l0c->ub (the
 *       float32 bytes read from L0C), 7 ub->gm, 8 GM transfers, 9..13 high-water marks of
 *       L1, L0A, L0B, L0C, UB (the most bytes one core had in use at once, alignment
 *       padding included), 14 launches, 15..20 busy cycles of the pipes M, V, MTE2, MTE3,
 *       MTE1, FIX and 21 of the GM channel (per launch its busiest core's, summed over
 *       launches), 22 and 23 the flops of the cube with float16 and with float32
 *       operands (of flops, 1), 24..31 zero.
 *   POLYC_NPU_EXPORTS (expand once per shared object) defines extern wrappers for ctypes:
 *       polyc_npu_run_new_x, polyc_npu_run_free_x, polyc_npu_run_error_x,
 *       polyc_npu_run_stats_x
 *
 * Cycle model (DESIGN.md, "Targets"): a scoreboard, not a clock.
 *   Each core has the pipes MTE2 (GM -> L1/UB), MTE3 (UB -> GM), MTE1 (L1 -> L0A/L0B),
 *   M (cube), FIX (L0C -> UB) and V (vector and scalar), each running its operations in
 *   issue order, and one GM channel shared by MTE2 and MTE3. Every operation is issued at
 *   once (the core's code never blocks); it starts at the latest of: its pipe free (the
 *   end of the pipe's previous operation); the `ready`
 *   (when the last writer's data is there) of every buffer it reads and of the GM region
 *   it reads; the `ready` and `free` (when the last reader is done) of every buffer it
 *   writes, and the `free` of the GM region it writes (puts land in issue order).
 *   Records are whole buffers and whole regions, per core.
 *   Durations:
 *   - GM transfer of b bytes (those read from or written to GM) in a launch of P cores:
 *     ceil(b * P / 64) cycles of the channel (each core's fixed share of the chip's
 *     64 B/cycle), taken from its start on in the spans the transfers issued before it
 *     left free (MTE2 and MTE3 share the bandwidth, not an order: a put waiting for the
 *     vector unit does not hold back the gets issued after it); it ends when its last
 *     span does, its pipe busy until then; the data is there 300 cycles later (the
 *     latency overlaps the next transfer): what it writes is ready at end + 300, what it
 *     reads free at end. One transfer.
 *   - MTE1: ceil(bytes / 256), bytes = grid_rows * grid_cols * 256 * elem_bytes.
 *   - FIX: ceil(rows * cols * 4 / 256).
 *   - M: m * n * k for float16 operands, 4 * m * n * k for float32 (flops += 8192 m n k).
 *   - V: ops * ceil(elements / 64) for vector, ops for scalar.
 *   Other operations end at start + duration: what they write is ready then, and what
 *   they read free then (free never moves back). An empty operation (0 rows, bytes,
 *   elements, ops, m, n or k) moves nothing, costs nothing and changes no record. A
 *   core's time is the latest end or ready it reached, every core starting at 0; a launch
 *   takes its longest core; a run's cycles are the sum of its launches'; the management
 *   side costs nothing.
 *
 * Checks, before anything moves; a violation records an error naming the kernel, the
 * operation, the buffer or region and the sizes, and skips the operation:
 *   - a GM handle must be one of this run's; a GM box must lie inside its region
 *     (offset + (rows - 1) * stride + run <= region bytes);
 *   - every on-chip pointer must lie in one buffer of this core, of a level the operation
 *     allows (copy_in: L1 or UB; copy_out: UB; copy_in_nz: L1; load_l0: L1 -> L0A or
 *     L0B; mma: L0C, L0A, L0B; l0c_to_ub: L0C -> UB; vector, scalar: any), and the whole
 *     range it touches must lie inside that buffer;
 *   - fractal operands (the L1 ones of copy_in_nz and load_l0, every L0A/L0B/L0C one)
 *     start aligned to their level (32 bytes in L1, 512 in L0*); the matrix fits its
 *     grid (rows <= grid_rows * 16, cols <= grid_cols * 16, the blocks load_l0 takes
 *     inside its source grid's width); elem_bytes is 2 or 4, dtypes and accumulate are
 *     one of theirs, sizes are not negative; l0c_to_ub's rows do not overlap.
 *   Only the first error of a run is kept: the management side's, or of a launch the
 *   one its lowest-numbered failing core met first (deterministic, unlike the threads'
 *   order).
 *
 * Not modelled: bank conflicts, the scalar unit's own pipe, partial-buffer dependences
 * (a write to half a buffer waits for every reader of the whole), address translation.
 */
#ifndef POLYC_NPU_H
#define POLYC_NPU_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../scratchpad/runtime/polyc_sim.h"

#define POLYC_NPU_MAX_CORES 32
#define POLYC_NPU_GM_LATENCY 300ULL
#define POLYC_NPU_GM_BYTES_PER_CYCLE 64ULL
#define POLYC_NPU_MTE1_BYTES_PER_CYCLE 256ULL
#define POLYC_NPU_FIX_BYTES_PER_CYCLE 256ULL
#define POLYC_NPU_LANES 64ULL
#define POLYC_NPU_BLOCK_FLOPS 8192ULL /* one 16x16x16 block product */
#define POLYC_NPU_ARENA_ALIGN 512     /* every arena starts at the strictest alignment */

enum { POLYC_L1, POLYC_L0A, POLYC_L0B, POLYC_L0C, POLYC_UB, POLYC_NPU_LEVELS };
enum { POLYC_NPU_F16, POLYC_NPU_F32 };

typedef struct polyc_npu_run polyc_npu_run;
typedef struct polyc_npu_core polyc_npu_core;
/* A struct, not a pointer, so that AI-core code cannot dereference global memory: gcc
   rejects `*h`, `h[0]` and `h + 1`. The id is a table index, not an address. */
typedef struct { unsigned long long id; } polyc_gm;

/* the pipes, in the order of their busy cycles in the record */
enum { POLYC_NPU__M, POLYC_NPU__V, POLYC_NPU__MTE2, POLYC_NPU__MTE3, POLYC_NPU__MTE1,
       POLYC_NPU__FIX, POLYC_NPU__PIPES };

/* the fields of the record (polyc_npu_run_stats) */
enum {
  POLYC_NPU__CYCLES, POLYC_NPU__FLOPS, POLYC_NPU__GM_L1, POLYC_NPU__GM_UB, POLYC_NPU__L1_L0A,
  POLYC_NPU__L1_L0B, POLYC_NPU__L0C_UB, POLYC_NPU__UB_GM, POLYC_NPU__TRANSFERS,
  POLYC_NPU__HIGH_WATER,                                   /* + level */
  POLYC_NPU__LAUNCHES = POLYC_NPU__HIGH_WATER + POLYC_NPU_LEVELS,
  POLYC_NPU__BUSY,                                         /* + pipe */
  POLYC_NPU__CHANNEL = POLYC_NPU__BUSY + POLYC_NPU__PIPES,
  POLYC_NPU__CUBE_F16, POLYC_NPU__CUBE_F32,                /* flops of the cube, by operands */
  POLYC_NPU__STATS = 32
};

typedef struct {
  unsigned long long ready, free;
} polyc_npu_record;

typedef struct {
  char *base;
  size_t bytes;
  const char *name;
  int level;
  polyc_npu_record record;
} polyc_npu_buffer;

/* A core records its own first error and the join keeps the lowest core's: no lock, and
   the same message on every run however the threads were scheduled. */
struct polyc_npu_run {
  polyc_sim_error error;
  polyc_sim_regions regions;
  /* arenas kept across launches: no 54 MiB of mmap per launch */
  char *arena[POLYC_NPU_MAX_CORES][POLYC_NPU_LEVELS];
  unsigned long long stat[POLYC_NPU__STATS];
};

struct polyc_npu_core {
  polyc_npu_run *run;
  const char *kernel;
  int id, count;
  void (*body)(polyc_npu_core *, const void *);
  const void *args;
  char *arena[POLYC_NPU_LEVELS];
  size_t used[POLYC_NPU_LEVELS];
  polyc_npu_buffer *buffers[POLYC_NPU_LEVELS];  /* bump-allocated, so sorted by address */
  size_t nbuffers[POLYC_NPU_LEVELS], cap_buffers[POLYC_NPU_LEVELS];
  polyc_npu_buffer *scratch;  /* over-capacity blocks, outside the arenas */
  size_t nscratch, cap_scratch;
  polyc_npu_record *gm;  /* this core's view of every region of the run: no sharing, no lock */
  size_t ngm;
  unsigned long long pipe[POLYC_NPU__PIPES], horizon;
  /* the GM channel's busy spans, sorted and disjoint (neighbours merged) */
  struct { unsigned long long lo, hi; } *busy;
  size_t nbusy, cap_busy;
  polyc_sim_error error;
  /* per core, combined at the join: no atomics on the hot path */
  unsigned long long stat[POLYC_NPU__STATS];
};

static inline size_t polyc_npu__capacity(int level)
{
  switch (level) {
  case POLYC_L1: return 1048576;
  case POLYC_L0A: case POLYC_L0B: return 65536;
  case POLYC_L0C: case POLYC_UB: return 262144;
  default: return 0;
  }
}

static inline size_t polyc_npu__alignment(int level)
{
  return level == POLYC_L1 || level == POLYC_UB ? 32 : POLYC_NPU_ARENA_ALIGN;
}

static inline const char *polyc_npu__level_name(int level)
{
  static const char *const names[] = {"L1", "L0A", "L0B", "L0C", "UB"};
  return level >= 0 && level < POLYC_NPU_LEVELS ? names[level] : "unknown-level";
}

/* The core an AI-core thread runs: management calls from it would race the run. */
static _Thread_local polyc_npu_core *polyc_npu__self;

/* --- management side ------------------------------------------------------------- */

static inline polyc_npu_run *polyc_npu_run_new(void)
{
  polyc_npu_run *run = calloc(1, sizeof *run);
  if (run)
    polyc_sim_regions_init(&run->regions, run);
  return run;
}

static inline void polyc_npu_run_free(polyc_npu_run *run)
{
  if (!run)
    return;
  polyc_sim_regions_free(&run->regions);
  for (int i = 0; i < POLYC_NPU_MAX_CORES; i++)
    for (int l = 0; l < POLYC_NPU_LEVELS; l++)
      free(run->arena[i][l]);
  free(run);
}

/* A region made during a launch would grow the table the cores are reading. */
static inline int polyc_npu__from_core(polyc_npu_run *run, const char *name)
{
  polyc_npu_core *self = polyc_npu__self;
  if (!self || self->run != run)
    return 0;
  polyc_sim_fail(&self->error, "kernel %s: core %d: GM region %s made by an AI core",
                 self->kernel, self->id, name);
  return 1;
}

static inline polyc_gm polyc_gm_wrap(polyc_npu_run *run, void *ptr, size_t bytes, const char *name)
{
  if (polyc_npu__from_core(run, name))
    return (polyc_gm){0};
  return (polyc_gm){polyc_sim_region_wrap(&run->regions, &run->error, ptr, bytes, name)};
}

static inline polyc_gm polyc_gm_alloc(polyc_npu_run *run, size_t bytes, const char *name)
{
  if (polyc_npu__from_core(run, name))
    return (polyc_gm){0};
  return (polyc_gm){polyc_sim_region_alloc(&run->regions, &run->error, bytes, name,
                                           "global memory")};
}

static inline void *polyc_npu__core_main(void *arg)
{
  polyc_npu_core *core = arg;
  polyc_npu__self = core;
  core->body(core, core->args);
  polyc_npu__self = NULL;
  return NULL;
}

static inline void polyc_npu__free_core(polyc_npu_core *core)
{
  for (size_t j = 0; j < core->nscratch; j++)
    free(core->scratch[j].base);
  free(core->scratch);
  for (int l = 0; l < POLYC_NPU_LEVELS; l++)
    free(core->buffers[l]);
  free(core->gm);
  free(core->busy);
}

static inline void polyc_npu_launch(polyc_npu_run *run, const char *kernel, int cores,
                                    void (*body)(polyc_npu_core *, const void *), const void *args)
{
  if (polyc_npu__self) {
    polyc_sim_fail(&polyc_npu__self->error, "kernel %s: core %d: launches kernel %s from an AI core",
                   polyc_npu__self->kernel, polyc_npu__self->id, kernel);
    return;
  }
  if (cores < 1 || cores > POLYC_NPU_MAX_CORES) {
    polyc_sim_fail(&run->error, "kernel %s: launch of %d cores (the chip has 1..%d)", kernel, cores,
                   POLYC_NPU_MAX_CORES);
    return;
  }
  polyc_npu_core *core = calloc((size_t)cores, sizeof *core);
  char *started = calloc((size_t)cores, 1);
  if (!core || !started) {
    polyc_sim_fail(&run->error, "kernel %s: out of host memory for %d cores", kernel, cores);
    goto out;
  }
  for (int i = 0; i < cores; i++) {
    core[i] = (polyc_npu_core){.run = run, .kernel = kernel, .id = i, .count = cores,
                               .body = body, .args = args, .ngm = run->regions.n};
    for (int l = 0; l < POLYC_NPU_LEVELS; l++) {
      if (!run->arena[i][l] &&
          !(run->arena[i][l] = aligned_alloc(POLYC_NPU_ARENA_ALIGN, polyc_npu__capacity(l)))) {
        polyc_sim_fail(&run->error, "kernel %s: out of host memory for the %s of core %d", kernel,
                       polyc_npu__level_name(l), i);
        goto out;
      }
      core[i].arena[l] = run->arena[i][l];
    }
    if (!(core[i].gm = calloc(run->regions.n ? run->regions.n : 1, sizeof *core[i].gm))) {
      polyc_sim_fail(&run->error, "kernel %s: out of host memory for the records of core %d", kernel, i);
      goto out;
    }
  }
  polyc_sim_run_cores(&run->error, kernel, "AI core", core, sizeof *core, cores,
                      polyc_npu__core_main, started);
  unsigned long long longest = 0, busiest[POLYC_NPU__STATS] = {0};
  for (int i = 0; i < cores; i++) {
    if (!started[i])
      continue;
    polyc_npu_core *c = &core[i];
    if (c->horizon > longest)
      longest = c->horizon;
    if (c->error.failed && !run->error.failed)
      run->error = c->error;
    for (int s = POLYC_NPU__FLOPS; s <= POLYC_NPU__TRANSFERS; s++)
      run->stat[s] += c->stat[s];
    for (int l = 0; l < POLYC_NPU_LEVELS; l++)
      if (c->stat[POLYC_NPU__HIGH_WATER + l] > run->stat[POLYC_NPU__HIGH_WATER + l])
        run->stat[POLYC_NPU__HIGH_WATER + l] = c->stat[POLYC_NPU__HIGH_WATER + l];
    for (int s = POLYC_NPU__BUSY; s <= POLYC_NPU__CHANNEL; s++)
      if (c->stat[s] > busiest[s])
        busiest[s] = c->stat[s];
  }
  for (int s = POLYC_NPU__BUSY; s <= POLYC_NPU__CHANNEL; s++)
    run->stat[s] += busiest[s];
  for (int i = 0; i < cores; i++)
    if (started[i])
      for (int s = POLYC_NPU__CUBE_F16; s <= POLYC_NPU__CUBE_F32; s++)
        run->stat[s] += core[i].stat[s];
  run->stat[POLYC_NPU__CYCLES] += longest;
  run->stat[POLYC_NPU__LAUNCHES]++;
out:
  if (core)
    for (int i = 0; i < cores; i++)
      polyc_npu__free_core(&core[i]);
  free(core);
  free(started);
}

/* --- AI core: buffers --------------------------------------------------------------- */

static inline int polyc_npu_id(polyc_npu_core *core) { return core->id; }
static inline int polyc_npu_count(polyc_npu_core *core) { return core->count; }

static inline void *polyc_npu__scratch_block(polyc_npu_core *core, int level, const char *buffer,
                                             size_t bytes)
{
  size_t align = polyc_npu__alignment(level);
  /* aligned_alloc wants a nonzero multiple of the alignment */
  size_t rounded = (bytes + align) & ~(align - 1);
  char *p = bytes <= SIZE_MAX - align ? aligned_alloc(align, rounded) : NULL;
  polyc_npu_buffer *scratch = p ? polyc_sim_grow(core->scratch, &core->cap_scratch, core->nscratch,
                                                   sizeof *scratch) : NULL;
  if (!scratch) {
    free(p);
    return NULL;  /* the error is recorded already; nothing better to hand back */
  }
  core->scratch = scratch;
  memset(p, 0xff, bytes);
  core->scratch[core->nscratch++] = (polyc_npu_buffer){p, bytes, buffer, level, {0, 0}};
  return p;
}

static inline void *polyc_npu_alloc(polyc_npu_core *core, int level, const char *buffer, size_t bytes)
{
  if (level < 0 || level >= POLYC_NPU_LEVELS) {
    polyc_sim_fail(&core->error, "kernel %s: buffer %s of %zu bytes: level %d is none of L1, L0A, "
                   "L0B, L0C, UB", core->kernel, buffer, bytes, level);
    return polyc_npu__scratch_block(core, level, buffer, bytes);
  }
  size_t capacity = polyc_npu__capacity(level), align = polyc_npu__alignment(level);
  size_t used = core->used[level];
  size_t start = (used + align - 1) & ~(align - 1);
  if (bytes > capacity || start > capacity - bytes) {
    polyc_sim_fail(&core->error, "kernel %s: %s buffer %s of %zu bytes does not fit: "
                   "%zu of %zu bytes in use", core->kernel, polyc_npu__level_name(level),
                   buffer, bytes, used, capacity);
    return polyc_npu__scratch_block(core, level, buffer, bytes);
  }
  polyc_npu_buffer *buffers = polyc_sim_grow(core->buffers[level], &core->cap_buffers[level],
                                              core->nbuffers[level], sizeof *buffers);
  if (!buffers) {
    polyc_sim_fail(&core->error, "kernel %s: %s buffer %s: out of host memory for the buffer table",
                   core->kernel, polyc_npu__level_name(level), buffer);
    return polyc_npu__scratch_block(core, level, buffer, bytes);
  }
  core->buffers[level] = buffers;
  char *p = core->arena[level] + start;
  buffers[core->nbuffers[level]++] = (polyc_npu_buffer){p, bytes, buffer, level, {0, 0}};
  core->used[level] = start + bytes;
  if (core->used[level] > core->stat[POLYC_NPU__HIGH_WATER + level])
    core->stat[POLYC_NPU__HIGH_WATER + level] = core->used[level];
  memset(p, 0xff, bytes);
  return p;
}

/* The buffer of this core that ptr points into, or NULL. */
static inline polyc_npu_buffer *polyc_npu__find(polyc_npu_core *core, const void *ptr)
{
  uintptr_t p = (uintptr_t)ptr;
  for (int l = 0; l < POLYC_NPU_LEVELS; l++) {
    uintptr_t base = (uintptr_t)core->arena[l];
    if (p < base || p - base >= polyc_npu__capacity(l))
      continue;
    size_t lo = 0, hi = core->nbuffers[l];  /* the last buffer starting at or before p */
    while (lo < hi) {
      size_t mid = (lo + hi) / 2;
      if ((uintptr_t)core->buffers[l][mid].base <= p)
        lo = mid + 1;
      else
        hi = mid;
    }
    polyc_npu_buffer *b = lo ? &core->buffers[l][lo - 1] : NULL;
    return b && p - (uintptr_t)b->base < b->bytes ? b : NULL;
  }
  for (size_t i = 0; i < core->nscratch; i++) {
    polyc_npu_buffer *b = &core->scratch[i];
    if (p >= (uintptr_t)b->base && p - (uintptr_t)b->base < b->bytes)
      return b;
  }
  return NULL;
}

/* The buffer holding the `extent` bytes at ptr, of one of the levels in the mask `levels`,
   ptr aligned to its level if `fractal`; or NULL with the error recorded. dir is "into"
   or "from"; an extent of 0 asks only that ptr be inside a buffer. */
static inline polyc_npu_buffer *polyc_npu__operand(polyc_npu_core *core, const char *op,
                                                   const char *dir, const void *ptr,
                                                   size_t extent, unsigned levels, int fractal)
{
  polyc_npu_buffer *b = polyc_npu__find(core, ptr);
  if (!b) {
    if (extent)
      polyc_sim_fail(&core->error, "kernel %s: %s %s %zu bytes at an address in no buffer of "
                     "this core", core->kernel, op, dir, extent);
    else
      polyc_sim_fail(&core->error, "kernel %s: %s %s an address in no buffer of this core",
                     core->kernel, op, dir);
    return NULL;
  }
  const char *level = polyc_npu__level_name(b->level);
  if (b->level < 0 || b->level >= POLYC_NPU_LEVELS || !(levels & (1u << b->level))) {
    char want[32] = "";
    for (int l = 0; l < POLYC_NPU_LEVELS; l++)
      if (levels & (1u << l)) {
        if (want[0])
          strcat(want, " or ");
        strcat(want, polyc_npu__level_name(l));
      }
    polyc_sim_fail(&core->error, "kernel %s: %s %s %s buffer %s: must be in %s", core->kernel, op,
                   dir, level, b->name, want);
    return NULL;
  }
  size_t offset = (size_t)((const char *)ptr - b->base);
  size_t align = polyc_npu__alignment(b->level);
  if (fractal && (uintptr_t)ptr % align) {
    polyc_sim_fail(&core->error, "kernel %s: %s %s %s buffer %s: offset %zu is not %zu-byte aligned",
                   core->kernel, op, dir, level, b->name, offset, align);
    return NULL;
  }
  if (extent > b->bytes - offset) {
    polyc_sim_fail(&core->error, "kernel %s: %s %s %s buffer %s: %zu bytes from offset %zu exceed "
                   "its %zu", core->kernel, op, dir, level, b->name, extent, offset, b->bytes);
    return NULL;
  }
  return b;
}

/* --- AI core: the scoreboard -------------------------------------------------------- */

/* Takes `cycles` of the GM channel from `start` on, in its free spans first come first
   served, and returns when the last of them ends. MTE2 and MTE3 share the channel's
   bandwidth but not an order: a transfer fills the gaps the ones issued before it left
   (a put waiting for the vector unit does not hold back the gets issued after it, and a
   long get does not wait for a gap as long as itself). */
static inline unsigned long long polyc_npu__channel(polyc_npu_core *core, unsigned long long start,
                                                    unsigned long long cycles)
{
  size_t lo = 0, hi = core->nbusy;  /* the first span ending after start */
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (core->busy[mid].hi <= start)
      lo = mid + 1;
    else
      hi = mid;
  }
  size_t i = lo;
  unsigned long long t = start;
  while (cycles) {
    if (i < core->nbusy && core->busy[i].lo <= t) {  /* inside span i: skip it */
      t = core->busy[i].hi;
      i++;
      continue;
    }
    unsigned long long room = i < core->nbusy ? core->busy[i].lo - t : cycles;
    unsigned long long take = room < cycles ? room : cycles;
    /* [t, t + take) goes before span i, touching span i - 1 or i or neither */
    int left = i > 0 && core->busy[i - 1].hi == t;
    int right = i < core->nbusy && core->busy[i].lo == t + take;
    if (left && right) {
      core->busy[i - 1].hi = core->busy[i].hi;
      memmove(&core->busy[i], &core->busy[i + 1], (core->nbusy - i - 1) * sizeof *core->busy);
      core->nbusy--;
      i--;
    } else if (left) {
      core->busy[i - 1].hi = t + take;
      i--;
    } else if (right) {
      core->busy[i].lo = t;
    } else {
      if (core->nbusy == core->cap_busy) {
        size_t cap = core->cap_busy ? 2 * core->cap_busy : 64;
        void *grown = realloc(core->busy, cap * sizeof *core->busy);
        if (!grown) {
          polyc_sim_fail(&core->error, "kernel %s: the simulator is out of host memory", core->kernel);
          return t + cycles;
        }
        core->busy = grown;
        core->cap_busy = cap;
      }
      memmove(&core->busy[i + 1], &core->busy[i], (core->nbusy - i) * sizeof *core->busy);
      core->busy[i].lo = t;
      core->busy[i].hi = t + take;
      core->nbusy++;
    }
    t += take;
    cycles -= take;
  }
  return t;
}

/* Times one operation of `cycles` on `pipe` (through the GM channel if gm) that reads and
   writes the given records. */
static inline void polyc_npu__issue(polyc_npu_core *core, int pipe, int gm, unsigned long long cycles,
                                    polyc_npu_record *const *reads, int n_reads,
                                    polyc_npu_record *const *writes, int n_writes)
{
  unsigned long long start = core->pipe[pipe];
  for (int i = 0; i < n_reads; i++)
    if (reads[i]->ready > start)
      start = reads[i]->ready;
  for (int i = 0; i < n_writes; i++) {
    /* the only GM writer is MTE3, whose writes land in issue order: a put need not wait
       for the previous put's data to land (that would put every tile's output behind
       the latency); a buffer has writers on several pipes */
    if (pipe != POLYC_NPU__MTE3 && writes[i]->ready > start)
      start = writes[i]->ready;
    if (writes[i]->free > start)
      start = writes[i]->free;
  }
  unsigned long long end = gm ? polyc_npu__channel(core, start, cycles) : start + cycles;
  unsigned long long ready = end + (gm ? POLYC_NPU_GM_LATENCY : 0);
  core->pipe[pipe] = end;
  core->stat[POLYC_NPU__BUSY + pipe] += cycles;  /* its work, not its waits for the channel */
  if (gm)
    core->stat[POLYC_NPU__CHANNEL] += cycles;
  for (int i = 0; i < n_writes; i++)
    writes[i]->ready = ready;
  for (int i = 0; i < n_reads; i++)
    if (reads[i]->free < end)
      reads[i]->free = end;
  if (ready > core->horizon)
    core->horizon = ready;
}

/* ceil(bytes * P / 64) without overflowing bytes * P */
static inline unsigned long long polyc_npu__gm_cycles(const polyc_npu_core *core, unsigned long long bytes)
{
  const unsigned long long rate = POLYC_NPU_GM_BYTES_PER_CYCLE, p = (unsigned long long)core->count;
  return bytes / rate * p + (bytes % rate * p + rate - 1) / rate;
}

static inline int polyc_npu__negative(polyc_npu_core *core, const char *op, const char *what, long v)
{
  if (v >= 0)
    return 0;
  polyc_sim_fail(&core->error, "kernel %s: %s: %s %ld is negative", core->kernel, op, what, v);
  return 1;
}

static inline int polyc_npu__elem_bytes(polyc_npu_core *core, const char *op, int elem_bytes)
{
  if (elem_bytes == 2 || elem_bytes == 4)
    return 1;
  polyc_sim_fail(&core->error, "kernel %s: %s: elem_bytes %d is neither 2 nor 4", core->kernel, op,
                 elem_bytes);
  return 0;
}

static inline int polyc_npu__dtype(polyc_npu_core *core, const char *op, const char *what, int dtype)
{
  if (dtype == POLYC_NPU_F16 || dtype == POLYC_NPU_F32)
    return 1;
  polyc_sim_fail(&core->error, "kernel %s: %s: %s %d is neither POLYC_NPU_F16 nor POLYC_NPU_F32",
                 core->kernel, op, what, dtype);
  return 0;
}

/* The record of h's region for this core, or NULL with the error recorded. */
static inline polyc_npu_record *polyc_npu__gm(polyc_npu_core *core, const char *op, const char *dir,
                                              polyc_gm h, const polyc_sim_region **region)
{
  long index = polyc_sim_region_index(&core->run->regions, h.id);
  if (index < 0 || (size_t)index >= core->ngm) {
    polyc_sim_fail(&core->error, "kernel %s: %s %s handle %#llx: not a GM region of this run",
                   core->kernel, op, dir, h.id);
    return NULL;
  }
  *region = &core->run->regions.items[index];
  return &core->gm[index];
}

/* Whether the box of `rows` runs of `run` bytes, `stride` apart from `offset`, lies in the
   region; else the error is recorded. */
static inline int polyc_npu__gm_box(polyc_npu_core *core, const char *op, const char *dir,
                                    const polyc_sim_region *r, size_t offset, long rows,
                                    size_t run, size_t stride)
{
  size_t end = polyc_sim_add(polyc_sim_add(offset, polyc_sim_mul((size_t)rows - 1, stride)), run);
  if (end <= r->bytes)
    return 1;
  polyc_sim_fail(&core->error, "kernel %s: %s %s region %s: box of %ld rows x %zu bytes (stride %zu) "
                 "at byte %zu reaches byte %zu, past its %zu bytes", core->kernel, op, dir,
                 r->name, rows, run, stride, offset, end, r->bytes);
  return 0;
}

/* --- AI core: copies ---------------------------------------------------------------- */

static inline void polyc_npu_copy_in(polyc_npu_core *core, void *dst, polyc_gm src, size_t offset,
                                     long rows, size_t run_bytes, size_t gm_stride, size_t dst_stride)
{
  const char *op = "copy_in";
  const polyc_sim_region *r;
  polyc_npu_record *from = polyc_npu__gm(core, op, "from", src, &r);
  if (!from || polyc_npu__negative(core, op, "rows", rows))
    return;
  if (rows == 0 || run_bytes == 0)
    return;
  if (!polyc_npu__gm_box(core, op, "from", r, offset, rows, run_bytes, gm_stride))
    return;
  size_t extent = polyc_sim_add(polyc_sim_mul((size_t)rows - 1, dst_stride), run_bytes);
  polyc_npu_buffer *b = polyc_npu__operand(core, op, "into", dst, extent,
                                           1u << POLYC_L1 | 1u << POLYC_UB, 0);
  if (!b)
    return;
  for (long i = 0; i < rows; i++)
    memmove((char *)dst + i * dst_stride, r->base + offset + i * gm_stride, run_bytes);
  unsigned long long bytes = (unsigned long long)rows * run_bytes;
  core->stat[b->level == POLYC_L1 ? POLYC_NPU__GM_L1 : POLYC_NPU__GM_UB] += bytes;
  core->stat[POLYC_NPU__TRANSFERS]++;
  polyc_npu_record *w = &b->record;
  polyc_npu__issue(core, POLYC_NPU__MTE2, 1, polyc_npu__gm_cycles(core, bytes), &from, 1, &w, 1);
}

static inline void polyc_npu_copy_out(polyc_npu_core *core, polyc_gm dst, size_t offset, const void *src,
                                      long rows, size_t run_bytes, size_t gm_stride, size_t src_stride)
{
  const char *op = "copy_out";
  const polyc_sim_region *r;
  polyc_npu_record *to = polyc_npu__gm(core, op, "into", dst, &r);
  if (!to || polyc_npu__negative(core, op, "rows", rows))
    return;
  if (rows == 0 || run_bytes == 0)
    return;
  if (!polyc_npu__gm_box(core, op, "into", r, offset, rows, run_bytes, gm_stride))
    return;
  size_t extent = polyc_sim_add(polyc_sim_mul((size_t)rows - 1, src_stride), run_bytes);
  polyc_npu_buffer *b = polyc_npu__operand(core, op, "from", src, extent, 1u << POLYC_UB, 0);
  if (!b)
    return;
  for (long i = 0; i < rows; i++)
    memmove(r->base + offset + i * gm_stride, (const char *)src + i * src_stride, run_bytes);
  unsigned long long bytes = (unsigned long long)rows * run_bytes;
  core->stat[POLYC_NPU__UB_GM] += bytes;
  core->stat[POLYC_NPU__TRANSFERS]++;
  polyc_npu_record *rd = &b->record;
  polyc_npu__issue(core, POLYC_NPU__MTE3, 1, polyc_npu__gm_cycles(core, bytes), &rd, 1, &to, 1);
}

static inline void polyc_npu_copy_in_nz(polyc_npu_core *core, void *dst, polyc_gm src, size_t offset,
                                        long rows, long cols, int elem_bytes, size_t gm_row_stride,
                                        long grid_rows, long grid_cols)
{
  const char *op = "copy_in_nz";
  const polyc_sim_region *r;
  polyc_npu_record *from = polyc_npu__gm(core, op, "from", src, &r);
  if (!from || !polyc_npu__elem_bytes(core, op, elem_bytes) ||
      polyc_npu__negative(core, op, "rows", rows) || polyc_npu__negative(core, op, "cols", cols) ||
      polyc_npu__negative(core, op, "grid_rows", grid_rows) ||
      polyc_npu__negative(core, op, "grid_cols", grid_cols))
    return;
  if (rows == 0 || cols == 0)
    return;
  if (rows > grid_rows * 16 || cols > grid_cols * 16) {
    polyc_sim_fail(&core->error, "kernel %s: %s: %ld rows x %ld cols do not fit a grid of %ld x %ld "
                   "blocks", core->kernel, op, rows, cols, grid_rows, grid_cols);
    return;
  }
  size_t eb = (size_t)elem_bytes, run = (size_t)cols * eb;
  if (!polyc_npu__gm_box(core, op, "from", r, offset, rows, run, gm_row_stride))
    return;
  size_t block = 256 * eb;
  size_t extent = polyc_sim_mul(polyc_sim_mul((size_t)grid_rows, (size_t)grid_cols), block);
  polyc_npu_buffer *b = polyc_npu__operand(core, op, "into", dst, extent, 1u << POLYC_L1, 1);
  if (!b)
    return;
  char *d = dst;
  memset(d, 0, extent);
  for (long i = 0; i < rows; i++) {
    const char *row = r->base + offset + (size_t)i * gm_row_stride;
    char *block_row = d + ((size_t)(i / 16) * (size_t)grid_cols * 256 + (size_t)(i % 16) * 16) * eb;
    for (long c0 = 0; c0 < cols; c0 += 16) {
      size_t n = (size_t)(cols - c0 < 16 ? cols - c0 : 16);
      memcpy(block_row + (size_t)(c0 / 16) * block, row + (size_t)c0 * eb, n * eb);
    }
  }
  unsigned long long bytes = (unsigned long long)rows * run;
  core->stat[POLYC_NPU__GM_L1] += bytes;
  core->stat[POLYC_NPU__TRANSFERS]++;
  polyc_npu_record *w = &b->record;
  polyc_npu__issue(core, POLYC_NPU__MTE2, 1, polyc_npu__gm_cycles(core, bytes), &from, 1, &w, 1);
}

static inline void polyc_npu_load_l0(polyc_npu_core *core, void *dst, const void *src, long src_grid_cols,
                                     long row0, long col0, long grid_rows, long grid_cols, int elem_bytes)
{
  const char *op = "load_l0";
  if (!polyc_npu__elem_bytes(core, op, elem_bytes) ||
      polyc_npu__negative(core, op, "src_grid_cols", src_grid_cols) ||
      polyc_npu__negative(core, op, "row0", row0) || polyc_npu__negative(core, op, "col0", col0) ||
      polyc_npu__negative(core, op, "grid_rows", grid_rows) ||
      polyc_npu__negative(core, op, "grid_cols", grid_cols))
    return;
  if (grid_rows == 0 || grid_cols == 0)
    return;
  if (col0 + grid_cols > src_grid_cols) {
    polyc_sim_fail(&core->error, "kernel %s: %s: block columns %ld..%ld are outside a grid %ld "
                   "blocks wide", core->kernel, op, col0, col0 + grid_cols - 1, src_grid_cols);
    return;
  }
  size_t block = 256 * (size_t)elem_bytes, sgc = (size_t)src_grid_cols;
  size_t src_blocks = polyc_sim_add(polyc_sim_mul((size_t)(row0 + grid_rows - 1), sgc),
                                     (size_t)(col0 + grid_cols));
  polyc_npu_buffer *s = polyc_npu__operand(core, op, "from", src, polyc_sim_mul(src_blocks, block),
                                           1u << POLYC_L1, 1);
  if (!s)
    return;
  size_t bytes = polyc_sim_mul(polyc_sim_mul((size_t)grid_rows, (size_t)grid_cols), block);
  polyc_npu_buffer *d = polyc_npu__operand(core, op, "into", dst, bytes,
                                           1u << POLYC_L0A | 1u << POLYC_L0B, 1);
  if (!d)
    return;
  for (long br = 0; br < grid_rows; br++)
    memcpy((char *)dst + (size_t)br * (size_t)grid_cols * block,
           (const char *)src + ((size_t)(row0 + br) * sgc + (size_t)col0) * block,
           (size_t)grid_cols * block);
  core->stat[d->level == POLYC_L0A ? POLYC_NPU__L1_L0A : POLYC_NPU__L1_L0B] += bytes;
  const unsigned long long rate = POLYC_NPU_MTE1_BYTES_PER_CYCLE;
  polyc_npu_record *rd = &s->record, *w = &d->record;
  polyc_npu__issue(core, POLYC_NPU__MTE1, 0, (bytes + rate - 1) / rate, &rd, 1, &w, 1);
}

/* --- AI core: the cube and the fixpipe ------------------------------------------------ */

static inline void polyc_npu__to_float(float *out, const void *block, int dtype)
{
  if (dtype == POLYC_NPU_F16) {
    const _Float16 *h = block;
    for (int i = 0; i < 256; i++)
      out[i] = (float)h[i];
  } else {
    memcpy(out, block, 256 * sizeof(float));
  }
}

static inline void polyc_npu_mma(polyc_npu_core *core, void *l0c, const void *l0a, const void *l0b,
                                 long m, long n, long k, int dtype, int accumulate)
{
  const char *op = "mma";
  if (!polyc_npu__dtype(core, op, "dtype", dtype) || polyc_npu__negative(core, op, "m", m) ||
      polyc_npu__negative(core, op, "n", n) || polyc_npu__negative(core, op, "k", k))
    return;
  if (accumulate != 0 && accumulate != 1) {
    polyc_sim_fail(&core->error, "kernel %s: %s: accumulate %d is neither 0 nor 1", core->kernel, op,
                   accumulate);
    return;
  }
  if (m == 0 || n == 0 || k == 0)
    return;
  size_t block = dtype == POLYC_NPU_F16 ? 512 : 1024, um = (size_t)m, un = (size_t)n, uk = (size_t)k;
  polyc_npu_buffer *c = polyc_npu__operand(core, op, "into", l0c, polyc_sim_mul(polyc_sim_mul(um, un), 1024),
                                           1u << POLYC_L0C, 1);
  if (!c)
    return;
  polyc_npu_buffer *a = polyc_npu__operand(core, op, "from", l0a, polyc_sim_mul(polyc_sim_mul(um, uk), block),
                                           1u << POLYC_L0A, 1);
  if (!a)
    return;
  polyc_npu_buffer *b = polyc_npu__operand(core, op, "from", l0b, polyc_sim_mul(polyc_sim_mul(uk, un), block),
                                           1u << POLYC_L0B, 1);
  if (!b)
    return;
  float *out = l0c, acc[256], fa[256], fb[256];
  for (size_t mb = 0; mb < um; mb++)
    for (size_t nb = 0; nb < un; nb++) {
      float *cb = out + (mb * un + nb) * 256;
      if (accumulate)
        memcpy(acc, cb, sizeof acc);
      else
        memset(acc, 0, sizeof acc);
      for (size_t kb = 0; kb < uk; kb++) {
        polyc_npu__to_float(fa, (const char *)l0a + (mb * uk + kb) * block, dtype);
        polyc_npu__to_float(fb, (const char *)l0b + (kb * un + nb) * block, dtype);
        for (int i = 0; i < 16; i++)
          for (int l = 0; l < 16; l++) {
            float x = fa[i * 16 + l];
            for (int j = 0; j < 16; j++)
              acc[i * 16 + j] += x * fb[l * 16 + j];
          }
      }
      memcpy(cb, acc, sizeof acc);
    }
  unsigned long long blocks = (unsigned long long)m * (unsigned long long)n * (unsigned long long)k;
  core->stat[POLYC_NPU__FLOPS] += POLYC_NPU_BLOCK_FLOPS * blocks;
  core->stat[dtype == POLYC_NPU_F16 ? POLYC_NPU__CUBE_F16 : POLYC_NPU__CUBE_F32] +=
      POLYC_NPU_BLOCK_FLOPS * blocks;
  polyc_npu_record *reads[2] = {&a->record, &b->record}, *w = &c->record;
  polyc_npu__issue(core, POLYC_NPU__M, 0, dtype == POLYC_NPU_F16 ? blocks : 4 * blocks, reads, 2,
                   &w, 1);
}

static inline void polyc_npu_l0c_to_ub(polyc_npu_core *core, void *dst, const void *src,
                                       long src_grid_cols, long rows, long cols, size_t dst_stride,
                                       int out_dtype)
{
  const char *op = "l0c_to_ub";
  if (!polyc_npu__dtype(core, op, "out_dtype", out_dtype) ||
      polyc_npu__negative(core, op, "src_grid_cols", src_grid_cols) ||
      polyc_npu__negative(core, op, "rows", rows) || polyc_npu__negative(core, op, "cols", cols))
    return;
  if (rows == 0 || cols == 0)
    return;
  if (cols > src_grid_cols * 16) {
    polyc_sim_fail(&core->error, "kernel %s: %s: %ld cols do not fit a grid %ld blocks wide",
                   core->kernel, op, cols, src_grid_cols);
    return;
  }
  if (rows > 1 && dst_stride < (size_t)cols) {
    polyc_sim_fail(&core->error, "kernel %s: %s: rows of %ld elements %zu elements apart overlap",
                   core->kernel, op, cols, dst_stride);
    return;
  }
  size_t sgc = (size_t)src_grid_cols, oeb = out_dtype == POLYC_NPU_F16 ? 2 : 4;
  size_t src_blocks = (size_t)(rows - 1) / 16 * sgc + (size_t)(cols - 1) / 16 + 1;
  polyc_npu_buffer *s = polyc_npu__operand(core, op, "from", src, polyc_sim_mul(src_blocks, 1024),
                                           1u << POLYC_L0C, 1);
  if (!s)
    return;
  size_t extent = polyc_sim_mul(polyc_sim_add(polyc_sim_mul((size_t)rows - 1, dst_stride),
                                                (size_t)cols), oeb);
  polyc_npu_buffer *d = polyc_npu__operand(core, op, "into", dst, extent, 1u << POLYC_UB, 0);
  if (!d)
    return;
  const float *in = src;
  char *out = dst;
  for (long r = 0; r < rows; r++)
    for (long c = 0; c < cols; c++) {
      float v = in[((size_t)(r / 16) * sgc + (size_t)(c / 16)) * 256 + (size_t)(r % 16) * 16 +
                   (size_t)(c % 16)];
      char *at = out + ((size_t)r * dst_stride + (size_t)c) * oeb;
      if (out_dtype == POLYC_NPU_F16) {
        _Float16 h = (_Float16)v;
        memcpy(at, &h, sizeof h);  /* a UB address need not be aligned to the element */
      } else {
        memcpy(at, &v, sizeof v);
      }
    }
  unsigned long long bytes = (unsigned long long)rows * (unsigned long long)cols * 4;
  core->stat[POLYC_NPU__L0C_UB] += bytes;
  const unsigned long long rate = POLYC_NPU_FIX_BYTES_PER_CYCLE;
  polyc_npu_record *rd = &s->record, *w = &d->record;
  polyc_npu__issue(core, POLYC_NPU__FIX, 0, (bytes + rate - 1) / rate, &rd, 1, &w, 1);
}

/* --- AI core: declared compute ------------------------------------------------------ */

/* Times `cycles` on V after resolving every pointer to its buffer's record. */
static inline void polyc_npu__compute(polyc_npu_core *core, const char *op, unsigned long long cycles,
                                      const void *const *reads, int n_reads, void *const *writes,
                                      int n_writes)
{
  if (polyc_npu__negative(core, op, "n_reads", n_reads) ||
      polyc_npu__negative(core, op, "n_writes", n_writes))
    return;
  if ((n_reads && !reads) || (n_writes && !writes)) {
    polyc_sim_fail(&core->error, "kernel %s: %s: NULL array of %d pointers", core->kernel, op,
                   n_reads && !reads ? n_reads : n_writes);
    return;
  }
  if (cycles == 0)
    return;
  polyc_npu_record *stack[16], **records = stack;
  size_t n = (size_t)n_reads + (size_t)n_writes;
  if (n > sizeof stack / sizeof *stack && !(records = malloc(n * sizeof *records))) {
    polyc_sim_fail(&core->error, "kernel %s: %s: out of host memory for %zu dependences",
                   core->kernel, op, n);
    return;
  }
  const unsigned all = (1u << POLYC_NPU_LEVELS) - 1;
  for (size_t i = 0; i < n; i++) {
    int read = i < (size_t)n_reads;
    polyc_npu_buffer *b = polyc_npu__operand(core, op, read ? "from" : "into",
                                             read ? reads[i] : writes[i - (size_t)n_reads], 0, all, 0);
    if (!b)
      goto out;
    records[i] = &b->record;
  }
  polyc_npu__issue(core, POLYC_NPU__V, 0, cycles, records, n_reads, records + n_reads, n_writes);
out:
  if (records != stack)
    free(records);
}

static inline void polyc_npu_vector(polyc_npu_core *core, unsigned long long elements,
                                    unsigned long long ops, const void *const *reads, int n_reads,
                                    void *const *writes, int n_writes)
{
  unsigned long long steps = (elements + POLYC_NPU_LANES - 1) / POLYC_NPU_LANES;
  polyc_npu__compute(core, "vector", ops * steps, reads, n_reads, writes, n_writes);
}

static inline void polyc_npu_scalar(polyc_npu_core *core, unsigned long long ops,
                                    const void *const *reads, int n_reads, void *const *writes,
                                    int n_writes)
{
  polyc_npu__compute(core, "scalar", ops, reads, n_reads, writes, n_writes);
}

static inline void polyc_npu_flops(polyc_npu_core *core, unsigned long long flops)
{
  core->stat[POLYC_NPU__FLOPS] += flops;
}

/* --- the run's record ------------------------------------------------------------ */

static inline const char *polyc_npu_run_error(const polyc_npu_run *run)
{
  return run->error.failed ? run->error.text : NULL;
}

static inline void polyc_npu_run_stats(const polyc_npu_run *run, unsigned long long out[32])
{
  memcpy(out, run->stat, sizeof run->stat);
}

/* The header's functions are static, so a shared object loaded by ctypes exports these. */
#define POLYC_NPU_EXPORTS                                                                            \
  __attribute__((visibility("default"))) polyc_npu_run *polyc_npu_run_new_x(void)                   \
  {                                                                                                 \
    return polyc_npu_run_new();                                                                     \
  }                                                                                                 \
  __attribute__((visibility("default"))) void polyc_npu_run_free_x(polyc_npu_run *run)              \
  {                                                                                                 \
    polyc_npu_run_free(run);                                                                        \
  }                                                                                                 \
  __attribute__((visibility("default"))) const char *polyc_npu_run_error_x(const polyc_npu_run *run) \
  {                                                                                                 \
    return polyc_npu_run_error(run);                                                                \
  }                                                                                                 \
  __attribute__((visibility("default"))) void polyc_npu_run_stats_x(const polyc_npu_run *run,       \
                                                                    unsigned long long *out)        \
  {                                                                                                 \
    polyc_npu_run_stats(run, out);                                                                  \
  }

#endif /* POLYC_NPU_H */
