/* polyc simulator base: what the runtime headers of the simulated chips share
 * (targets/manycore/runtime/polyc_manycore.h, targets/npu/runtime/polyc_npu.h).
 *
 *   polyc_sim_error      a first error and its text: the first error is the cause, later
 *                        ones are mostly its echoes
 *   polyc_sim_fail       records into one, printf-style
 *   polyc_sim_grow       room for one more item in a doubling array
 *   polyc_sim_mul/_add   saturating size arithmetic
 *   polyc_sim_regions    the run's table of main-memory regions behind opaque handles:
 *                        an id's high half is the run's tag (a handle of another run is
 *                        refused), its low half the region's index + 1 (0 is no region)
 *   polyc_sim_run_cores  a launch's cores, one thread each, started and joined
 *
 * Every function is `static inline` for the same reason as in the chips' headers: each
 * generated translation unit carries its own copy.
 */
#ifndef POLYC_SIM_H
#define POLYC_SIM_H

#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct {
  int failed;
  char text[512];
} polyc_sim_error;

static inline void polyc_sim_record(polyc_sim_error *error, const char *fmt, va_list ap)
{
  if (error->failed)
    return;
  vsnprintf(error->text, sizeof error->text, fmt, ap);
  error->failed = 1;
}

static inline __attribute__((format(printf, 2, 3))) void polyc_sim_fail(polyc_sim_error *error,
                                                                        const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  polyc_sim_record(error, fmt, ap);
  va_end(ap);
}

/* Room for one more of n items of `size` bytes: the array, moved if it had to grow, or
   NULL (the old array untouched) when the host is out of memory. */
static inline void *polyc_sim_grow(void *items, size_t *cap, size_t n, size_t size)
{
  if (n < *cap)
    return items;
  size_t want = *cap ? 2 * *cap : 8;
  void *p = realloc(items, want * size);
  if (p)
    *cap = want;
  return p;
}

/* Saturating size arithmetic: an overflowing extent becomes SIZE_MAX, which no buffer or
   region holds, so the bounds checks refuse it without a case of their own. */
static inline size_t polyc_sim_mul(size_t a, size_t b)
{
  size_t r;
  return __builtin_mul_overflow(a, b, &r) ? SIZE_MAX : r;
}

static inline size_t polyc_sim_add(size_t a, size_t b)
{
  size_t r;
  return __builtin_add_overflow(a, b, &r) ? SIZE_MAX : r;
}

typedef struct {
  char *base;
  size_t bytes;
  const char *name;
  int owned;  /* allocated by the run: freed with it */
} polyc_sim_region;

typedef struct {
  unsigned tag;
  polyc_sim_region *items;
  size_t n, cap;
} polyc_sim_regions;

/* A tag for a new run at `self`: the address tells translation units apart (each has
   its own serial), the serial tells apart runs at a reused address. */
static inline void polyc_sim_regions_init(polyc_sim_regions *table, const void *self)
{
  static unsigned serial;
  table->tag = (unsigned)(((uintptr_t)self >> 4) * 2654435761u) ^
               __atomic_add_fetch(&serial, 1, __ATOMIC_RELAXED);
  if (table->tag == 0)
    table->tag = 1;
}

static inline void polyc_sim_regions_free(polyc_sim_regions *table)
{
  for (size_t i = 0; i < table->n; i++)
    if (table->items[i].owned)
      free(table->items[i].base);
  free(table->items);
}

/* The handle id of a new region, or 0 (recorded in `error`) when the table cannot grow. */
static inline unsigned long long polyc_sim_region_add(polyc_sim_regions *table,
                                                      polyc_sim_error *error, void *ptr,
                                                      size_t bytes, const char *name, int owned)
{
  polyc_sim_region *items = polyc_sim_grow(table->items, &table->cap, table->n, sizeof *items);
  if (!items) {
    polyc_sim_fail(error, "region %s: out of host memory for the region table", name);
    return 0;
  }
  table->items = items;
  table->items[table->n] = (polyc_sim_region){(char *)ptr, bytes, name, owned};
  return ((unsigned long long)table->tag << 32) | (unsigned long long)++table->n;
}

/* A region of `bytes` zeroed bytes the run owns: its handle id, or 0 (recorded). */
static inline unsigned long long polyc_sim_region_alloc(polyc_sim_regions *table,
                                                        polyc_sim_error *error, size_t bytes,
                                                        const char *name, const char *memory)
{
  void *p = calloc(bytes ? bytes : 1, 1);
  if (!p) {
    polyc_sim_fail(error, "region %s: cannot allocate %zu bytes of %s", name, bytes, memory);
    return 0;
  }
  unsigned long long id = polyc_sim_region_add(table, error, p, bytes, name, 1);
  if (!id)
    free(p);
  return id;
}

/* A wrapped region of the caller's memory: its handle id, or 0 (recorded). */
static inline unsigned long long polyc_sim_region_wrap(polyc_sim_regions *table,
                                                       polyc_sim_error *error, void *ptr,
                                                       size_t bytes, const char *name)
{
  if (!ptr && bytes) {
    polyc_sim_fail(error, "region %s: NULL pointer for %zu bytes", name, bytes);
    return 0;
  }
  return polyc_sim_region_add(table, error, ptr, bytes, name, 0);
}

/* The index of id's region in the table, or -1 if id is not one of this table's. */
static inline long polyc_sim_region_index(const polyc_sim_regions *table, unsigned long long id)
{
  unsigned long long index = id & 0xffffffffULL;
  if ((unsigned)(id >> 32) != table->tag || index == 0 || index > table->n)
    return -1;
  return (long)index - 1;
}

/* Run `cores` records of `size` bytes from `core`, each on its own thread through `main`,
   and join them all; `started[i]` tells which ran (a core whose thread cannot start is
   reported in `error`, naming it as `what`, and left out). The chip merges the records
   after: in core order, so the lowest failing core's error is the one kept. */
static inline void polyc_sim_run_cores(polyc_sim_error *error, const char *kernel,
                                       const char *what, void *core, size_t size, int cores,
                                       void *(*main)(void *), char *started)
{
  pthread_t *thread = calloc((size_t)cores, sizeof *thread);
  if (!thread) {
    polyc_sim_fail(error, "kernel %s: out of host memory for %d cores", kernel, cores);
    return;
  }
  for (int i = 0; i < cores; i++) {
    if (pthread_create(&thread[i], NULL, main, (char *)core + (size_t)i * size) != 0)
      polyc_sim_fail(error, "kernel %s: cannot start %s %d", kernel, what, i);
    else
      started[i] = 1;
  }
  for (int i = 0; i < cores; i++)
    if (started[i])
      pthread_join(thread[i], NULL);
  free(thread);
}

#endif
