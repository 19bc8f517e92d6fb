/* polyc microkernel sgemm_avx512_14x32: a register-blocked float32 matmul tile.
 *
 * Contract (mirrored as data in polyc/microkernels/registry.py):
 *   tile        MR = 14 rows x NR = 32 columns of C, any depth kc >= 1
 *   A           packed column panel, A[p * 14 + r] = a(r, p); 64-byte aligned; rows past
 *               the matrix edge are packed as zeros
 *   B           packed row panel, B[p * 32 + c] = b(p, c); 64-byte aligned; columns past
 *               the matrix edge are packed as zeros
 *   C           row-major tile C[r * ldc + c], no alignment needed; all 14 x 32 entries
 *               are written
 *   accumulate  0: C = A B (C is not read), 1: C += A B
 *   features    avx512f. 28 zmm accumulators, 2 B vectors, 1 broadcast: 31 of 32 zmm.
 */
#ifndef POLYC_SGEMM_AVX512_14X32
#define POLYC_SGEMM_AVX512_14X32
#include <immintrin.h>

static void polyc_sgemm_avx512_14x32(long kc, const float *restrict A, const float *restrict B,
                                     float *restrict C, long ldc, int accumulate)
{
  __m512 lo[14], hi[14];  /* fully unrolled below: gcc keeps them in registers */
#pragma GCC unroll 14
  for (int r = 0; r < 14; r++) {
    lo[r] = _mm512_setzero_ps();
    hi[r] = _mm512_setzero_ps();
  }
  for (long p = 0; p < kc; p++) {
    __m512 b0 = _mm512_load_ps(B + p * 32), b1 = _mm512_load_ps(B + p * 32 + 16);
    _mm_prefetch((const char *)(B + p * 32 + 256), _MM_HINT_T0);
#pragma GCC unroll 14
    for (int r = 0; r < 14; r++) {
      __m512 a = _mm512_set1_ps(A[p * 14 + r]);
      lo[r] = _mm512_fmadd_ps(a, b0, lo[r]);
      hi[r] = _mm512_fmadd_ps(a, b1, hi[r]);
    }
  }
#pragma GCC unroll 14
  for (int r = 0; r < 14; r++) {
    float *row = C + r * ldc;
    if (accumulate) {
      lo[r] = _mm512_add_ps(lo[r], _mm512_loadu_ps(row));
      hi[r] = _mm512_add_ps(hi[r], _mm512_loadu_ps(row + 16));
    }
    _mm512_storeu_ps(row, lo[r]);
    _mm512_storeu_ps(row + 16, hi[r]);
  }
}
#endif
