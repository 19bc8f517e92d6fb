/* polyc: the AVX-512 register-blocked float32 matmul tile shared by the avx512 gemm
 * kernels (sgemm_avx512_14x32.c, sgemm_avx512_8x48.c), which differ only in their tile:
 * MR rows x NV zmm vectors (16 columns each) of C in MR * NV accumulators.
 *
 * Contract (each kernel file restates it for its tile, registry.py holds it as data):
 *   A   packed column panel, A[p * MR + r] = a(r, p); 64-byte aligned; zero rows past
 *       the matrix edge
 *   B   packed row panel, B[p * NR + c] = b(p, c) (NR = 16 NV); 64-byte aligned; zero
 *       columns past the edge; or, with `off`, read in place: row p is the NR floats at
 *       B + off[p] (any alignment, all NR readable)
 *   C   row-major, C[r * ldc + c]; the first R rows and `cols` columns are written
 *       (masked stores past `cols`), others neither read nor written;
 *       accumulate 0: C = A B, 1: C += A B
 *
 *   POLYC_SGEMM_AVX512_KERNEL(name, MR, NV) defines the four entry points of a kernel:
 *   name(kc, A, B, C, ldc, accumulate) on a whole tile, name_rows(..., rows, cols) on its
 *   first rows x cols, name_b_rows(kc, A, B, off, C, ldc, accumulate) with B in place,
 *   name_a_rows(kc, A, lda, B, C, ldc, accumulate, rows, cols) as _rows with A read in
 *   place, a(r, p) = A[r * lda + p] for r < rows (a row tail's contraction reads the
 *   rows it has just written: attention's probabilities times v).
 */
#ifndef POLYC_SGEMM_AVX512
#define POLYC_SGEMM_AVX512
#include <immintrin.h>
/* B rows read in place (`off`) are a plane or a window row apart: no hardware
   prefetcher follows them, so each is fetched this many K steps before its use, as the
   avx2 kernels do (off holds kc + registry.B_ROWS_AHEAD entries) */
#define POLYC_AHEAD_AVX512 16

static inline __mmask16 polyc_avx512_mask(long cols, int v)
{
  return cols >= 16 * (v + 1) ? (__mmask16)0xFFFF
         : cols <= 16 * v ? (__mmask16)0 : (__mmask16)((1u << (cols - 16 * v)) - 1u);
}

static inline __attribute__((always_inline)) void
polyc_sgemm_avx512_impl(long kc, const float *restrict A, long lda, const float *restrict B,
                        const long *restrict off, float *restrict C, long ldc,
                        int accumulate, const int R, const int MR, const int NV, const int W,
                        long cols)
{
  const int NR = 16 * NV;  /* the panel's width; W <= NV vectors of it are computed */
  __m512 acc[14][3];  /* fully unrolled below: gcc keeps the R x NV used in registers */
#pragma GCC unroll 14
  for (int r = 0; r < R; r++)
#pragma GCC unroll 3
    for (int v = 0; v < W; v++)
      acc[r][v] = _mm512_setzero_ps();
#pragma GCC unroll 14
  for (int r = 0; r < R; r++)  /* C is read or written last: start fetching it now */
    _mm_prefetch((const char *)(C + r * ldc), _MM_HINT_T0);
  for (long p = 0; p < kc; p++) {
    __m512 b[3];
    if (off) {  /* constant in every caller: gcc keeps one of the two */
      const float *ahead = B + off[p + POLYC_AHEAD_AVX512];
#pragma GCC unroll 3
      for (int v = 0; v < W; v++)
        _mm_prefetch((const char *)(ahead + 16 * v), _MM_HINT_T0);
      _mm_prefetch((const char *)(ahead + NR - 1), _MM_HINT_T0);
#pragma GCC unroll 3
      for (int v = 0; v < W; v++)
        b[v] = _mm512_loadu_ps(B + off[p] + 16 * v);
    } else {
#pragma GCC unroll 3
      for (int v = 0; v < W; v++)
        b[v] = _mm512_load_ps(B + p * NR + 16 * v);
      _mm_prefetch((const char *)(B + (p + 8) * NR), _MM_HINT_T0);
    }
#pragma GCC unroll 14
    for (int r = 0; r < R; r++) {
      const float *a = lda ? &A[r * lda + p] : &A[p * MR + r];
      if (NV <= 2 && !off) {
        /* a(r, p) as each FMA's broadcast operand ({1to16}), not broadcast once into a
           register: gcc keeps one broadcast for the row's two FMAs, which costs an
           instruction more per row; folded in, the 14 x 32 tile ran 8-15% faster in
           cache and 1024^3 8-10% faster in pairs of calls (Sapphire Rapids). Not for
           three FMAs a row: three loads where one did, 8 x 48 ran up to 9% slower
           (1x64x56x56 3x3); nor beside B's rows read in place, whose loads cross
           lines: 1x64x56x56 to 64 1x1 and 28x28 /2 3x3 ran 4-5% slower */
#pragma GCC unroll 3
        for (int v = 0; v < W; v++)
          __asm__("vfmadd231ps %[a]%{1to16%}, %[b], %[c]"
                  : [c] "+v"(acc[r][v]) : [b] "v"(b[v]), [a] "m"(*a));
      } else {
        const __m512 a1 = _mm512_set1_ps(*a);
#pragma GCC unroll 3
        for (int v = 0; v < W; v++)
          acc[r][v] = _mm512_fmadd_ps(a1, b[v], acc[r][v]);
      }
    }
  }
#pragma GCC unroll 14
  for (int r = 0; r < R; r++) {
    float *row = C + r * ldc;
#pragma GCC unroll 3
    for (int v = 0; v < W; v++) {
      if (cols == NR) {
        if (accumulate)
          acc[r][v] = _mm512_add_ps(acc[r][v], _mm512_loadu_ps(row + 16 * v));
        _mm512_storeu_ps(row + 16 * v, acc[r][v]);
      } else {
        const __mmask16 m = polyc_avx512_mask(cols, v);
        if (accumulate)
          acc[r][v] = _mm512_add_ps(acc[r][v], _mm512_maskz_loadu_ps(m, row + 16 * v));
        _mm512_mask_storeu_ps(row + 16 * v, m, acc[r][v]);
      }
    }
  }
}

/* rows < MR: one instantiation per row count below MR (the others are dead code) */
#define POLYC_AVX512_ROWS_CASE(k, MR, NV) \
  case k: if ((k) < (MR)) { polyc_sgemm_avx512_impl(kc, A, lda, B, 0, C, ldc, accumulate, (k) < (MR) ? (k) : (MR), MR, NV, NV, cols); break; } /* fall through */

#define POLYC_SGEMM_AVX512_KERNEL(name, MR, NV) \
POLYC_MK_ENTRY void name( \
    long kc, const float *restrict A, const float *restrict B, float *restrict C, long ldc, \
    int accumulate) \
{ \
  polyc_sgemm_avx512_impl(kc, A, 0, B, 0, C, ldc, accumulate, MR, MR, NV, NV, 16 * (NV)); \
} \
static inline __attribute__((always_inline)) void name##_by_rows( \
    long kc, const float *restrict A, long lda, const float *restrict B, float *restrict C, \
    long ldc, int accumulate, long rows, long cols) \
{ \
  switch (rows) { \
  POLYC_AVX512_ROWS_CASE(1, MR, NV) POLYC_AVX512_ROWS_CASE(2, MR, NV) \
  POLYC_AVX512_ROWS_CASE(3, MR, NV) POLYC_AVX512_ROWS_CASE(4, MR, NV) \
  POLYC_AVX512_ROWS_CASE(5, MR, NV) POLYC_AVX512_ROWS_CASE(6, MR, NV) \
  POLYC_AVX512_ROWS_CASE(7, MR, NV) POLYC_AVX512_ROWS_CASE(8, MR, NV) \
  POLYC_AVX512_ROWS_CASE(9, MR, NV) POLYC_AVX512_ROWS_CASE(10, MR, NV) \
  POLYC_AVX512_ROWS_CASE(11, MR, NV) POLYC_AVX512_ROWS_CASE(12, MR, NV) \
  POLYC_AVX512_ROWS_CASE(13, MR, NV) \
  default: /* a tile at the right edge computes the vectors it stores only */ \
    if ((NV) > 1 && cols <= 16) \
      polyc_sgemm_avx512_impl(kc, A, lda, B, 0, C, ldc, accumulate, MR, MR, NV, 1, cols); \
    else if ((NV) > 2 && cols <= 32) \
      polyc_sgemm_avx512_impl(kc, A, lda, B, 0, C, ldc, accumulate, MR, MR, NV, 2, cols); \
    else \
      polyc_sgemm_avx512_impl(kc, A, lda, B, 0, C, ldc, accumulate, MR, MR, NV, NV, cols); \
  } \
} \
POLYC_MK_ENTRY void name##_rows( \
    long kc, const float *restrict A, const float *restrict B, float *restrict C, long ldc, \
    int accumulate, long rows, long cols) \
{ \
  name##_by_rows(kc, A, 0, B, C, ldc, accumulate, rows, cols); \
} \
POLYC_MK_ENTRY void name##_a_rows( \
    long kc, const float *restrict A, long lda, const float *restrict B, float *restrict C, \
    long ldc, int accumulate, long rows, long cols) \
{ \
  if (lda <= 0)  /* never; told so, gcc drops the packed loads from the K loop */ \
    __builtin_unreachable(); \
  name##_by_rows(kc, A, lda, B, C, ldc, accumulate, rows, cols); \
} \
POLYC_MK_ENTRY void name##_b_rows( \
    long kc, const float *restrict A, const float *restrict B, const long *restrict off, \
    float *restrict C, long ldc, int accumulate) \
{ \
  if (!off)  /* never; told so, gcc drops the packed B's loop */ \
    __builtin_unreachable(); \
  polyc_sgemm_avx512_impl(kc, A, 0, B, off, C, ldc, accumulate, MR, MR, NV, NV, 16 * (NV)); \
}
#endif
