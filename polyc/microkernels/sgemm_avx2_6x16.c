/* polyc microkernel sgemm_avx2_6x16: a register-blocked float32 matmul tile.
 *
 * Contract (mirrored as data in polyc/microkernels/registry.py):
 *   tile        MR = 6 rows x NR = 16 columns of C, any depth kc >= 1
 *   A           packed column panel, A[p * 6 + r] = a(r, p) for 0 <= p < kc, 0 <= r < 6;
 *               32-byte aligned; rows past the matrix edge are packed as zeros
 *   B           packed row panel, B[p * 16 + c] = b(p, c) for 0 <= c < 16; 32-byte
 *               aligned; columns past the matrix edge are packed as zeros
 *   C           row-major tile C[r * ldc + c], no alignment needed; every one of the
 *               6 x 16 entries is written, so the caller passes a full tile (a stack tile
 *               when the tile hangs over the matrix edge)
 *   accumulate  0: C = A B (C is not read), 1: C += A B
 *   features    avx2, fma. 12 ymm accumulators, 2 B vectors, 1 broadcast: 15 of 16 ymm.
 *
 *   polyc_sgemm_avx2_6x16_rows(kc, A, B, C, ldc, accumulate, rows, cols), 1 <= rows <= 6,
 *   1 <= cols <= 16: the same on the tile's first `rows` rows and `cols` columns only
 *   (operands still packed 6 and 16 wide); other entries of C are neither read nor
 *   written (masked loads and stores). For edge tiles, straight into C.
 *
 *   polyc_sgemm_avx2_6x16_a_rows(kc, A, lda, B, C, ldc, accumulate, rows, cols): as _rows,
 *   with A not packed but read in place, a(r, p) = A[r * lda + p] for r < rows: a row-major
 *   A no pack would be worth its copy (attention's probabilities times V, 4 column tiles).
 *
 *   polyc_sgemm_avx2_6x16_b_rows(kc, A, B, off, C, ldc, accumulate): B not packed but
 *   read in place, row p being the 16 floats at B + off[p] (any alignment, all 16
 *   readable): conv2d's window rows straight from its (padded) input, no im2col. off
 *   holds kc + 16 entries (registry.B_ROWS_AHEAD): rows up to 16 steps ahead are
 *   fetched with no test of p at each step; the entries past kc need only be offsets
 *   into B (their rows are prefetched, never read).

 */
#ifndef POLYC_SGEMM_AVX2_6X16
#define POLYC_SGEMM_AVX2_6X16
#include <immintrin.h>
/* B rows read in place (`off`) are a plane or a window row apart: no hardware
   prefetcher follows them, so each is fetched this many K steps before its use
   (Zen 3, 1 thread: 1x256x28x28 to 256 3x3 /2 63 -> 73 GFLOP/s; 14x14 and 7x7 planes
   unchanged; 16 ahead no better) */
#define POLYC_AHEAD_6X16 8

POLYC_MK_ENTRY void polyc_sgemm_avx2_6x16(long kc, const float *restrict A, const float *restrict B,
                                  float *restrict C, long ldc, int accumulate)
{
  __m256 lo[6], hi[6];  /* fully unrolled: gcc keeps all 12 in registers */
#pragma GCC unroll 6
  for (int r = 0; r < 6; r++) {
    lo[r] = _mm256_setzero_ps();
    hi[r] = _mm256_setzero_ps();
  }
  for (int r = 0; r < 6; r++) {  /* C is read or written last: start fetching it now */
    _mm_prefetch((const char *)(C + r * ldc), _MM_HINT_T0);
    _mm_prefetch((const char *)(C + r * ldc + 15), _MM_HINT_T0);
  }
  for (long p = 0; p < kc; p++) {
    __m256 b0 = _mm256_load_ps(B + p * 16), b1 = _mm256_load_ps(B + p * 16 + 8);
#pragma GCC unroll 6
    for (int r = 0; r < 6; r++) {
      __m256 a = _mm256_broadcast_ss(A + p * 6 + r);
      lo[r] = _mm256_fmadd_ps(a, b0, lo[r]);
      hi[r] = _mm256_fmadd_ps(a, b1, hi[r]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < 6; r++) {
    float *row = C + r * ldc;
    if (accumulate) {
      lo[r] = _mm256_add_ps(lo[r], _mm256_loadu_ps(row));
      hi[r] = _mm256_add_ps(hi[r], _mm256_loadu_ps(row + 8));
    }
    _mm256_storeu_ps(row, lo[r]);
    _mm256_storeu_ps(row + 8, hi[r]);
  }
}

static inline __attribute__((always_inline)) void
polyc_sgemm_avx2_rows_impl(long kc, const float *restrict A, long lda,
                           const float *restrict B, const long *restrict off,
                           float *restrict C, long ldc, int accumulate, const int R, long cols,
                           const int W)
{  /* W: the vectors of 8 columns computed; at a right edge, those it stores only */
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)cols), lane);
  const __m256i m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)cols - 8), lane);
  __m256 lo[6], hi[6];
#pragma GCC unroll 6
  for (int r = 0; r < R; r++) {
    lo[r] = _mm256_setzero_ps();
    hi[r] = _mm256_setzero_ps();
  }
  for (long p = 0; p < kc; p++) {
    __m256 b0, b1;
    if (off) {  /* constant in every caller: gcc keeps one of the two */
      const float *ahead = B + off[p + POLYC_AHEAD_6X16];
      _mm_prefetch((const char *)ahead, _MM_HINT_T0);
      _mm_prefetch((const char *)(ahead + 15), _MM_HINT_T0);
      b0 = _mm256_loadu_ps(B + off[p]), b1 = _mm256_loadu_ps(B + off[p] + 8);
    } else {
      b0 = _mm256_load_ps(B + p * 16), b1 = W > 1 ? _mm256_load_ps(B + p * 16 + 8) : b0;
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {  /* lda, like off, is constant in every caller */
      __m256 a = _mm256_broadcast_ss(lda ? A + r * lda + p : A + p * 6 + r);
      lo[r] = _mm256_fmadd_ps(a, b0, lo[r]);
      if (W > 1)
        hi[r] = _mm256_fmadd_ps(a, b1, hi[r]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; r++) {
    float *row = C + r * ldc;
    if (cols == 16) {
      if (accumulate) {
        lo[r] = _mm256_add_ps(lo[r], _mm256_loadu_ps(row));
        hi[r] = _mm256_add_ps(hi[r], _mm256_loadu_ps(row + 8));
      }
      _mm256_storeu_ps(row, lo[r]);
      _mm256_storeu_ps(row + 8, hi[r]);
    } else {
      if (accumulate)
        lo[r] = _mm256_add_ps(lo[r], _mm256_maskload_ps(row, m0));
      _mm256_maskstore_ps(row, m0, lo[r]);
      if (W > 1) {
        if (accumulate)
          hi[r] = _mm256_add_ps(hi[r], _mm256_maskload_ps(row + 8, m1));
        _mm256_maskstore_ps(row + 8, m1, hi[r]);
      }
    }
  }
}

/* a tile's first `rows` rows: one instantiation per row count (lda as in the impl) */
static inline __attribute__((always_inline)) void
polyc_sgemm_avx2_6x16_by_rows(long kc, const float *restrict A, long lda,
                              const float *restrict B, float *restrict C, long ldc,
                              int accumulate, long rows, long cols)
{
  switch (rows) {
  case 1: polyc_sgemm_avx2_rows_impl(kc, A, lda, B, 0, C, ldc, accumulate, 1, cols, 2); break;
  case 2: polyc_sgemm_avx2_rows_impl(kc, A, lda, B, 0, C, ldc, accumulate, 2, cols, 2); break;
  case 3: polyc_sgemm_avx2_rows_impl(kc, A, lda, B, 0, C, ldc, accumulate, 3, cols, 2); break;
  case 4: polyc_sgemm_avx2_rows_impl(kc, A, lda, B, 0, C, ldc, accumulate, 4, cols, 2); break;
  case 5: polyc_sgemm_avx2_rows_impl(kc, A, lda, B, 0, C, ldc, accumulate, 5, cols, 2); break;
  default:  /* a tile at the right edge computes the vectors it stores only */
    if (cols <= 8)
      polyc_sgemm_avx2_rows_impl(kc, A, lda, B, 0, C, ldc, accumulate, 6, cols, 1);
    else
      polyc_sgemm_avx2_rows_impl(kc, A, lda, B, 0, C, ldc, accumulate, 6, cols, 2);
    break;
  }
}

POLYC_MK_ENTRY void polyc_sgemm_avx2_6x16_rows(
    long kc, const float *restrict A, const float *restrict B, float *restrict C, long ldc,
    int accumulate, long rows, long cols)
{
  polyc_sgemm_avx2_6x16_by_rows(kc, A, 0, B, C, ldc, accumulate, rows, cols);
}

POLYC_MK_ENTRY void polyc_sgemm_avx2_6x16_a_rows(
    long kc, const float *restrict A, long lda, const float *restrict B, float *restrict C,
    long ldc, int accumulate, long rows, long cols)
{
  if (lda <= 0)  /* never; told so, gcc drops the packed loads from the K loop */
    __builtin_unreachable();
  polyc_sgemm_avx2_6x16_by_rows(kc, A, lda, B, C, ldc, accumulate, rows, cols);
}

POLYC_MK_ENTRY void polyc_sgemm_avx2_6x16_b_rows(
    long kc, const float *restrict A, const float *restrict B, const long *restrict off,
    float *restrict C, long ldc, int accumulate)
{
  if (!off)  /* never; told so, gcc keeps only the in-place loads in the K loop, not a
                test of off at every step (1x1 conv2d over 8x64x56x56: 3-5% faster) */
    __builtin_unreachable();
  polyc_sgemm_avx2_rows_impl(kc, A, 0, B, off, C, ldc, accumulate, 6, 16, 2);
}
#endif
