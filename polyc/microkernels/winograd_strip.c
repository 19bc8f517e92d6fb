/* polyc: the input rows Winograd's transforms read (winograd_f2x3.c, winograd_f4x3.c).
 *
 * polyc_winograd_strip(x, C, H, W, pt, pl, TY, TX, m, r0, r1, c, len, strip): for an
 * F(m x m, 3x3) tile, the m + 2 input rows of channel c under each tile row r0 .. r1 - 1
 * of x[n][C][H][W] (tile row r: image r / TY, its patches at input row m (r % TY) - pt + a,
 * a < m + 2, and columns m tx - pl), each zero-padded to m (TX + 1) floats: strip row a
 * at strip + a len, tile row r's part from (r - r0) m (TX + 1), zero from the last one's
 * end to len. A tile's patch is then m + 2 floats from m j, j = (r - r0) (TX + 1) + tx:
 * each tile row one tile more than its tiles, its pad.
 */
#ifndef POLYC_WINO_STRIP
#define POLYC_WINO_STRIP

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
