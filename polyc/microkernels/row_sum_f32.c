/* polyc microkernel row_sum_f32: the sum of a contiguous float32 row.
 *
 * Contract (mirrored as data in polyc/microkernels/registry.py):
 *   polyc_row_sum_f32(x, n) = x[0] + ... + x[n - 1], n >= 0, x any alignment
 *   layout      one contiguous row (unit stride); the kernel reads each element once
 *   order       32 lanes in 4 independent 8-wide accumulators, added pairwise at the end:
 *               a different (and more accurate) summation order than one running sum
 *   features    none (GCC vector extensions: AVX2 code with -march=native on x86-64)
 */
#ifndef POLYC_ROW_SUM_F32
#define POLYC_ROW_SUM_F32
#include <string.h>
/* the entry point: private to the unit it is pasted into, unless the kernel is built
   once as a prebuilt part (registry.py: part_source), which defines this as hidden */
#ifndef POLYC_PART_ENTRY
#define POLYC_PART_ENTRY static
#endif

typedef float polyc_rs_v8f __attribute__((vector_size(32)));

POLYC_PART_ENTRY float polyc_row_sum_f32(const float *restrict x, long n)
{
  polyc_rs_v8f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
  long k = 0;
  for (; k + 32 <= n; k += 32) {
    polyc_rs_v8f v0, v1, v2, v3;
    memcpy(&v0, x + k, 32);
    memcpy(&v1, x + k + 8, 32);
    memcpy(&v2, x + k + 16, 32);
    memcpy(&v3, x + k + 24, 32);
    a0 += v0; a1 += v1; a2 += v2; a3 += v3;
  }
  for (; k + 8 <= n; k += 8) {
    polyc_rs_v8f v;
    memcpy(&v, x + k, 32);
    a0 += v;
  }
  polyc_rs_v8f a = (a0 + a1) + (a2 + a3);
  float s = ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
  for (; k < n; k++)
    s += x[k];
  return s;
}
#endif
