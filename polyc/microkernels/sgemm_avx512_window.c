/* polyc: the AVX-512 window kernels' float32 matmul tile, whose A side is the vector side,
 * for a convolution's window read in place (the direct convolution): sgemm_avx512_32x14.c
 * and sgemm_avx512_32x14_bcast.c, which differ only in how a pixel is broadcast.
 *
 * Contract (each kernel file restates it for itself, registry.py holds it as data):
 *   tile        MR = 32 rows x NR = 14 columns of C, any depth kc >= 1
 *   A           packed column panel, A[p * 32 + r] = a(r, p); 64-byte aligned; rows past
 *               the matrix edge are packed as zeros
 *   B           packed row panel, B[p * 14 + c] = b(p, c), any alignment; columns past
 *               the matrix edge are packed as zeros
 *   C           row-major tile C[r * ldc + c], no alignment needed; all 32 x 14 entries
 *               are written
 *   accumulate  0: C = A B (C is not read), 1: C += A B
 *   features    avx512f, avx512vl (the masked 128-bit stores of C's rows). 28 zmm
 *               accumulators (a column's 32 rows in two), the 2 A vectors of a K step,
 *               and B's value broadcast: 30 or 31 of 32 zmm. The accumulators hold C's
 *               columns: C's rows are made from them in registers.
 *
 *   Why the sides are swapped. A convolution's C has the output channels as rows (A,
 *   the weights) and the pixels as columns (B, the window). The other gemm kernels
 *   load B's rows as vectors: read in place from the padded input, each K row's 32
 *   floats start anywhere and cross lines, and a 14x14 output is 7 tiles of 32 for 196
 *   pixels. Here the weights are the vectors (aligned, 32 channels: ResNet's counts are
 *   multiples of 32) and a window row's 14 pixels are broadcast, whatever their
 *   alignment: oneDNN's direct convolution, with the weights' layout made at compile
 *   time and the pixels read where the padded copy holds them.
 *
 *   POLYC_SGEMM_AVX512_WINDOW_KERNEL(name, FOLD) defines a kernel's four entry points,
 *   name(kc, A, B, C, ldc, accumulate) on a whole tile and these:
 *
 *   name_rows(kc, A, B, C, ldc, accumulate, rows, cols), 1 <= rows <= 32,
 *   1 <= cols <= 14: the same on the tile's first `rows` rows and `cols` columns only
 *   (operands still packed 32 and 14 wide); other entries of C are neither read nor
 *   written (masked stores).
 *
 *   name_b_rows(kc, A, B, off, C, ldc, accumulate): B not packed but read in place, row
 *   p being the 14 floats at B + off[p] (any alignment, all 14 readable; off holds
 *   kc + 16 entries, the rows 16 K steps on are fetched).
 *
 *   name_b_taps9(kc, A, B, off, plane, step, C, ldc, accumulate, cols): as _b_rows on
 *   a 3x3 window: K row p is the row of channel p / 9 and tap p % 9, at
 *   B + (p / 9) * plane + off[p % 9] (kc a multiple of 9); its 14 floats are the 7 there
 *   and the 7 `step` floats on (step 7: one run; else two output rows of 7 pixels, the
 *   pad between them skipped); cols 14, or 7: the first 7 columns only (a last output
 *   row of 7 alone).
 */
#ifndef POLYC_SGEMM_AVX512_WINDOW
#define POLYC_SGEMM_AVX512_WINDOW
#include <immintrin.h>

/* K step k: A's two vectors of row k, the 14 columns of B's row from `from` (the first
   7) and `from2` (the next 7), each broadcast into its two FMAs (FOLD: as their operand,
   {1to16}; else once into a register); `from` and `from2` each in one register, so that an
   FMA's operand is that register + 4c: else gcc forms B + off + 4c with a lea per
   column, on the FMAs' ports */
#define POLYC_32X14_STEP(k, from, from2) do { \
    const __m512 a0 = _mm512_load_ps(A + (k) * 32), a1 = _mm512_load_ps(A + (k) * 32 + 16); \
    _mm_prefetch((const char *)(A + ((k) + 8) * 32), _MM_HINT_T0); \
    _mm_prefetch((const char *)(A + ((k) + 8) * 32 + 16), _MM_HINT_T0); \
    const float *bs = (from), *bs2 = (from2); \
    __asm__("" : "+r"(bs), "+r"(bs2)); \
    _Pragma("GCC unroll 14") \
    for (int c = 0; c < W; c++) { \
      const float *e = c < 7 ? bs + c : bs2 + (c - 7); \
      if (FOLD) { \
        __asm__("vfmadd231ps %[b]%{1to16%}, %[a], %[c]" : [c] "+v"(acc[c][0]) : [a] "v"(a0), [b] "m"(*e)); \
        __asm__("vfmadd231ps %[b]%{1to16%}, %[a], %[c]" : [c] "+v"(acc[c][1]) : [a] "v"(a1), [b] "m"(*e)); \
      } else { \
        const __m512 b = _mm512_set1_ps(*e); \
        acc[c][0] = _mm512_fmadd_ps(a0, b, acc[c][0]); \
        acc[c][1] = _mm512_fmadd_ps(a1, b, acc[c][1]); \
      } \
    } \
  } while (0)

/* v[c] holds column c of 16 rows; after, 128-bit lane l of v[4i + j] holds row 4l + j
   of columns 4i to 4i + 3: two of the four rounds of shuffles a 16x16 transpose takes,
   each row's four pieces then stored from their lanes: on Zen 5, 8x128x28x28 3x3
   (1152 deep) took 0.975x the scatters' time so, 0.99x with all four rounds and a
   store a row, 0.97x storing columns unturned (wrong, as a bound) */
static inline __attribute__((always_inline)) void polyc_transpose4x4(__m512 v[16])
{
  __m512 t[16];
#pragma GCC unroll 8
  for (int i = 0; i < 8; i++) {
    t[2 * i] = _mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; i++) {
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
    v[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    v[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    v[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    v[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
}

static inline __attribute__((always_inline)) void
polyc_sgemm_avx512_window_impl(long kc, const float *restrict A, const float *restrict B,
                               const long *restrict off, long plane, long step,
                               float *restrict C, long ldc, int accumulate, long rows,
                               long cols, const int W, const int TAPS, const int FOLD)
{
  __m512 acc[14][2];
#pragma GCC unroll 14
  for (int c = 0; c < W; c++) {
    acc[c][0] = _mm512_setzero_ps();
    acc[c][1] = _mm512_setzero_ps();
  }
  if (TAPS) {
    /* a window's taps, each its own instructions: its rows move by one plane from
       channel to channel, a stride the hardware's prefetcher follows per instruction
       (through the offsets, one instruction for every row: 8x512x7x7 3x3 by hand, 0.93x
       torch's speed with them fetched 16 K steps on, 1.00x so) */
    long tap[TAPS];
#pragma GCC unroll 9
    for (int t = 0; t < TAPS; t++)
      tap[t] = off[t];
    for (long ch = 0; ch < kc / TAPS; ch++) {
      const float *bc = B + ch * plane;
#pragma GCC unroll 9
      for (int t = 0; t < TAPS; t++)
        POLYC_32X14_STEP(ch * TAPS + t, bc + tap[t], bc + tap[t] + step);
    }
  } else {
    for (long p = 0; p < kc; p++) {
      const float *b = B + p * 14;
      if (off) {  /* constant in every caller: gcc keeps one of the two */
        b = B + off[p];
        /* the row 16 K steps on (off holds kc + 16 entries): a channel's plane is a
           new stretch of the copy, which the hardware fetches too late */
        _mm_prefetch((const char *)(B + off[p + 16]), _MM_HINT_T0);
        _mm_prefetch((const char *)(B + off[p + 16] + 13), _MM_HINT_T0);
      }
      POLYC_32X14_STEP(p, b, b + 7);
    }
  }
  /* C's rows from the accumulators' columns, 16 rows at a time (zeros past W): four
     floats a store. Scattered, each column's 16 rows had cost every window kernel's
     case 1-4.5% of its time on Zen 5 (ResNet-50's, in pairs) */
#pragma GCC unroll 2
  for (int h = 0; h < 2; h++) {
    __m512 v[16];
#pragma GCC unroll 16
    for (int c = 0; c < 16; c++)
      v[c] = c < W ? acc[c][h] : _mm512_setzero_ps();
    polyc_transpose4x4(v);
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
      if (4 * i >= cols)
        break;
      const __mmask8 cm = cols - 4 * i >= 4 ? 0xF : (__mmask8)((1u << (cols - 4 * i)) - 1u);
#pragma GCC unroll 4
      for (int l = 0; l < 4; l++)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
          const long r = 16 * h + 4 * l + j;
          if (r >= rows)
            continue;
          float *at = C + r * ldc + 4 * i;
          __m128 x = _mm512_extractf32x4_ps(v[4 * i + j], l);
          if (accumulate)
            x = _mm_add_ps(x, _mm_maskz_loadu_ps(cm, at));
          _mm_mask_storeu_ps(at, cm, x);
        }
    }
  }
}

/* _rows computes all 14 columns (B's are packed with zeros past its edge) and stores
   the first `cols`: one instantiation per column count had cost gcc 4 s of the kernel's
   7, and the first compile on a machine builds every kernel */
#define POLYC_SGEMM_AVX512_WINDOW_KERNEL(name, FOLD) \
POLYC_MK_ENTRY void name( \
    long kc, const float *restrict A, const float *restrict B, float *restrict C, long ldc, \
    int accumulate) \
{ \
  polyc_sgemm_avx512_window_impl(kc, A, B, 0, 0, 0, C, ldc, accumulate, 32, 14, 14, 0, FOLD); \
} \
 \
POLYC_MK_ENTRY void name##_rows( \
    long kc, const float *restrict A, const float *restrict B, float *restrict C, long ldc, \
    int accumulate, long rows, long cols) \
{ \
  polyc_sgemm_avx512_window_impl(kc, A, B, 0, 0, 0, C, ldc, accumulate, rows, cols, 14, 0, FOLD); \
} \
 \
POLYC_MK_ENTRY void name##_b_rows( \
    long kc, const float *restrict A, const float *restrict B, const long *restrict off, \
    float *restrict C, long ldc, int accumulate) \
{ \
  if (!off) /* never: told so, gcc drops the packed B's loads */ \
    __builtin_unreachable(); \
  polyc_sgemm_avx512_window_impl(kc, A, B, off, 0, 0, C, ldc, accumulate, 32, 14, 14, 0, FOLD); \
} \
 \
POLYC_MK_ENTRY void name##_b_taps9( \
    long kc, const float *restrict A, const float *restrict B, const long *restrict off, \
    long plane, long step, float *restrict C, long ldc, int accumulate, long cols) \
{ \
  if (!off) \
    __builtin_unreachable(); \
  if (cols == 7) \
    polyc_sgemm_avx512_window_impl(kc, A, B, off, plane, step, C, ldc, accumulate, 32, 7, 7, 9, FOLD); \
  else \
    polyc_sgemm_avx512_window_impl(kc, A, B, off, plane, step, C, ldc, accumulate, 32, 14, 14, 9, FOLD); \
}
#endif
