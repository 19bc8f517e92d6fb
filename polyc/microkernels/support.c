/* polyc microkernel support: the scratch buffers packed panels live in.
 *
 * Contract:
 *   polyc_scratch(slot, bytes) returns a 64-byte aligned buffer of at least `bytes`
 *   bytes, private to the calling thread and kept across calls (grown, never shrunk),
 *   so packing buffers cost neither a malloc nor fresh page faults per call. Slots:
 *   0 = packed B block, 1 = packed A block, 2 = partial sums of a local result,
 *   3 = a group of gathered K rows of an operand packed by runs (emit.py: _run_nest),
 *   4 = the padded copy of a B read in place by rows, 5 = its K rows' offsets, 6 = the
 *   panels of a row tail's contraction's B (emit/then.py), 7-10 = a kernel's locals
 *   stored whole (the cpu builder's declare_local). A Winograd convolution's
 *   (emit/winograd.py): 0 its patches transformed, 1 its weights, 2 its products, 3 the
 *   patches' rows, 4 its output rows.
 *   A thread's buffers live as long as the thread (OpenMP keeps its team).
 *
 *   polyc_pack_rows_t(src, ld, rows, tile, kc, dst), tile <= 48: a column panel from
 *   `rows` rows of `kc` contiguous floats, `ld` floats apart: dst[p * tile + r] =
 *   src[r * ld + p], zero for rows <= r < tile. Writes exactly tile * kc floats; src
 *   and dst any alignment. With AVX, eight K steps of eight rows at a time through an
 *   8 x 8 register transpose (the scalar gather it replaces is two memory operations
 *   per element); a tile over 8 rows is several such groups.
 *
 *   polyc_pack_cols(src, ld, kc, width, valid, tile, dst), tile <= 48: `width` / tile
 *   row panels side by side from `kc` rows of contiguous floats, `ld` floats apart:
 *   panel q is dst + q * tile * kc, dst[q * tile * kc + p * tile + x] =
 *   src[p * ld + q * tile + x], zero from column `valid` on. K row by K row across the
 *   panels: one run of src a row, `width` / tile write streams (a B of plain loads, which
 *   the unit's own loop cost a sixth of linear+gelu's gcc time).
 */
#ifndef POLYC_MK_SUPPORT
#define POLYC_MK_SUPPORT
/* a gemm kernel's entry points: private to the unit the kernel is pasted into, unless
   the kernel is built once as a prebuilt part (codegen/build.py), which defines this as
   hidden: linked into each shared object, exported by none */
#ifndef POLYC_MK_ENTRY
#define POLYC_MK_ENTRY __attribute__((noinline, unused)) static
#endif
/* the support's own entry points: private to the unit too, unless it is built once as a
   prebuilt part of its own (registry.py: support_part_source), which defines this as
   hidden (gcc then compiles polyc_pack_rows_t once, not a clone per tile in every unit) */
#ifndef POLYC_SUPPORT_ENTRY
#define POLYC_SUPPORT_ENTRY __attribute__((unused)) static  /* a unit calls some of them */
#endif
#include <stdlib.h>
#include <string.h>
#if defined(__AVX__)
#include <immintrin.h>
#endif

static _Thread_local void *polyc_scratch_buf[11];
static _Thread_local size_t polyc_scratch_cap[11];

POLYC_SUPPORT_ENTRY void *polyc_scratch(int slot, size_t bytes)
{
  bytes = (bytes + 63) & ~(size_t)63;
  if (polyc_scratch_cap[slot] < bytes) {
    free(polyc_scratch_buf[slot]);
    polyc_scratch_buf[slot] = aligned_alloc(64, bytes);
    polyc_scratch_cap[slot] = polyc_scratch_buf[slot] ? bytes : 0;
    if (!polyc_scratch_buf[slot])
      abort();  /* out of memory: there is no error channel in the kernel ABI */
  }
  return polyc_scratch_buf[slot];
}

/* rows r0 .. r0 + 7 (those < rows; zeros past them) of eight K steps from p: an 8-wide
   store per K step at dst + q * tile + r0, which may spill past the panel row into the
   next K step's first slots: the caller writes lower row groups after higher ones, and
   the last store of a panel is cut to the panel */
static inline void polyc_pack_t8(const float *restrict src, long ld, long rows, long tile,
                                 long r0, long p, int last, float *restrict dst)
{
#if defined(__AVX__)
  __m256 r[8];
  for (int i = 0; i < 8; i++)
    r[i] = r0 + i < rows ? _mm256_loadu_ps(src + (r0 + i) * ld + p) : _mm256_setzero_ps();
  __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  __m256 col[8] = {  /* col[q][i] = row r0 + i at K step p + q */
    _mm256_permute2f128_ps(s0, s4, 0x20), _mm256_permute2f128_ps(s1, s5, 0x20),
    _mm256_permute2f128_ps(s2, s6, 0x20), _mm256_permute2f128_ps(s3, s7, 0x20),
    _mm256_permute2f128_ps(s0, s4, 0x31), _mm256_permute2f128_ps(s1, s5, 0x31),
    _mm256_permute2f128_ps(s2, s6, 0x31), _mm256_permute2f128_ps(s3, s7, 0x31)};
  float *d = dst + p * tile + r0;
  long width = tile - r0 < 8 ? tile - r0 : 8;
  for (int q = 0; q < 7; q++)
    _mm256_storeu_ps(d + q * tile, col[q]);
  /* a group narrower than 8 spills into the next K step's first slots, which a lower
     group or the next K steps write after it: only past the panel's last K step is the
     store cut (a memcpy per group took as long as the transposes on 14-row panels) */
  if (last && width < 8) {
    float cut[8];
    _mm256_storeu_ps(cut, col[7]);
    memcpy(d + 7 * tile, cut, width * sizeof(float));
  } else {
    _mm256_storeu_ps(d + 7 * tile, col[7]);
  }
#endif
}

static inline __attribute__((always_inline)) void
polyc_pack_rows_t_tile(const float *restrict src, long ld, long rows, long tile, long kc,
                       float *restrict dst)
{
  long p = 0;
#if defined(__AVX__)
  /* the tail's start as kc rounded down, not as where this loop stopped: inlined with a
     constant kc, gcc saw no bound on the tail's count and warned of an overflow */
  for (; p + 8 <= kc; p += 8)
    for (long r0 = (tile - 1) / 8 * 8; r0 >= 0; r0 -= 8)
      polyc_pack_t8(src, ld, rows, tile, r0, p, p + 8 >= kc, dst);
  p = kc < 0 ? 0 : kc / 8 * 8;
#endif
  for (; p < kc; p++)
    for (long i = 0; i < tile; i++)
      dst[p * tile + i] = i < rows ? src[i * ld + p] : 0.0f;
}

/* one copy per tile (its row groups and strides constants): where the support is pasted
   gcc folds the switch at each call, where it is a prebuilt part it keeps all of them */
#define POLYC_PACK_TILE(t) case t: polyc_pack_rows_t_tile(src, ld, rows, t, kc, dst); return;
POLYC_SUPPORT_ENTRY void polyc_pack_rows_t(const float *restrict src, long ld, long rows,
                                           long tile, long kc, float *restrict dst)
{
  switch (tile) {
  POLYC_PACK_TILE(1) POLYC_PACK_TILE(2) POLYC_PACK_TILE(3) POLYC_PACK_TILE(4)
  POLYC_PACK_TILE(5) POLYC_PACK_TILE(6) POLYC_PACK_TILE(7) POLYC_PACK_TILE(8)
  POLYC_PACK_TILE(9) POLYC_PACK_TILE(10) POLYC_PACK_TILE(11) POLYC_PACK_TILE(12)
  POLYC_PACK_TILE(13) POLYC_PACK_TILE(14) POLYC_PACK_TILE(15) POLYC_PACK_TILE(16)
  POLYC_PACK_TILE(24) POLYC_PACK_TILE(32) POLYC_PACK_TILE(48)  /* B panels of the kernels */
  }
  polyc_pack_rows_t_tile(src, ld, rows, tile, kc, dst);
}

/* `omp simd` where the unit is built with OpenMP (always, by polyc): without it gcc
   turned each panel row's copy into a call of memcpy (batched 16x(256x64 @ 64x256): 7%
   slower) */
#if defined(_OPENMP)
#define POLYC_SIMD _Pragma("omp simd")
#else
#define POLYC_SIMD
#endif
static inline __attribute__((always_inline)) void
polyc_pack_cols_tile(const float *restrict src, long ld, long kc, long width, long valid,
                     long tile, float *restrict dst)
{
  for (long p = 0; p < kc; p++)
    for (long q = 0; q < width; q += tile) {
      const float *restrict s = src + p * ld + q;
      float *restrict d = dst + q * kc + p * tile;
      if (valid - q >= tile) {
POLYC_SIMD
        for (long x = 0; x < tile; x++)
          d[x] = s[x];
      } else {
POLYC_SIMD
        for (long x = 0; x < tile; x++)
          d[x] = x < valid - q ? s[x] : 0.0f;
      }
    }
}

#define POLYC_PACK_COLS(t) \
  case t: polyc_pack_cols_tile(src, ld, kc, width, valid, t, dst); return;
POLYC_SUPPORT_ENTRY void polyc_pack_cols(const float *restrict src, long ld, long kc,
                                         long width, long valid, long tile,
                                         float *restrict dst)
{
  /* each kernel's panel width; with a width gcc cannot see, each panel row is a call
     of memmove (the window kernels' 14, their packed entry on 1x1 convolutions: 5% of
     8x1024x14x14 to 256's time; 0.95-0.96x the time with it, Zen 5, 1 and 2 threads) */
  switch (tile) {
  POLYC_PACK_COLS(14) POLYC_PACK_COLS(16) POLYC_PACK_COLS(24) POLYC_PACK_COLS(32)
  POLYC_PACK_COLS(48)
  }
  polyc_pack_cols_tile(src, ld, kc, width, valid, tile, dst);
}
#endif
