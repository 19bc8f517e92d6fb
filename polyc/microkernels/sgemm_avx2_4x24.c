/* polyc microkernel sgemm_avx2_4x24: a register-blocked float32 matmul tile, for row
 * counts that are multiples of 4 but not of 6 (64 output channels, ...).
 *
 * Contract (mirrored as data in polyc/microkernels/registry.py):
 *   tile        MR = 4 rows x NR = 24 columns of C, any depth kc >= 1
 *   A           packed column panel, A[p * 4 + r] = a(r, p) for 0 <= p < kc, 0 <= r < 4;
 *               32-byte aligned; rows past the matrix edge are packed as zeros
 *   B           packed row panel, B[p * 24 + c] = b(p, c) for 0 <= c < 24; 32-byte
 *               aligned; columns past the matrix edge are packed as zeros
 *   C           row-major tile C[r * ldc + c], no alignment needed; every one of the
 *               4 x 24 entries is written
 *   accumulate  0: C = A B (C is not read), 1: C += A B
 *   features    avx2, fma. 12 ymm accumulators, 3 B vectors, 1 broadcast: all 16 ymm.
 *
 *   polyc_sgemm_avx2_4x24_rows(kc, A, B, C, ldc, accumulate, rows, cols), 1 <= rows <= 4,
 *   1 <= cols <= 24: the same on the tile's first `rows` rows and `cols` columns only
 *   (operands still packed 4 and 24 wide); other entries of C are neither read nor
 *   written (masked loads and stores). For edge tiles, straight into C.
 *
 *   polyc_sgemm_avx2_4x24_a_rows(kc, A, lda, B, C, ldc, accumulate, rows, cols): as _rows,
 *   with A read in place, a(r, p) = A[r * lda + p] for r < rows (sgemm_avx2_6x16.c).
 *
 *   polyc_sgemm_avx2_4x24_b_rows(kc, A, B, off, C, ldc, accumulate): B not packed but
 *   read in place, row p being the 24 floats at B + off[p] (any alignment, all 24
 *   readable): conv2d's window rows straight from its (padded) input, no im2col. off
 *   holds kc + 16 entries (registry.B_ROWS_AHEAD): rows up to 16 steps ahead are
 *   fetched with no test of p at each step; the entries past kc need only be offsets
 *   into B (their rows are prefetched, never read).
 */
#ifndef POLYC_SGEMM_AVX2_4X24
#define POLYC_SGEMM_AVX2_4X24
#include <immintrin.h>
/* B rows read in place (`off`) are a plane or a window row apart: no hardware
   prefetcher follows them, so each is fetched this many K steps before its use
   (Zen 3, 1 thread: 1x64x56x56 to 64 3x3 74 -> 86 GFLOP/s, 8x256x56x56 to 64 1x1
   55 -> 62; 8 to 16 ahead alike, 32 slower) */
#define POLYC_AHEAD_4X24 16

static inline __attribute__((always_inline)) void
polyc_sgemm_avx2_4x24_impl(long kc, const float *restrict A, long lda,
                           const float *restrict B, const long *restrict off,
                           float *restrict C, long ldc, int accumulate, const int R, long cols,
                           const int W)
{  /* W: the vectors of 8 columns computed; at a right edge, those it stores only */
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256i mask[3];
  for (int v = 0; v < 3; v++)
    mask[v] = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)cols - 8 * v), lane);
  __m256 acc[4][3];  /* fully unrolled: gcc keeps all 12 in registers */
#pragma GCC unroll 4
  for (int r = 0; r < R; r++)
    for (int v = 0; v < 3; v++)
      acc[r][v] = _mm256_setzero_ps();
  for (int r = 0; r < R; r++)  /* C is read or written last: start fetching it now */
    _mm_prefetch((const char *)(C + r * ldc + 23), _MM_HINT_T0);
#pragma GCC unroll 2
  for (long p = 0; p < kc; p++) {
    __m256 b0, b1, b2;
    if (off) {  /* constant in every caller: gcc keeps one of the two */
      const float *b = B + off[p];
      const float *ahead = B + off[p + POLYC_AHEAD_4X24];
      _mm_prefetch((const char *)ahead, _MM_HINT_T0);
      _mm_prefetch((const char *)(ahead + 23), _MM_HINT_T0);
      b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8), b2 = _mm256_loadu_ps(b + 16);
    } else {
      b0 = _mm256_load_ps(B + p * 24);
      b1 = W > 1 ? _mm256_load_ps(B + p * 24 + 8) : b0;
      b2 = W > 2 ? _mm256_load_ps(B + p * 24 + 16) : b0;
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
      __m256 a = _mm256_broadcast_ss(lda ? A + r * lda + p : A + p * 4 + r);
      acc[r][0] = _mm256_fmadd_ps(a, b0, acc[r][0]);
      if (W > 1)
        acc[r][1] = _mm256_fmadd_ps(a, b1, acc[r][1]);
      if (W > 2)
        acc[r][2] = _mm256_fmadd_ps(a, b2, acc[r][2]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; r++) {
    float *row = C + r * ldc;
#pragma GCC unroll 3
    for (int v = 0; v < W; v++) {
      if (cols == 24) {
        if (accumulate)
          acc[r][v] = _mm256_add_ps(acc[r][v], _mm256_loadu_ps(row + 8 * v));
        _mm256_storeu_ps(row + 8 * v, acc[r][v]);
      } else {
        if (accumulate)
          acc[r][v] = _mm256_add_ps(acc[r][v], _mm256_maskload_ps(row + 8 * v, mask[v]));
        _mm256_maskstore_ps(row + 8 * v, mask[v], acc[r][v]);
      }
    }
  }
}

POLYC_MK_ENTRY void polyc_sgemm_avx2_4x24(
    long kc, const float *restrict A, const float *restrict B, float *restrict C, long ldc,
    int accumulate)
{
  polyc_sgemm_avx2_4x24_impl(kc, A, 0, B, 0, C, ldc, accumulate, 4, 24, 3);
}

POLYC_MK_ENTRY void polyc_sgemm_avx2_4x24_b_rows(
    long kc, const float *restrict A, const float *restrict B, const long *restrict off,
    float *restrict C, long ldc, int accumulate)
{
  if (!off)  /* never; told so, gcc keeps only the in-place loads in the K loop, not a
                test of off at every step (1x1 conv2d over 8x64x56x56: 3-5% faster) */
    __builtin_unreachable();
  polyc_sgemm_avx2_4x24_impl(kc, A, 0, B, off, C, ldc, accumulate, 4, 24, 3);
}

/* a tile's first `rows` rows: one instantiation per row count (lda as in the impl) */
static inline __attribute__((always_inline)) void
polyc_sgemm_avx2_4x24_by_rows(long kc, const float *restrict A, long lda,
                              const float *restrict B, float *restrict C, long ldc,
                              int accumulate, long rows, long cols)
{
  switch (rows) {
  case 1: polyc_sgemm_avx2_4x24_impl(kc, A, lda, B, 0, C, ldc, accumulate, 1, cols, 3); break;
  case 2: polyc_sgemm_avx2_4x24_impl(kc, A, lda, B, 0, C, ldc, accumulate, 2, cols, 3); break;
  case 3: polyc_sgemm_avx2_4x24_impl(kc, A, lda, B, 0, C, ldc, accumulate, 3, cols, 3); break;
  default:  /* a tile at the right edge computes the vectors it stores only */
    if (cols <= 8)
      polyc_sgemm_avx2_4x24_impl(kc, A, lda, B, 0, C, ldc, accumulate, 4, cols, 1);
    else if (cols <= 16)
      polyc_sgemm_avx2_4x24_impl(kc, A, lda, B, 0, C, ldc, accumulate, 4, cols, 2);
    else
      polyc_sgemm_avx2_4x24_impl(kc, A, lda, B, 0, C, ldc, accumulate, 4, cols, 3);
    break;
  }
}

POLYC_MK_ENTRY void polyc_sgemm_avx2_4x24_a_rows(
    long kc, const float *restrict A, long lda, const float *restrict B, float *restrict C,
    long ldc, int accumulate, long rows, long cols)
{
  if (lda <= 0)  /* never; told so, gcc drops the packed loads from the K loop */
    __builtin_unreachable();
  polyc_sgemm_avx2_4x24_by_rows(kc, A, lda, B, C, ldc, accumulate, rows, cols);
}

POLYC_MK_ENTRY void polyc_sgemm_avx2_4x24_rows(
    long kc, const float *restrict A, const float *restrict B, float *restrict C, long ldc,
    int accumulate, long rows, long cols)
{
  polyc_sgemm_avx2_4x24_by_rows(kc, A, 0, B, C, ldc, accumulate, rows, cols);
}
#endif
