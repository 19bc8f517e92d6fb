/* polyc: what Winograd's two tiles' transforms share (winograd_f2x3.c, winograd_f4x3.c):
 * the walk over the weights in U's layout, and the input rows V's patches come from.
 *
 * POLYC_WINOGRAD_WEIGHTS(E, body): inside a function of the weights' contract
 * (w, O, C, mr, es, U), for each output o0 + r and channel c, `body` transforms the 3x3
 * window g (9 floats) into u[e * es + r], e < E, in U's panels of mr rows: the lanes r
 * of a panel's rows, rows past O zero.
 *
 * polyc_winograd_strip(x, C, H, W, pt, pl, TY, TX, m, r0, r1, c, len, strip): for an
 * F(m x m, 3x3) tile, the m + 2 input rows of channel c under each tile row r0 .. r1 - 1
 * of x[n][C][H][W] (tile row r: image r / TY, its patches at input row m (r % TY) - pt + a,
 * a < m + 2, and columns m tx - pl), each zero-padded to m (TX + 1) floats: strip row a
 * at strip + a len, tile row r's part from (r - r0) m (TX + 1), zero from the last one's
 * end to len. A tile's patch is then m + 2 floats from m j, j = (r - r0) (TX + 1) + tx:
 * each tile row one tile more than its tiles, its pad.
 */
#ifndef POLYC_WINO_COMMON
#define POLYC_WINO_COMMON

#define POLYC_WINOGRAD_WEIGHTS(E, ...)                                                    \
  for (long o0 = 0; o0 < O; o0 += mr)                                                     \
    for (long c = 0; c < C; c++) {                                                        \
      float *restrict u = U + (o0 / mr * C + c) * mr;                                     \
      const long rows = O - o0 < mr ? O - o0 : mr;                                        \
      _Pragma("omp simd")                                                                 \
      for (long r = 0; r < rows; r++) {                                                   \
        const float *g = w + ((o0 + r) * C + c) * 9;                                      \
        __VA_ARGS__                                                                       \
      }                                                                                   \
      for (long r = rows; r < mr; r++)                                                    \
        for (int e = 0; e < (E); e++)                                                     \
          u[e * es + r] = 0.0f;                                                           \
    }

static inline void polyc_winograd_strip(const float *restrict x, long C, long H, long W,
                                        long pt, long pl, long TY, long TX, long m, long r0,
                                        long r1, long c, long len, float *restrict strip)
{
  const long width = m * (TX + 1), lead = pl < width ? pl : width;
  for (long a = 0; a < m + 2; a++) {
    float *restrict s = strip + a * len;
    for (long r = r0; r < r1; r++) {
      float *restrict line = s + (r - r0) * width;
      const long n = r / TY, y = m * (r % TY) - pt + a;
      const long in = y < 0 || y >= H ? 0 : W < width - lead ? W : width - lead;
      const float *row = x + ((n * C + c) * H + y) * W;
      for (long i = 0; i < lead; i++)
        line[i] = 0.0f;
      for (long i = 0; i < in; i++)
        line[lead + i] = row[i];
      for (long i = lead + in; i < width; i++)
        line[i] = 0.0f;
    }
    for (long i = (r1 - r0) * width; i < len; i++)
      s[i] = 0.0f;
  }
}
#endif
