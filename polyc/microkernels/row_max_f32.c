/* polyc microkernel row_max_f32: the maximum of a contiguous float32 row.
 *
 * Contract (mirrored as data in polyc/microkernels/registry.py):
 *   polyc_row_max_f32(x, n) = max(x[0], ..., x[n - 1]), n >= 0 (-inf for n = 0);
 *               a NaN anywhere in the row gives NaN, as numpy's max
 *   layout      one contiguous row (unit stride); x any alignment
 *   features    none (GCC vector extensions: AVX2 code with -march=native on x86-64)
 */
#ifndef POLYC_ROW_MAX_F32
#define POLYC_ROW_MAX_F32
#include <math.h>
#include <stdint.h>
#include <string.h>
/* the entry point: private to the unit it is pasted into, unless the kernel is built
   once as a prebuilt part (registry.py: part_source), which defines this as hidden */
#ifndef POLYC_PART_ENTRY
#define POLYC_PART_ENTRY static
#endif

typedef float polyc_rm_v8f __attribute__((vector_size(32)));
typedef int32_t polyc_rm_v8i __attribute__((vector_size(32)));

/* the larger of acc and v lane by lane; a NaN in v is flagged by the caller instead
   (one max instead of a compare-and-select chain). gcc's builtin, not <immintrin.h>,
   which units pasting this kernel would parse (0.03 s a gcc run). A macro: a function
   taking and returning 32-byte vectors draws gcc's ABI warning where AVX is off */
#if defined(__AVX__)
#define POLYC_RM_MAX(acc, v) __builtin_ia32_maxps256((acc), (v))
#else
#define POLYC_RM_MAX(acc, v) ({ polyc_rm_v8f a_ = (acc), v_ = (v); polyc_rm_v8i t_ = v_ > a_; \
                                (polyc_rm_v8f)(((polyc_rm_v8i)v_ & t_) | ((polyc_rm_v8i)a_ & ~t_)); })
#endif

POLYC_PART_ENTRY float polyc_row_max_f32(const float *restrict x, long n)
{
  const polyc_rm_v8f lo = {-INFINITY, -INFINITY, -INFINITY, -INFINITY,
                           -INFINITY, -INFINITY, -INFINITY, -INFINITY};
  polyc_rm_v8f a0 = lo, a1 = lo, a2 = lo, a3 = lo;
  polyc_rm_v8i nan = {0};  /* lanes that saw a NaN */
  long k = 0;
  for (; k + 32 <= n; k += 32) {
    polyc_rm_v8f v0, v1, v2, v3;
    memcpy(&v0, x + k, 32);
    memcpy(&v1, x + k + 8, 32);
    memcpy(&v2, x + k + 16, 32);
    memcpy(&v3, x + k + 24, 32);
    a0 = POLYC_RM_MAX(a0, v0); a1 = POLYC_RM_MAX(a1, v1);
    a2 = POLYC_RM_MAX(a2, v2); a3 = POLYC_RM_MAX(a3, v3);
    nan |= (v0 != v0) | (v1 != v1) | (v2 != v2) | (v3 != v3);
  }
  polyc_rm_v8f a = POLYC_RM_MAX(POLYC_RM_MAX(a0, a1), POLYC_RM_MAX(a2, a3));
  float m = -INFINITY;
  for (int l = 0; l < 8; l++) {
    if (nan[l])
      return NAN;
    m = a[l] > m ? a[l] : m;
  }
  for (; k < n; k++) {
    if (x[k] != x[k])
      return NAN;
    m = x[k] > m ? x[k] : m;
  }
  return m;
}
#endif
