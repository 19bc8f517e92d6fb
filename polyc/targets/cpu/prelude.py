"""The C the cpu backend puts before every translation unit: OpenMP, the x86 intrinsics
and non-temporal copies (`stream` marks); then codegen's own helpers."""
from ...codegen.cexpr import PRELUDE as COMMON

PRELUDE = r"""#include <omp.h>
#include <stdint.h>
#include <stddef.h>
#include <string.h>
#if defined(__SSE2__)
#include <immintrin.h>
#endif
/* dst = src, bytes long, with non-temporal stores wherever dst is 16-byte aligned: the
   lines written are not read into the cache first and evict nothing */
static inline void polyc_stream(void *restrict dst, const void *restrict src, size_t bytes) {
  char *d = dst; const char *s = src;
#if defined(__SSE2__)
  size_t head = -(uintptr_t)d & 15;
  head = head < bytes ? head : bytes;
  if (head) { memcpy(d, s, head); d += head; s += head; bytes -= head; }
#if defined(__AVX__)
  if (((uintptr_t)d & 31) && bytes >= 16) {
    _mm_stream_si128((__m128i *)d, _mm_loadu_si128((const __m128i *)s));
    d += 16; s += 16; bytes -= 16;
  }
  for (; bytes >= 32; d += 32, s += 32, bytes -= 32)
    _mm256_stream_si256((__m256i *)d, _mm256_loadu_si256((const __m256i *)s));
#endif
  for (; bytes >= 16; d += 16, s += 16, bytes -= 16)
    _mm_stream_si128((__m128i *)d, _mm_loadu_si128((const __m128i *)s));
#endif
  if (bytes) memcpy(d, s, bytes);
}
static inline void polyc_stream_fence(void) {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}
""" + COMMON
