/* polyc microkernel sgemm_vec_6x16: the portable float32 matmul tile, written with GCC
 * vector extensions, for targets without AVX2 + FMA (gcc lowers the 8-wide vectors to
 * whatever the target has, down to scalar code).
 *
 * Contract (mirrored as data in polyc/microkernels/registry.py): the same as
 * sgemm_avx2_6x16, so packing is shared.
 *   tile        MR = 6 rows x NR = 16 columns of C, any depth kc >= 1
 *   A           packed column panel, A[p * 6 + r] = a(r, p); 32-byte aligned
 *   B           packed row panel, B[p * 16 + c] = b(p, c); 32-byte aligned
 *   C           row-major tile C[r * ldc + c], no alignment needed; all 6 x 16 written
 *   accumulate  0: C = A B (C is not read), 1: C += A B
 *   features    none
 *
 *   polyc_sgemm_vec_6x16_a_rows(kc, A, lda, B, C, ldc, accumulate, rows, cols): A not
 *   packed but read in place, a(r, p) = A[r * lda + p], on the tile's first rows x cols
 *   (sgemm_avx2_6x16.c); an edge tile by plain loops.
 *
 *   polyc_sgemm_vec_6x16_b_rows(kc, A, B, off, C, ldc, accumulate): B not packed but
 *   read in place, row p being the 16 floats at B + off[p] (any alignment, all 16
 *   readable): conv2d's window rows straight from its (padded) input, no im2col.
 */
#ifndef POLYC_SGEMM_VEC_6X16
#define POLYC_SGEMM_VEC_6X16
#include <string.h>

typedef float polyc_v8f __attribute__((vector_size(32)));

static inline __attribute__((always_inline)) void
polyc_sgemm_vec_6x16_impl(long kc, const float *restrict A, long lda, const float *restrict B,
                          const long *restrict off, float *restrict C, long ldc, int accumulate)
{
  polyc_v8f lo[6], hi[6];
#pragma GCC unroll 6
  for (int r = 0; r < 6; r++) {
    lo[r] = (polyc_v8f){0};
    hi[r] = (polyc_v8f){0};
  }
  for (long p = 0; p < kc; p++) {
    polyc_v8f b0, b1;
    if (off) {  /* constant in every caller: gcc keeps one of the two */
      memcpy(&b0, B + off[p], sizeof b0);
      memcpy(&b1, B + off[p] + 8, sizeof b1);
    } else {
      b0 = *(const polyc_v8f *)(B + p * 16);
      b1 = *(const polyc_v8f *)(B + p * 16 + 8);
    }
#pragma GCC unroll 6
    for (int r = 0; r < 6; r++) {
      float a = lda ? A[r * lda + p] : A[p * 6 + r];  /* lda constant in every caller */
      lo[r] += a * b0;
      hi[r] += a * b1;
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < 6; r++) {
    float *row = C + r * ldc;
    if (accumulate) {
      polyc_v8f x, y;
      memcpy(&x, row, sizeof x);
      memcpy(&y, row + 8, sizeof y);
      lo[r] += x;
      hi[r] += y;
    }
    memcpy(row, &lo[r], sizeof lo[r]);
    memcpy(row + 8, &hi[r], sizeof hi[r]);
  }
}

POLYC_MK_ENTRY void polyc_sgemm_vec_6x16(long kc, const float *restrict A,
                                         const float *restrict B, float *restrict C, long ldc,
                                         int accumulate)
{
  polyc_sgemm_vec_6x16_impl(kc, A, 0, B, 0, C, ldc, accumulate);
}

POLYC_MK_ENTRY void polyc_sgemm_vec_6x16_b_rows(long kc, const float *restrict A,
                                                const float *restrict B, const long *restrict off,
                                                float *restrict C, long ldc, int accumulate)
{
  polyc_sgemm_vec_6x16_impl(kc, A, 0, B, off, C, ldc, accumulate);
}

POLYC_MK_ENTRY void polyc_sgemm_vec_6x16_a_rows(long kc, const float *restrict A, long lda,
                                                const float *restrict B, float *restrict C,
                                                long ldc, int accumulate, long rows, long cols)
{
  if (lda <= 0)  /* never; told so, gcc drops the packed loads from the K loop */
    __builtin_unreachable();
  if (rows == 6 && cols == 16) {
    polyc_sgemm_vec_6x16_impl(kc, A, lda, B, 0, C, ldc, accumulate);
    return;
  }
  /* an edge tile: A's rows past `rows` are not read (the matrix may end there), C's
     entries past rows x cols are neither read nor written */
  float tile[6 * 16];
  for (int r = 0; r < 6; r++)
    for (int c = 0; c < 16; c++) {
      float sum = 0.0f;
      for (long p = 0; r < rows && p < kc; p++)
        sum += A[r * lda + p] * B[p * 16 + c];
      tile[r * 16 + c] = sum;
    }
  for (long r = 0; r < rows; r++)
    for (long c = 0; c < cols; c++)
      C[r * ldc + c] = tile[r * 16 + c] + (accumulate ? C[r * ldc + c] : 0.0f);
}
#endif
