/* polyc manycore runtime: a Sunway-like core group simulated on the host.
 *
 * The chip: one management core (MPE) and 64 compute cores (CPEs), each with a 256 KiB
 * local scratchpad (LDM). Compute-core code reaches main memory only by DMA. Here the
 * management core is the calling thread and a launch runs the compute cores as pthreads;
 * the data really moves (the host computes the results) while a cycle model times it.
 * One header, C11 + pthreads; every function is `static inline` so that each generated
 * translation unit carries its own copy and -Wall stays quiet about the unused ones.
 *
 * Management core
 *   polyc_mc_run *polyc_mc_run_new(void);             one call of a compiled graph, or NULL
 *   void polyc_mc_run_free(polyc_mc_run *run);        frees its scratch regions too
 *   polyc_mm polyc_mm_wrap(run, void *ptr, size_t bytes, const char *name);
 *   polyc_mm polyc_mm_alloc(run, size_t bytes, const char *name);   zeroed, freed with run
 *   void polyc_mc_launch(run, const char *kernel, int cores,
 *                        void (*body)(polyc_mc_core *, const void *args), const void *args);
 *       runs body on `cores` (1..64) threads with core ids 0..cores-1, each with a fresh
 *       LDM arena, joins them and adds the launch's cycles to the run.
 *   Names (kernel, region, buffer) are kept by pointer: pass string literals.
 *
 * Compute core
 *   int polyc_mc_id(core), polyc_mc_count(core)       this core, the cores of the launch
 *   void *polyc_ldm_alloc(core, const char *buffer, size_t bytes)
 *       64-byte aligned, from the core's 256 KiB LDM, never freed during the launch. Over
 *       capacity it records "kernel K: LDM buffer B of N bytes does not fit: U of 262144
 *       bytes in use" and returns a scratch block of N bytes outside the LDM instead.
 *   polyc_dma_get(core, void *ldm, polyc_mm src, offset, rows, run_bytes, mm_stride, ldm_stride)
 *   polyc_dma_put(core, polyc_mm dst, offset, const void *ldm, rows, run_bytes, mm_stride, ldm_stride)
 *       a box: `rows` runs of `run_bytes` bytes, `mm_stride` bytes apart in main memory
 *       from byte `offset` of the region and `ldm_stride` bytes apart in LDM; one
 *       transfer. Synchronous: the core's clock moves to the transfer's completion.
 *   polyc_dma_iget(..., polyc_reply *reply), polyc_dma_iput(..., polyc_reply *reply)
 *   polyc_dma_wait(core, polyc_reply *reply)         the reply is reusable afterwards
 *   polyc_mc_scalar(core, ops)                       ops cycles
 *   polyc_mc_vector(core, elements, ops)             ops * ceil(elements / 8) cycles
 *   polyc_mc_flops(core, flops)                      counted, not timed
 *   The fixed-shape 64x64x32 kernel is a microkernel of its own
 *   (polyc/microkernels/mc_sgemm_64x64x32.c) on this API: it checks its operands with
 *   polyc_mc__buffer and charges its cycles to the core.
 *
 * The run's record (management core, between launches)
 *   const char *polyc_mc_run_error(run)              the first error, or NULL
 *   void polyc_mc_run_stats(run, unsigned long long out[8])
 *       cycles, flops, bytes main->ldm, bytes ldm->main, transfers, LDM high-water mark
 *       (the most bytes one core had in use at once, alignment padding included),
 *       launches, 0
 *   POLYC_MC_EXPORTS (expand once per shared object) defines extern wrappers for ctypes:
 *       polyc_mc_run_new_x, polyc_mc_run_free_x, polyc_mc_run_error_x, polyc_mc_run_stats_x
 *
 * Cycle model (DESIGN.md, "Targets")
 *   - compute: 16 fp32 FLOP/cycle per core; the 64x64x32 kernel takes 16,384 cycles;
 *     a scalar op 1 cycle; a vector op over n elements ceil(n / 8) cycles.
 *   - DMA: 32 B/cycle shared by the P cores of a launch, each getting a fixed share of
 *     32 / P B/cycle, plus 500 cycles per transfer. Each core has one DMA engine: a
 *     transfer of b bytes issued at core time t starts at s = max(t, engine free),
 *     keeps the engine busy until s + ceil(b * P / 32) and its data is there 500 cycles
 *     later (the latency overlaps the next transfer). An asynchronous transfer overlaps
 *     compute; wait sets the clock to max(clock, completion of the reply's transfers).
 *   - a core ends its launch when its clock and its last transfer are both done (data
 *     put but never waited for still has to land); a launch takes its longest core, every
 *     core starting at 0; a run's cycles are the sum of its launches'; the management
 *     core costs nothing.
 *
 * Checks: every DMA is checked before anything moves: the handle must be one of this
 * run's, the main-memory box inside its region (offset + (rows - 1) * mm_stride +
 * run_bytes <= region bytes), the LDM box inside one buffer the core allocated. A
 * violation records an error naming the kernel, the region or buffer and the sizes and
 * skips the transfer. Only the first error of a run is kept: the management core's, or
 * of a launch the one its lowest-numbered failing core met first (deterministic, unlike
 * the threads' order). An empty box (rows or run_bytes 0) moves nothing and costs nothing.
 *
 * Not modelled: the data of an asynchronous get is there at issue (a read before the wait
 * is not caught); the fresh LDM is filled with 0xff bytes (NaN as fp32, -1 as int32) so
 * that a read before its DMA shows in the results instead of passing by luck.
 */
#ifndef POLYC_MANYCORE_H
#define POLYC_MANYCORE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../scratchpad/runtime/polyc_sim.h"

#define POLYC_MC_CORES 64
#define POLYC_MC_LDM_BYTES 262144
#define POLYC_MC_LDM_ALIGN 64
#define POLYC_MC_DMA_LATENCY 500ULL
#define POLYC_MC_DMA_BYTES_PER_CYCLE 32ULL
#define POLYC_MC_LANES 8ULL
#define POLYC_MC_SGEMM_CYCLES 16384ULL
#define POLYC_MC_SGEMM_FLOPS (2ULL * 64 * 64 * 32)

typedef struct polyc_mc_run polyc_mc_run;
typedef struct polyc_mc_core polyc_mc_core;
/* A struct, not a pointer, so that compute-core code cannot dereference main memory:
   gcc rejects `*h`, `h[0]` and `h + 1`. The id is a table index, not an address. */
typedef struct { unsigned long long id; } polyc_mm;
typedef struct { unsigned long long done; int pending; } polyc_reply;  /* zero-initialise */

typedef struct {
  char *base;
  size_t bytes;
  const char *name;
} polyc_mc_buffer;

/* A core records its own first error and the join keeps the lowest core's: no lock, and
   the same message on every run however the threads were scheduled. */
struct polyc_mc_run {
  polyc_sim_error error;
  polyc_sim_regions regions;
  char *ldm[POLYC_MC_CORES];  /* arenas kept across launches: no 16 MiB of mmap per launch */
  unsigned long long cycles, flops, bytes_in, bytes_out, transfers, high_water, launches;
};

struct polyc_mc_core {
  polyc_mc_run *run;
  const char *kernel;
  int id, count;
  void (*body)(polyc_mc_core *, const void *);
  const void *args;
  char *ldm;
  size_t ldm_used;
  polyc_mc_buffer *buffers;  /* bump-allocated, so sorted by address */
  size_t nbuffers, cap_buffers;
  polyc_mc_buffer *scratch;  /* over-capacity blocks, outside the LDM */
  size_t nscratch, cap_scratch;
  unsigned long long clock, engine_free, last_done;
  polyc_sim_error error;
  /* per core, summed at the join: no atomics on the hot path */
  unsigned long long flops, bytes_in, bytes_out, transfers, high_water;
};

/* --- management core ------------------------------------------------------------- */

static inline polyc_mc_run *polyc_mc_run_new(void)
{
  polyc_mc_run *run = calloc(1, sizeof *run);
  if (run)
    polyc_sim_regions_init(&run->regions, run);
  return run;
}

static inline void polyc_mc_run_free(polyc_mc_run *run)
{
  if (!run)
    return;
  polyc_sim_regions_free(&run->regions);
  for (int i = 0; i < POLYC_MC_CORES; i++)
    free(run->ldm[i]);
  free(run);
}

static inline polyc_mm polyc_mm_wrap(polyc_mc_run *run, void *ptr, size_t bytes, const char *name)
{
  return (polyc_mm){polyc_sim_region_wrap(&run->regions, &run->error, ptr, bytes, name)};
}

static inline polyc_mm polyc_mm_alloc(polyc_mc_run *run, size_t bytes, const char *name)
{
  return (polyc_mm){polyc_sim_region_alloc(&run->regions, &run->error, bytes, name, "main memory")};
}

static inline const polyc_sim_region *polyc_mc__lookup(const polyc_mc_run *run, polyc_mm h)
{
  long index = polyc_sim_region_index(&run->regions, h.id);
  return index < 0 ? NULL : &run->regions.items[index];
}

/* The core a compute-core thread runs: a launch from inside a launch would need cores the
   chip does not have. */
static _Thread_local polyc_mc_core *polyc_mc__self;

static inline void *polyc_mc__core_main(void *arg)
{
  polyc_mc_core *core = arg;
  polyc_mc__self = core;
  core->body(core, core->args);
  return NULL;
}

static inline void polyc_mc_launch(polyc_mc_run *run, const char *kernel, int cores,
                                   void (*body)(polyc_mc_core *, const void *), const void *args)
{
  if (polyc_mc__self) {
    polyc_sim_fail(&polyc_mc__self->error, "kernel %s: core %d: launches kernel %s from a compute core",
                   polyc_mc__self->kernel, polyc_mc__self->id, kernel);
    return;
  }
  if (cores < 1 || cores > POLYC_MC_CORES) {
    polyc_sim_fail(&run->error, "kernel %s: launch of %d cores (the chip has 1..%d)", kernel, cores,
                   POLYC_MC_CORES);
    return;
  }
  polyc_mc_core *core = calloc((size_t)cores, sizeof *core);
  char *started = calloc((size_t)cores, 1);
  if (!core || !started) {
    polyc_sim_fail(&run->error, "kernel %s: out of host memory for %d cores", kernel, cores);
    goto out;
  }
  for (int i = 0; i < cores; i++) {
    if (!run->ldm[i] && !(run->ldm[i] = aligned_alloc(POLYC_MC_LDM_ALIGN, POLYC_MC_LDM_BYTES))) {
      polyc_sim_fail(&run->error, "kernel %s: out of host memory for the LDM of core %d", kernel, i);
      goto out;
    }
    core[i] = (polyc_mc_core){.run = run, .kernel = kernel, .id = i, .count = cores,
                              .body = body, .args = args, .ldm = run->ldm[i]};
  }
  polyc_sim_run_cores(&run->error, kernel, "compute core", core, sizeof *core, cores,
                      polyc_mc__core_main, started);
  unsigned long long longest = 0;
  for (int i = 0; i < cores; i++) {
    if (!started[i])
      continue;
    polyc_mc_core *c = &core[i];
    unsigned long long end = c->clock > c->last_done ? c->clock : c->last_done;
    if (end > longest)
      longest = end;
    if (c->error.failed && !run->error.failed)
      run->error = c->error;
    run->flops += c->flops;
    run->bytes_in += c->bytes_in;
    run->bytes_out += c->bytes_out;
    run->transfers += c->transfers;
    if (c->high_water > run->high_water)
      run->high_water = c->high_water;
  }
  run->cycles += longest;
  run->launches++;
out:
  if (core)
    for (int i = 0; i < cores; i++) {
      for (size_t j = 0; j < core[i].nscratch; j++)
        free(core[i].scratch[j].base);
      free(core[i].scratch);
      free(core[i].buffers);
    }
  free(core);
  free(started);
}

/* --- compute core ---------------------------------------------------------------- */

static inline int polyc_mc_id(const polyc_mc_core *core) { return core->id; }
static inline int polyc_mc_count(const polyc_mc_core *core) { return core->count; }

static inline void *polyc_mc__scratch_block(polyc_mc_core *core, const char *buffer, size_t bytes)
{
  /* aligned_alloc wants a nonzero multiple of the alignment */
  size_t rounded = (bytes + POLYC_MC_LDM_ALIGN) & ~(size_t)(POLYC_MC_LDM_ALIGN - 1);
  char *p = bytes <= SIZE_MAX - POLYC_MC_LDM_ALIGN ? aligned_alloc(POLYC_MC_LDM_ALIGN, rounded) : NULL;
  polyc_mc_buffer *scratch = p ? polyc_sim_grow(core->scratch, &core->cap_scratch, core->nscratch,
                                                 sizeof *scratch) : NULL;
  if (!scratch) {
    free(p);
    return NULL;  /* the error is recorded already; nothing better to hand back */
  }
  core->scratch = scratch;
  memset(p, 0xff, bytes);
  core->scratch[core->nscratch++] = (polyc_mc_buffer){p, bytes, buffer};
  return p;
}

static inline void *polyc_ldm_alloc(polyc_mc_core *core, const char *buffer, size_t bytes)
{
  size_t start = (core->ldm_used + POLYC_MC_LDM_ALIGN - 1) & ~(size_t)(POLYC_MC_LDM_ALIGN - 1);
  if (bytes > POLYC_MC_LDM_BYTES || start > POLYC_MC_LDM_BYTES - bytes) {
    polyc_sim_fail(&core->error, "kernel %s: LDM buffer %s of %zu bytes does not fit: "
                   "%zu of %d bytes in use",
                   core->kernel, buffer, bytes, core->ldm_used, POLYC_MC_LDM_BYTES);
    return polyc_mc__scratch_block(core, buffer, bytes);
  }
  polyc_mc_buffer *buffers = polyc_sim_grow(core->buffers, &core->cap_buffers, core->nbuffers,
                                             sizeof *buffers);
  if (!buffers) {
    polyc_sim_fail(&core->error, "kernel %s: LDM buffer %s: out of host memory for the buffer table",
                   core->kernel, buffer);
    return polyc_mc__scratch_block(core, buffer, bytes);
  }
  core->buffers = buffers;
  char *p = core->ldm + start;
  core->buffers[core->nbuffers++] = (polyc_mc_buffer){p, bytes, buffer};
  core->ldm_used = start + bytes;
  if (core->ldm_used > core->high_water)
    core->high_water = core->ldm_used;
  memset(p, 0xff, bytes);
  return p;
}

/* The buffer of this core that holds [p, p + extent), or NULL; *near is the one p is in,
   if any, for the message. */
static inline const polyc_mc_buffer *polyc_mc__buffer(const polyc_mc_core *core, const void *ptr,
                                                      size_t extent, const polyc_mc_buffer **near)
{
  const char *p = ptr;
  const polyc_mc_buffer *found = NULL;
  *near = NULL;
  if (p >= core->ldm && p < core->ldm + POLYC_MC_LDM_BYTES) {
    size_t lo = 0, hi = core->nbuffers;  /* the last buffer starting at or before p */
    while (lo < hi) {
      size_t mid = (lo + hi) / 2;
      if (core->buffers[mid].base <= p)
        lo = mid + 1;
      else
        hi = mid;
    }
    if (lo > 0)
      found = &core->buffers[lo - 1];
  } else {
    for (size_t i = 0; i < core->nscratch; i++)
      if (core->scratch[i].base <= p && p < core->scratch[i].base + core->scratch[i].bytes)
        found = &core->scratch[i];
  }
  if (!found || (size_t)(p - found->base) >= found->bytes)
    return NULL;
  *near = found;
  return extent <= found->bytes - (size_t)(p - found->base) ? found : NULL;
}

/* Charges one transfer of `bytes` to the core's DMA engine; returns its completion. */
static inline unsigned long long polyc_mc__transfer(polyc_mc_core *core, unsigned long long bytes)
{
  /* ceil(bytes * P / 32) without overflowing bytes * P */
  unsigned long long p = (unsigned long long)core->count;
  const unsigned long long rate = POLYC_MC_DMA_BYTES_PER_CYCLE;
  unsigned long long busy = bytes / rate * p + (bytes % rate * p + rate - 1) / rate;
  unsigned long long start = core->clock > core->engine_free ? core->clock : core->engine_free;
  unsigned long long done = start + busy + POLYC_MC_DMA_LATENCY;
  core->engine_free = start + busy;
  if (done > core->last_done)
    core->last_done = done;
  core->transfers++;
  return done;
}

/* Checks and moves one box; returns its completion, or 0 when nothing moved. */
static inline unsigned long long polyc_mc__dma(polyc_mc_core *core, int put, char *ldm, polyc_mm h,
                                               size_t offset, size_t rows, size_t run_bytes,
                                               size_t mm_stride, size_t ldm_stride)
{
  const char *op = put ? "dma_put" : "dma_get";
  const polyc_sim_region *r = polyc_mc__lookup(core->run, h);
  if (!r) {
    polyc_sim_fail(&core->error, "kernel %s: core %d: %s: handle %#llx is not a main-memory region "
                   "of this run", core->kernel, core->id, op, h.id);
    return 0;
  }
  if (rows == 0 || run_bytes == 0)
    return 0;
  size_t mm_end, ldm_end, bytes;
  int mm_over = __builtin_mul_overflow(rows - 1, mm_stride, &mm_end) ||
                __builtin_add_overflow(mm_end, run_bytes, &mm_end) ||
                __builtin_add_overflow(mm_end, offset, &mm_end);
  if (mm_over || mm_end > r->bytes) {
    polyc_sim_fail(&core->error, "kernel %s: core %d: %s: box of %zu rows x %zu bytes (stride %zu) "
                   "at byte %zu of region %s reaches byte %s%zu, past its %zu bytes",
                   core->kernel, core->id, op, rows, run_bytes, mm_stride, offset, r->name,
                   mm_over ? "beyond " : "", mm_over ? SIZE_MAX : mm_end, r->bytes);
    return 0;
  }
  const polyc_mc_buffer *near;
  int ldm_over = __builtin_mul_overflow(rows - 1, ldm_stride, &ldm_end) ||
                 __builtin_add_overflow(ldm_end, run_bytes, &ldm_end);
  if (!polyc_mc__buffer(core, ldm, ldm_over ? SIZE_MAX : ldm_end, &near)) {
    if (near) {
      size_t at = (size_t)(ldm - near->base);
      polyc_sim_fail(&core->error, "kernel %s: core %d: %s: box of %zu rows x %zu bytes (LDM stride %zu) "
                     "at byte %zu of LDM buffer %s reaches byte %s%zu, past its %zu bytes",
                     core->kernel, core->id, op, rows, run_bytes, ldm_stride, at, near->name,
                     ldm_over ? "beyond " : "", ldm_over ? SIZE_MAX : at + ldm_end, near->bytes);
    } else {
      polyc_sim_fail(&core->error, "kernel %s: core %d: %s: box of %zu rows x %zu bytes (LDM stride %zu) "
                     "for region %s: its LDM address is in no LDM buffer of this core",
                     core->kernel, core->id, op, rows, run_bytes, ldm_stride, r->name);
    }
    return 0;
  }
  if (__builtin_mul_overflow(rows, run_bytes, &bytes)) {
    polyc_sim_fail(&core->error, "kernel %s: core %d: %s: %zu rows x %zu bytes overflow",
                   core->kernel, core->id, op, rows, run_bytes);
    return 0;
  }
  char *mm = r->base + offset;
  for (size_t i = 0; i < rows; i++) {
    if (put)
      memmove(mm + i * mm_stride, ldm + i * ldm_stride, run_bytes);
    else
      memmove(ldm + i * ldm_stride, mm + i * mm_stride, run_bytes);
  }
  if (put)
    core->bytes_out += bytes;
  else
    core->bytes_in += bytes;
  return polyc_mc__transfer(core, bytes);
}

static inline void polyc_dma_get(polyc_mc_core *core, void *ldm, polyc_mm src, size_t offset,
                                 size_t rows, size_t run_bytes, size_t mm_stride, size_t ldm_stride)
{
  unsigned long long done = polyc_mc__dma(core, 0, ldm, src, offset, rows, run_bytes, mm_stride,
                                          ldm_stride);
  if (done > core->clock)
    core->clock = done;
}

static inline void polyc_dma_put(polyc_mc_core *core, polyc_mm dst, size_t offset, const void *ldm,
                                 size_t rows, size_t run_bytes, size_t mm_stride, size_t ldm_stride)
{
  unsigned long long done = polyc_mc__dma(core, 1, (char *)ldm, dst, offset, rows, run_bytes, mm_stride,
                                          ldm_stride);
  if (done > core->clock)
    core->clock = done;
}

static inline void polyc_dma_iget(polyc_mc_core *core, void *ldm, polyc_mm src, size_t offset,
                                  size_t rows, size_t run_bytes, size_t mm_stride, size_t ldm_stride,
                                  polyc_reply *reply)
{
  unsigned long long done = polyc_mc__dma(core, 0, ldm, src, offset, rows, run_bytes, mm_stride,
                                          ldm_stride);
  if (done > reply->done)
    reply->done = done;
  reply->pending++;
}

static inline void polyc_dma_iput(polyc_mc_core *core, polyc_mm dst, size_t offset, const void *ldm,
                                  size_t rows, size_t run_bytes, size_t mm_stride, size_t ldm_stride,
                                  polyc_reply *reply)
{
  unsigned long long done = polyc_mc__dma(core, 1, (char *)ldm, dst, offset, rows, run_bytes, mm_stride,
                                          ldm_stride);
  if (done > reply->done)
    reply->done = done;
  reply->pending++;
}

static inline void polyc_dma_wait(polyc_mc_core *core, polyc_reply *reply)
{
  if (reply->done > core->clock)
    core->clock = reply->done;
  reply->done = 0;
  reply->pending = 0;
}

static inline void polyc_mc_scalar(polyc_mc_core *core, unsigned long long ops) { core->clock += ops; }

static inline void polyc_mc_vector(polyc_mc_core *core, unsigned long long elements,
                                   unsigned long long ops)
{
  core->clock += ops * ((elements + POLYC_MC_LANES - 1) / POLYC_MC_LANES);
}

static inline void polyc_mc_flops(polyc_mc_core *core, unsigned long long flops)
{
  core->flops += flops;
}

/* --- the run's record ------------------------------------------------------------ */

static inline const char *polyc_mc_run_error(const polyc_mc_run *run)
{
  return run->error.failed ? run->error.text : NULL;
}

static inline void polyc_mc_run_stats(const polyc_mc_run *run, unsigned long long out[8])
{
  out[0] = run->cycles;
  out[1] = run->flops;
  out[2] = run->bytes_in;
  out[3] = run->bytes_out;
  out[4] = run->transfers;
  out[5] = run->high_water;
  out[6] = run->launches;
  out[7] = 0;
}

/* The header's functions are static, so a shared object loaded by ctypes exports these. */
#define POLYC_MC_EXPORTS                                                                             \
  __attribute__((visibility("default"))) polyc_mc_run *polyc_mc_run_new_x(void)                     \
  {                                                                                                 \
    return polyc_mc_run_new();                                                                      \
  }                                                                                                 \
  __attribute__((visibility("default"))) void polyc_mc_run_free_x(polyc_mc_run *run)                \
  {                                                                                                 \
    polyc_mc_run_free(run);                                                                         \
  }                                                                                                 \
  __attribute__((visibility("default"))) const char *polyc_mc_run_error_x(const polyc_mc_run *run)  \
  {                                                                                                 \
    return polyc_mc_run_error(run);                                                                 \
  }                                                                                                 \
  __attribute__((visibility("default"))) void polyc_mc_run_stats_x(const polyc_mc_run *run,         \
                                                                   unsigned long long *out)         \
  {                                                                                                 \
    polyc_mc_run_stats(run, out);                                                                   \
  }

#endif /* POLYC_MANYCORE_H */
