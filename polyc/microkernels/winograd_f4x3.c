/* polyc microkernel winograd_f4x3: the transforms of Winograd's F(4x4, 3x3) convolution.
 *
 * As winograd_f2x3.c, for 4x4 tiles of outputs from 6x6 patches: Y = At [ (G g Gt) *
 * (Bt d B) ] A summed over the input channels, the 36 products of the bracket
 * M[e] = U[e] V[e] (e = 6 xi + nu): 36 multiply-adds a tile and channel pair where the
 * direct convolution has 144 (F(2x2, 3x3): 16 to 36). The price is rounding: its
 * transforms scale by up to 8 and 16/15. They interpolate at 0, 1, -1, 1/2, -2 and
 * infinity: the usual set's 2 replaced by 1/2 (the usual Bt has 4s and 5s and its G
 * 1/24; Barabasz et al., "Error analysis and improving the accuracy of Winograd
 * convolution for deep neural networks"): float32, 256 channels of uniform inputs,
 * 3.7e-6 off where the usual points were 1.1e-5 and F(2x2, 3x3) 5e-7.
 *
 *   Bt = [1 -3/2 -2 3/2 1 0; 0 -1 1/2 5/2 1 0; 0 1 -5/2 1/2 1 0; 0 -2 -1 2 1 0;
 *         0 1/2 -1 -1/2 1 0; 0 1 -3/2 -2 3/2 1]
 *   G  = [1 0 0; 1/3 1/3 1/3; -1/3 1/3 -1/3; -16/15 -8/15 -4/15; 1/15 -2/15 4/15; 0 0 1]
 *   At = [1 1 1 1 1 0; 0 1 -1 1/2 -2 0; 0 1 1 1/4 4 0; 0 1 -1 1/8 -8 1]
 *
 * Contract: winograd_f2x3.c's, with 36 operands for 16 and 4 for 2: the weights' U
 * (36 A operands), the input's V (36 B operands; tile j's patch 6 floats from 4 j of
 * its strip rows, `strip` 6 (4 cols + 2) floats), and the output's 4 x 4 outputs a tile:
 * output row i of tile j at y[i * 4 cols + 4 j + jj], jj < 4.
 */
#ifndef POLYC_WINO_F4X3
#define POLYC_WINO_F4X3
#ifndef POLYC_PART_ENTRY
#define POLYC_PART_ENTRY static
#endif

/* The 1-D transforms, on named scalars (t##0 .. t##5 or t##3): arrays indexed through a
   helper kept gcc from vectorizing the loops over tiles */
/* t = G g for three values g (a column or row of the window) */
#define POLYC_WINO4_G(t, g0, g1, g2)                                                      \
  const float t##s = (g0) + (g2);                                                         \
  const float t##0 = (g0), t##1 = (t##s + (g1)) * (1.0f / 3);                             \
  const float t##2 = ((g1) - t##s) * (1.0f / 3);                                          \
  const float t##3 = -(16.0f * (g0) + 8.0f * (g1) + 4.0f * (g2)) * (1.0f / 15);           \
  const float t##4 = ((g0) - 2.0f * (g1) + 4.0f * (g2)) * (1.0f / 15), t##5 = (g2)
/* t = Bt d for six values d */
#define POLYC_WINO4_BT(t, d0, d1, d2, d3, d4, d5)                                         \
  const float t##0 = (d0) - 1.5f * (d1) - 2.0f * (d2) + 1.5f * (d3) + (d4);               \
  const float t##1 = (d4) - (d1) + 0.5f * (d2) + 2.5f * (d3);                             \
  const float t##2 = (d4) + (d1) - 2.5f * (d2) + 0.5f * (d3);                             \
  const float t##3 = (d4) - (d2) + 2.0f * ((d3) - (d1));                                  \
  const float t##4 = (d4) - (d2) + 0.5f * ((d1) - (d3));                                  \
  const float t##5 = (d5) + (d1) - 1.5f * (d2) - 2.0f * (d3) + 1.5f * (d4)
/* t = At m for six values m */
#define POLYC_WINO4_AT(t, m0, m1, m2, m3, m4, m5)                                         \
  const float t##p = (m1) + (m2), t##d = (m1) - (m2);                                     \
  const float t##0 = (m0) + t##p + (m3) + (m4), t##1 = t##d + 0.5f * (m3) - 2.0f * (m4);  \
  const float t##2 = t##p + 0.25f * (m3) + 4.0f * (m4);                                   \
  const float t##3 = t##d + 0.125f * (m3) - 8.0f * (m4) + (m5)
/* six values t##0 .. t##5 to p[0], p[step], ..., p[5 step] */
#define POLYC_WINO4_PUT6(p, step, t)                                                      \
  (p)[0] = t##0; (p)[step] = t##1; (p)[2 * (step)] = t##2; (p)[3 * (step)] = t##3;       \
  (p)[4 * (step)] = t##4; (p)[5 * (step)] = t##5
#define POLYC_WINO4_LANES 16  /* tiles a pass of the input transform */
#define POLYC_WINO4_PUT4(p, t) (p)[0] = t##0; (p)[1] = t##1; (p)[2] = t##2; (p)[3] = t##3

POLYC_PART_ENTRY void polyc_winograd_f4x3_weights(const float *restrict w, long O, long C,
                                                  long mr, long es, float *restrict U)
{
  /* G g: each column of the window; then (G g) Gt: each row of that */
  POLYC_WINOGRAD_WEIGHTS(36,
    POLYC_WINO4_G(k0, g[0], g[3], g[6]);
    POLYC_WINO4_G(k1, g[1], g[4], g[7]);
    POLYC_WINO4_G(k2, g[2], g[5], g[8]);
    POLYC_WINO4_G(u0, k00, k10, k20);
    POLYC_WINO4_G(u1, k01, k11, k21);
    POLYC_WINO4_G(u2, k02, k12, k22);
    POLYC_WINO4_G(u3, k03, k13, k23);
    POLYC_WINO4_G(u4, k04, k14, k24);
    POLYC_WINO4_G(u5, k05, k15, k25);
    POLYC_WINO4_PUT6(u + r, es, u0);
    POLYC_WINO4_PUT6(u + 6 * es + r, es, u1);
    POLYC_WINO4_PUT6(u + 12 * es + r, es, u2);
    POLYC_WINO4_PUT6(u + 18 * es + r, es, u3);
    POLYC_WINO4_PUT6(u + 24 * es + r, es, u4);
    POLYC_WINO4_PUT6(u + 30 * es + r, es, u5);)
}

/* Tiles 0 .. n - 1 (n <= POLYC_WINO4_LANES) of strip rows s, s + len, ... to their 36
   operands v, v + es, ...: in two passes through t (the 36 values of one pass in
   registers had gcc spill most of them) */
static inline void polyc_wino4_input_tiles(const float *restrict s, long len, long n, long es,
                                           float *restrict v)
{
  float t[36][POLYC_WINO4_LANES];
  /* d B: each row's columns (Bt of the row): row a's at t[6 a + nu] */
  for (long a = 0; a < 6; a++) {
    const float *restrict row = s + a * len;
#pragma omp simd
    for (long k = 0; k < n; k++) {
      POLYC_WINO4_BT(r, row[4 * k], row[4 * k + 1], row[4 * k + 2], row[4 * k + 3],
                     row[4 * k + 4], row[4 * k + 5]);
      t[6 * a][k] = r0; t[6 * a + 1][k] = r1; t[6 * a + 2][k] = r2;
      t[6 * a + 3][k] = r3; t[6 * a + 4][k] = r4; t[6 * a + 5][k] = r5;
    }
  }
  /* Bt (d B): each column's rows, element (xi, nu) to operand 6 xi + nu */
  for (long nu = 0; nu < 6; nu++) {
#pragma omp simd
    for (long k = 0; k < n; k++) {
      POLYC_WINO4_BT(b, t[nu][k], t[6 + nu][k], t[12 + nu][k], t[18 + nu][k], t[24 + nu][k],
                     t[30 + nu][k]);
      POLYC_WINO4_PUT6(v + nu * es + k, 6 * es, b);
    }
  }
}

POLYC_PART_ENTRY void polyc_winograd_f4x3_input(const float *restrict x, long C, long H, long W,
                                                long pt, long pl, long TY, long TX, long r0,
                                                long r1, long c0, long c1, long nr, long cols,
                                                long es, float *restrict V,
                                                float *restrict strip)
{
  const long len = 4 * cols + 2;
  for (long c = c0; c < c1; c++) {
    polyc_winograd_strip(x, C, H, W, pt, pl, TY, TX, 4, r0, r1, c, len, strip);
    for (long q = 0; q < cols / nr; q++)
      for (long k0 = 0; k0 < nr; k0 += POLYC_WINO4_LANES) {
        const float *restrict s = strip + 4 * (q * nr + k0);
        float *restrict v = V + q * C * nr + c * nr + k0;
        if (nr % POLYC_WINO4_LANES == 0)  /* a count gcc knows: whole vectors */
          polyc_wino4_input_tiles(s, len, POLYC_WINO4_LANES, es, v);
        else
          polyc_wino4_input_tiles(s, len, nr - k0 < POLYC_WINO4_LANES ? nr - k0
                                                                       : POLYC_WINO4_LANES, es, v);
      }
  }
}

POLYC_PART_ENTRY void polyc_winograd_f4x3_output(const float *restrict m, long es, long cols,
                                                 float *restrict y)
{
  const long row = 4 * cols;
#pragma omp simd
  for (long j = 0; j < cols; j++) {
    const float *restrict p = m + j;
#define POLYC_WINO4_M(xi, nu) p[(6 * (xi) + (nu)) * es]
    /* At m: each column's rows (c<nu><i> is (At m)'s element (i, nu)); then (At m) A:
       each row's columns */
#define POLYC_WINO4_COLUMN(t, nu)                                                         \
  POLYC_WINO4_AT(t, POLYC_WINO4_M(0, nu), POLYC_WINO4_M(1, nu), POLYC_WINO4_M(2, nu),     \
                 POLYC_WINO4_M(3, nu), POLYC_WINO4_M(4, nu), POLYC_WINO4_M(5, nu))
    POLYC_WINO4_COLUMN(c0, 0);
    POLYC_WINO4_COLUMN(c1, 1);
    POLYC_WINO4_COLUMN(c2, 2);
    POLYC_WINO4_COLUMN(c3, 3);
    POLYC_WINO4_COLUMN(c4, 4);
    POLYC_WINO4_COLUMN(c5, 5);
    POLYC_WINO4_AT(o0, c00, c10, c20, c30, c40, c50);
    POLYC_WINO4_AT(o1, c01, c11, c21, c31, c41, c51);
    POLYC_WINO4_AT(o2, c02, c12, c22, c32, c42, c52);
    POLYC_WINO4_AT(o3, c03, c13, c23, c33, c43, c53);
#undef POLYC_WINO4_COLUMN
#undef POLYC_WINO4_M
    POLYC_WINO4_PUT4(y + 4 * j, o0);
    POLYC_WINO4_PUT4(y + row + 4 * j, o1);
    POLYC_WINO4_PUT4(y + 2 * row + 4 * j, o2);
    POLYC_WINO4_PUT4(y + 3 * row + 4 * j, o3);
  }
}
#endif
