"""The C the cpu backend puts before every translation unit: OpenMP and non-temporal
copies (`stream` marks); then codegen's own helpers."""
from ...codegen.cexpr import PRELUDE as COMMON

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
""" + COMMON
