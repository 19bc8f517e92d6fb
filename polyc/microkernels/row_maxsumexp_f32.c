/* polyc microkernel row_maxsumexp_f32: the fused max / sum-of-exp pair of softmax-like
 * kernels (logsumexp, log_softmax, softmax's denominator) in one pass over the row.
 *
 * Contract (mirrored as data in polyc/microkernels/registry.py):
 *   polyc_row_maxsumexp_f32(x, n, &m, &s): m = max(x[0..n)), s = sum_k exp(x[k] - m),
 *               n >= 1; computed online (a running max per lane, its sum rescaled by
 *               exp(old max - new max) when the max grows), so x is read once
 *   layout      one contiguous row (unit stride); x any alignment
 *   accuracy    exp by the prelude's polyc_expf (< 2 ulp); +inf or NaN in the row
 *               give a NaN sum
 *   features    none (GCC vector extensions: AVX2 code with -march=native on x86-64)
 */
#ifndef POLYC_ROW_MAXSUMEXP_F32
#define POLYC_ROW_MAXSUMEXP_F32
#include <math.h>
#include <string.h>
/* needs polyc_expf from the codegen prelude (polyc/codegen/cexpr.py), pasted before it */

static void polyc_row_maxsumexp_f32(const float *restrict x, long n, float *max_out,
                                    float *sumexp_out)
{
  float m[8], s[8];
  for (int l = 0; l < 8; l++) {
    m[l] = -INFINITY;
    s[l] = 0.0f;
  }
  long k = 0;
  for (; k + 8 <= n; k += 8) {
#pragma omp simd
    for (int l = 0; l < 8; l++) {
      float v = x[k + l];
      float nm = v > m[l] ? v : m[l];
      /* exp(-inf - -inf) is NaN: a lane still at -inf holds no sum yet */
      float scale = m[l] == -INFINITY ? 0.0f : polyc_expf(m[l] - nm);
      s[l] = s[l] * scale + polyc_expf(v - nm);
      m[l] = nm;
    }
  }
  float mm = -INFINITY;
  for (int l = 0; l < 8; l++)
    mm = m[l] > mm ? m[l] : mm;
  for (; k < n; k++)
    mm = x[k] > mm ? x[k] : mm;
  float ss = 0.0f;
  for (int l = 0; l < 8; l++)
    ss += m[l] == -INFINITY ? 0.0f : s[l] * polyc_expf(m[l] - mm);
  for (k = n - n % 8; k < n; k++)
    ss += polyc_expf(x[k] - mm);
  *max_out = mm;
  *sumexp_out = ss;
}
#endif
