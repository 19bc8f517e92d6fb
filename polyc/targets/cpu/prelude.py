"""The C the cpu backend puts before every translation unit: OpenMP and non-temporal
copies (`stream` marks); then codegen's own helpers; then, for AVX-512, the helpers of
values on 16 lanes (`emit/lanes.py`)."""
from ...codegen.cexpr import PRELUDE as COMMON

LANES = r"""#if defined(__AVX512F__)
/* A gemm tile's heavy epilogue written back 16 floats at a time (emit/lanes.py): gcc's
   vector type and its AVX-512 builtins (as polyc_stream: no intrinsics header), so that the
   reciprocal's guess and exp's scaling by 2^n are one instruction each (vrcp14ps,
   vscalefps), which gcc's vectorisation of the scalar versions cannot find. The same
   polynomials as those (POLYC_*_POLY); one Newton step on the reciprocal's 14 bits */
typedef float polyc_v16 __attribute__((vector_size(64)));
typedef float polyc_v16u __attribute__((vector_size(64), aligned(4), may_alias));
typedef int32_t polyc_v16i __attribute__((vector_size(64)));
typedef unsigned short polyc_m16;
#define POLYC_V_ROUND 4                                  /* the current rounding mode */
#define POLYC_V_CMP(a, b, p) __builtin_ia32_cmpps512_mask((a), (b), (p), 0xFFFF, POLYC_V_ROUND)
static inline polyc_v16 polyc_v_set(float x) {
  return (polyc_v16){x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x};
}
/* exact: the polynomial with halved coefficients is exactly half of it */
static inline polyc_v16 polyc_v_half(float x) { return polyc_v_set(0.5f * x); }
static inline polyc_v16 polyc_v_load(const float *p) { return *(const polyc_v16u *)p; }
static inline void polyc_v_store(float *p, polyc_v16 v) { *(polyc_v16u *)p = v; }
/* the first n of 16 lanes, n >= 1 */
static inline polyc_m16 polyc_v_mask(long n) {
  return n >= 16 ? 0xFFFF : (polyc_m16)((1u << n) - 1u);
}
static inline polyc_v16 polyc_v_loadm(const float *p, polyc_m16 m) {
  return __builtin_ia32_loadups512_mask(p, polyc_v_set(0.0f), m);
}
static inline void polyc_v_storem(float *p, polyc_v16 v, polyc_m16 m) {
  __builtin_ia32_storeups512_mask(p, v, m);
}
static inline polyc_v16 polyc_v_fma(polyc_v16 a, polyc_v16 b, polyc_v16 c) {
  return __builtin_ia32_vfmaddps512_mask(a, b, c, 0xFFFF, POLYC_V_ROUND);
}
/* b where m, else a */
static inline polyc_v16 polyc_v_blend(polyc_m16 m, polyc_v16 a, polyc_v16 b) {
  return __builtin_ia32_blendmps_512_mask(a, b, m);
}
/* vminps and vmaxps return their second operand where either is a NaN: a constant
   first keeps x's NaN */
static inline polyc_v16 polyc_v_min(polyc_v16 a, polyc_v16 b) {
  polyc_v16 m = __builtin_ia32_minps512_mask(a, b, a, 0xFFFF, POLYC_V_ROUND);
  return polyc_v_blend(POLYC_V_CMP(a, a, 3), m, a);
}
static inline polyc_v16 polyc_v_max(polyc_v16 a, polyc_v16 b) {
  polyc_v16 m = __builtin_ia32_maxps512_mask(a, b, a, 0xFFFF, POLYC_V_ROUND);
  return polyc_v_blend(POLYC_V_CMP(a, a, 3), m, a);
}
static inline polyc_v16 polyc_v_clamp_above(float c, polyc_v16 x) {   /* min(c, x), NaN kept */
  return __builtin_ia32_minps512_mask(polyc_v_set(c), x, x, 0xFFFF, POLYC_V_ROUND);
}
static inline polyc_v16 polyc_v_clamp_below(float c, polyc_v16 x) {   /* max(c, x), NaN kept */
  return __builtin_ia32_maxps512_mask(polyc_v_set(c), x, x, 0xFFFF, POLYC_V_ROUND);
}
static inline polyc_v16 polyc_v_relu(polyc_v16 x) { return polyc_v_clamp_below(0.0f, x); }
static inline polyc_v16 polyc_v_abs(polyc_v16 x) { return (polyc_v16)((polyc_v16i)x & 0x7fffffff); }
/* |y| with the sign of x */
static inline polyc_v16 polyc_v_sign_of(polyc_v16 x, polyc_v16 y) {
  return (polyc_v16)(((polyc_v16i)y & 0x7fffffff) | ((polyc_v16i)x & (int32_t)0x80000000));
}
static inline polyc_v16 polyc_v_sqrt(polyc_v16 x) {
  return __builtin_ia32_sqrtps512_mask(x, x, 0xFFFF, POLYC_V_ROUND);
}
static inline polyc_v16 polyc_v_floor(polyc_v16 x) {
  return __builtin_ia32_rndscaleps_mask(x, 9, x, 0xFFFF, POLYC_V_ROUND);
}
static inline polyc_v16 polyc_v_ceil(polyc_v16 x) {
  return __builtin_ia32_rndscaleps_mask(x, 10, x, 0xFFFF, POLYC_V_ROUND);
}
/* 1 / d for d in [2^-126, 2^126] */
static inline polyc_v16 polyc_v_recipf(polyc_v16 d) {
  polyc_v16 r = __builtin_ia32_rcp14ps512_mask(d, d, 0xFFFF);
  return polyc_v_fma(r, polyc_v_fma(-d, r, polyc_v_set(1.0f)), r);
}
static inline polyc_v16 polyc_v_expf(polyc_v16 x) {
  /* past these exp over- or underflows whatever r is, which stays small so */
  x = polyc_v_clamp_below(-104.0f, polyc_v_clamp_above(88.8f, x));
  polyc_v16 n = __builtin_ia32_rndscaleps_mask(x * 1.44269504088896341f, 8, x, 0xFFFF,
                                               POLYC_V_ROUND);        /* to nearest */
  polyc_v16 r = polyc_v_fma(n, polyc_v_set(-0.693145751953125f), x);   /* x = n ln2 + r */
  r = polyc_v_fma(n, polyc_v_set(-1.428606765330187045e-06f), r);
  polyc_v16 q = POLYC_EXP_POLY(polyc_v_fma, polyc_v_half, r);   /* 2 exp(r), halved */
  return __builtin_ia32_scalefps512_mask(q, n, q, 0xFFFF, POLYC_V_ROUND);
}
/* exp(-x) up to e^87, where 1 + it and its reciprocal stay normal; flushed below
   -86.6433 as the scalar version */
static inline polyc_v16 polyc_v_sigmoidf(polyc_v16 x) {
  polyc_v16 y = polyc_v_recipf(1.0f + polyc_v_expf(-polyc_v_clamp_below(-87.0f, x)));
  return polyc_v_blend(POLYC_V_CMP(x, polyc_v_set(-86.6433f), 1), y, polyc_v_set(0.0f));
}
static inline polyc_v16 polyc_v_tanhf(polyc_v16 x) {
  polyc_v16 a = polyc_v_abs(x);
  polyc_v16 e = polyc_v_expf(2.0f * polyc_v_clamp_above(20.0f, a));
  polyc_v16 big = 1.0f - 2.0f * polyc_v_recipf(e + 1.0f);
  polyc_v16 a2 = a * a;
  polyc_v16 small = polyc_v_fma(a * a2, POLYC_TANH_POLY(polyc_v_fma, polyc_v_set, a2), a);
  return polyc_v_sign_of(x, polyc_v_blend(POLYC_V_CMP(a, polyc_v_set(0.625f), 1), big, small));
}
static inline polyc_v16 polyc_v_erff(polyc_v16 x) {
  polyc_v16 a = polyc_v_abs(x);
  polyc_v16 t = polyc_v_recipf(polyc_v_fma(polyc_v_set(0.3275911f), polyc_v_clamp_above(16.0f, a),
                                           polyc_v_set(1.0f)));
  polyc_v16 far = 1.0f - POLYC_ERF_POLY(polyc_v_fma, polyc_v_set, t) * t * polyc_v_expf(-a * a);
  polyc_v16 a2 = a * a;
  polyc_v16 near = POLYC_ERF_NEAR(a, a2);
  return polyc_v_sign_of(x, polyc_v_blend(POLYC_V_CMP(a, polyc_v_set(0.5f), 1), far, near));
}
#endif
"""

PRELUDE = r"""#include <omp.h>
#include <stdint.h>
#include <stddef.h>
#include <string.h>
/* dst = src, bytes long, with non-temporal stores wherever dst is 16-byte aligned: the
   lines written are not read into the cache first and evict nothing. gcc's builtins,
   not <immintrin.h>: the intrinsics headers made every unit's precompiled prelude 26 MB,
   0.03 s to load in each gcc run */
#if defined(__SSE2__)
typedef long long polyc_v2di __attribute__((vector_size(16)));
#endif
#if defined(__AVX__)
typedef long long polyc_v4di __attribute__((vector_size(32)));
#endif
static inline void polyc_stream(void *restrict dst, const void *restrict src, size_t bytes) {
  char *d = dst; const char *s = src;
#if defined(__SSE2__)
  size_t head = -(uintptr_t)d & 15;
  head = head < bytes ? head : bytes;
  if (head) { memcpy(d, s, head); d += head; s += head; bytes -= head; }
  polyc_v2di x;
#if defined(__AVX__)
  polyc_v4di y;
  if (((uintptr_t)d & 31) && bytes >= 16) {
    memcpy(&x, s, 16);
    __builtin_ia32_movntdq((polyc_v2di *)d, x);
    d += 16; s += 16; bytes -= 16;
  }
  for (; bytes >= 32; d += 32, s += 32, bytes -= 32) {
    memcpy(&y, s, 32);
    __builtin_ia32_movntdq256((polyc_v4di *)d, y);
  }
#endif
  for (; bytes >= 16; d += 16, s += 16, bytes -= 16) {
    memcpy(&x, s, 16);
    __builtin_ia32_movntdq((polyc_v2di *)d, x);
  }
#endif
  if (bytes) memcpy(d, s, bytes);
}
static inline void polyc_stream_fence(void) {
#if defined(__SSE2__)
  __builtin_ia32_sfence();
#endif
}
/* no inf or NaN among n floats: whether a product may skip the terms whose other factor
   is 0 (0 * inf is NaN); on the bits, as fast-math flags may not fold it away */
static inline int polyc_all_finite(const float *x, size_t n) {
  uint32_t bad = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t bits;
    memcpy(&bits, x + i, 4);
    bad |= (bits & 0x7f800000u) == 0x7f800000u;
  }
  return !bad;
}
""" + COMMON + LANES
