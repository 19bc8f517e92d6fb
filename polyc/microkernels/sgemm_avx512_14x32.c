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
 *   features    avx512f. 28 zmm accumulators, 2 B vectors, A broadcast from memory into
 *               each FMA: 30 of 32 zmm.
 *
 *   polyc_sgemm_avx512_14x32_rows(kc, A, B, C, ldc, accumulate, rows, cols),
 *   1 <= rows <= 14, 1 <= cols <= 32: the same on the tile's first `rows` rows and
 *   `cols` columns only (operands still packed 14 and 32 wide); other entries of C are
 *   neither read nor written (masked loads and stores). For edge tiles, straight into C.
 *
 *   polyc_sgemm_avx512_14x32_b_rows(kc, A, B, off, C, ldc, accumulate): B not packed
 *   but read in place, row p being the 32 floats at B + off[p] (any alignment, all 32
 *   readable): conv2d's window rows straight from its (padded) input, no im2col.
 */
#ifndef POLYC_SGEMM_AVX512_14X32
#define POLYC_SGEMM_AVX512_14X32
#include <immintrin.h>

static inline __attribute__((always_inline)) void
polyc_sgemm_avx512_impl(long kc, const float *restrict A, const float *restrict B,
                        const long *restrict off, float *restrict C, long ldc,
                        int accumulate, const int R, long cols)
{
  const __mmask16 m0 = cols >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << cols) - 1u);
  const __mmask16 m1 = cols >= 32 ? (__mmask16)0xFFFF
                       : cols <= 16 ? (__mmask16)0 : (__mmask16)((1u << (cols - 16)) - 1u);
  __m512 lo[14], hi[14];  /* fully unrolled: gcc keeps all 28 in registers */
#pragma GCC unroll 14
  for (int r = 0; r < R; r++) {
    lo[r] = _mm512_setzero_ps();
    hi[r] = _mm512_setzero_ps();
  }
#pragma GCC unroll 14
  for (int r = 0; r < R; r++)  /* C is read or written last: start fetching it now */
    _mm_prefetch((const char *)(C + r * ldc), _MM_HINT_T0);
  for (long p = 0; p < kc; p++) {
    __m512 b0, b1;
    if (off) {  /* constant in every caller: gcc keeps one of the two */
      b0 = _mm512_loadu_ps(B + off[p]);
      b1 = _mm512_loadu_ps(B + off[p] + 16);
    } else {
      b0 = _mm512_load_ps(B + p * 32);
      b1 = _mm512_load_ps(B + p * 32 + 16);
      _mm_prefetch((const char *)(B + p * 32 + 256), _MM_HINT_T0);
    }
#pragma GCC unroll 14
    for (int r = 0; r < R; r++) {
      __m512 a = _mm512_set1_ps(A[p * 14 + r]);
      lo[r] = _mm512_fmadd_ps(a, b0, lo[r]);
      hi[r] = _mm512_fmadd_ps(a, b1, hi[r]);
    }
  }
#pragma GCC unroll 14
  for (int r = 0; r < R; r++) {
    float *row = C + r * ldc;
    if (cols == 32) {
      if (accumulate) {
        lo[r] = _mm512_add_ps(lo[r], _mm512_loadu_ps(row));
        hi[r] = _mm512_add_ps(hi[r], _mm512_loadu_ps(row + 16));
      }
      _mm512_storeu_ps(row, lo[r]);
      _mm512_storeu_ps(row + 16, hi[r]);
    } else {
      if (accumulate) {
        lo[r] = _mm512_add_ps(lo[r], _mm512_maskz_loadu_ps(m0, row));
        hi[r] = _mm512_add_ps(hi[r], _mm512_maskz_loadu_ps(m1, row + 16));
      }
      _mm512_mask_storeu_ps(row, m0, lo[r]);
      _mm512_mask_storeu_ps(row + 16, m1, hi[r]);
    }
  }
}

__attribute__((noinline)) static void polyc_sgemm_avx512_14x32(
    long kc, const float *restrict A, const float *restrict B, float *restrict C, long ldc,
    int accumulate)
{
  polyc_sgemm_avx512_impl(kc, A, B, 0, C, ldc, accumulate, 14, 32);
}

__attribute__((noinline)) static void polyc_sgemm_avx512_14x32_rows(
    long kc, const float *restrict A, const float *restrict B, float *restrict C, long ldc,
    int accumulate, long rows, long cols)
{
  switch (rows) {
  case 1: polyc_sgemm_avx512_impl(kc, A, B, 0, C, ldc, accumulate, 1, cols); break;
  case 2: polyc_sgemm_avx512_impl(kc, A, B, 0, C, ldc, accumulate, 2, cols); break;
  case 3: polyc_sgemm_avx512_impl(kc, A, B, 0, C, ldc, accumulate, 3, cols); break;
  case 4: polyc_sgemm_avx512_impl(kc, A, B, 0, C, ldc, accumulate, 4, cols); break;
  case 5: polyc_sgemm_avx512_impl(kc, A, B, 0, C, ldc, accumulate, 5, cols); break;
  case 6: polyc_sgemm_avx512_impl(kc, A, B, 0, C, ldc, accumulate, 6, cols); break;
  case 7: polyc_sgemm_avx512_impl(kc, A, B, 0, C, ldc, accumulate, 7, cols); break;
  case 8: polyc_sgemm_avx512_impl(kc, A, B, 0, C, ldc, accumulate, 8, cols); break;
  case 9: polyc_sgemm_avx512_impl(kc, A, B, 0, C, ldc, accumulate, 9, cols); break;
  case 10: polyc_sgemm_avx512_impl(kc, A, B, 0, C, ldc, accumulate, 10, cols); break;
  case 11: polyc_sgemm_avx512_impl(kc, A, B, 0, C, ldc, accumulate, 11, cols); break;
  case 12: polyc_sgemm_avx512_impl(kc, A, B, 0, C, ldc, accumulate, 12, cols); break;
  case 13: polyc_sgemm_avx512_impl(kc, A, B, 0, C, ldc, accumulate, 13, cols); break;
  default: polyc_sgemm_avx512_impl(kc, A, B, 0, C, ldc, accumulate, 14, cols); break;
  }
}

__attribute__((noinline)) static void polyc_sgemm_avx512_14x32_b_rows(
    long kc, const float *restrict A, const float *restrict B, const long *restrict off,
    float *restrict C, long ldc, int accumulate)
{
  polyc_sgemm_avx512_impl(kc, A, B, off, C, ldc, accumulate, 14, 32);
}
#endif
