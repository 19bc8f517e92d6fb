/* polyc microkernel support: the scratch buffers packed panels live in.
 *
 * Contract:
 *   polyc_scratch(slot, bytes) returns a 64-byte aligned buffer of at least `bytes`
 *   bytes, private to the calling thread and kept across calls (grown, never shrunk),
 *   so packing buffers cost neither a malloc nor fresh page faults per call. Slots:
 *   0 = packed B block, 1 = packed A block, 2 = partial sums of a local result,
 *   3 = a group of gathered K rows of an operand packed by runs (emit.py: _run_nest).
 *   A thread's buffers live as long as the thread (OpenMP keeps its team).
 */
#ifndef POLYC_MK_SUPPORT
#define POLYC_MK_SUPPORT
#include <stdlib.h>
#include <string.h>

static _Thread_local void *polyc_scratch_buf[4];
static _Thread_local size_t polyc_scratch_cap[4];

static void *polyc_scratch(int slot, size_t bytes)
{
  bytes = (bytes + 63) & ~(size_t)63;
  if (polyc_scratch_cap[slot] < bytes) {
    free(polyc_scratch_buf[slot]);
    polyc_scratch_buf[slot] = aligned_alloc(64, bytes);
    polyc_scratch_cap[slot] = polyc_scratch_buf[slot] ? bytes : 0;
    if (!polyc_scratch_buf[slot])
      abort();  /* out of memory: there is no error channel in the kernel ABI */
  }
  return polyc_scratch_buf[slot];
}
#endif
