/* polyc microkernel winograd_f2x3: the transforms of Winograd's F(2x2, 3x3) convolution.
 *
 * A 3x3 convolution of stride 1 computes each 2x2 block of outputs (a tile) from a 4x4
 * patch of its input as Y = At [ (G g Gt) * (Bt d B) ] A, summed over the input channels:
 * the 16 products of the bracket, summed over channels, are 16 matrix products
 * M[e] = U[e] V[e] (e = 4 xi + nu), U[e] O x C from the weights, V[e] C x tiles from the
 * input. 16 multiply-adds a tile and channel pair where the direct convolution has 36.
 *
 *   Bt = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1]
 *   G  = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1]
 *   At = [1 1 1 0; 0 1 -1 -1]
 *
 * Contract (the caller is the cpu target's Winograd emitter, targets/cpu/emit/winograd.py):
 *
 *   polyc_winograd_f2x3_weights(w, O, C, mr, es, U): w[o][c][3][3] (row-major, any
 *   alignment) to U as the 16 products' A operands, each as column panels of mr rows
 *   (a gemm kernel's packed A): U[e * es + (o / mr * C + c) * mr + o % mr], rows past O
 *   zero up to O rounded up to mr (OP); es >= OP * C.
 *
 *   polyc_winograd_f2x3_input(x, C, H, W, pt, pl, TY, TX, r0, r1, c0, c1, nr, cols, es,
 *   V, strip): channels c0 .. c1 - 1 of the tiles of tile rows r0 .. r1 - 1 of x[n][c][H][W]
 *   (tile row r: image r / TY, its tiles' patches at input row 2 (r % TY) - pt and
 *   columns 2 tx - pl, zero outside the image) to V as the 16 products' B operands, row
 *   panels nr wide (a gemm kernel's packed B): tile j of the block at V[e * es + (j / nr)
 *   * C * nr + c * nr + j % nr], where j = (r - r0) (TX + 1) + tx: each tile row one tile
 *   more, its pad (winograd_common.c). `cols` (a multiple of nr, at least (r1 - r0)
 *   (TX + 1)) columns are written, zero past the tiles; es >= C * cols. `strip`:
 *   4 (2 cols + 2) floats of scratch.
 *
 *   polyc_winograd_f2x3_output(m, es, cols, y): the 2 x 2 outputs of tiles 0 .. cols - 1
 *   of one output channel from its row of the 16 products (m[e * es + j]): output row i
 *   of tile j at y[i * 2 cols + 2 j + jj], jj = 0, 1 (so tile row k's two output rows
 *   start at y + 2 k (TX + 1) and y + 2 cols + 2 k (TX + 1)).
 */
#ifndef POLYC_WINO_F2X3
#define POLYC_WINO_F2X3
/* the entry points: private to the unit they are pasted into, unless built once as a
   prebuilt part (registry.py: part_source), which defines this as hidden */
#ifndef POLYC_PART_ENTRY
#define POLYC_PART_ENTRY static
#endif

POLYC_PART_ENTRY void polyc_winograd_f2x3_weights(const float *restrict w, long O, long C, long mr,
                                              long es, float *restrict U)
{
  /* G g: its rows, then (G g) Gt: each row's columns */
  POLYC_WINOGRAD_WEIGHTS(16,
    float t[4][3];
    for (int k = 0; k < 3; k++) {
      t[0][k] = g[k];
      t[1][k] = 0.5f * (g[k] + g[3 + k] + g[6 + k]);
      t[2][k] = 0.5f * (g[k] - g[3 + k] + g[6 + k]);
      t[3][k] = g[6 + k];
    }
    for (int i = 0; i < 4; i++) {
      u[(4 * i + 0) * es + r] = t[i][0];
      u[(4 * i + 1) * es + r] = 0.5f * (t[i][0] + t[i][1] + t[i][2]);
      u[(4 * i + 2) * es + r] = 0.5f * (t[i][0] - t[i][1] + t[i][2]);
      u[(4 * i + 3) * es + r] = t[i][2];
    })
}

POLYC_PART_ENTRY void polyc_winograd_f2x3_input(const float *restrict x, long C, long H, long W,
                                            long pt, long pl, long TY, long TX, long r0, long r1,
                                            long c0, long c1, long nr, long cols, long es,
                                            float *restrict V, float *restrict strip)
{
  const long len = 2 * cols + 2;
  for (long c = c0; c < c1; c++) {
    polyc_winograd_strip(x, C, H, W, pt, pl, TY, TX, 2, r0, r1, c, len, strip);
    const float *restrict s0 = strip, *restrict s1 = strip + len;
    const float *restrict s2 = strip + 2 * len, *restrict s3 = strip + 3 * len;
    for (long q = 0; q < cols / nr; q++) {
      float *restrict v = V + q * C * nr + c * nr;
#pragma omp simd
      for (long k = 0; k < nr; k++) {
        const long i = 2 * (q * nr + k);
        /* d B: each row's column transforms */
        const float a00 = s0[i] - s0[i + 2], a01 = s0[i + 1] + s0[i + 2];
        const float a02 = s0[i + 2] - s0[i + 1], a03 = s0[i + 1] - s0[i + 3];
        const float a10 = s1[i] - s1[i + 2], a11 = s1[i + 1] + s1[i + 2];
        const float a12 = s1[i + 2] - s1[i + 1], a13 = s1[i + 1] - s1[i + 3];
        const float a20 = s2[i] - s2[i + 2], a21 = s2[i + 1] + s2[i + 2];
        const float a22 = s2[i + 2] - s2[i + 1], a23 = s2[i + 1] - s2[i + 3];
        const float a30 = s3[i] - s3[i + 2], a31 = s3[i + 1] + s3[i + 2];
        const float a32 = s3[i + 2] - s3[i + 1], a33 = s3[i + 1] - s3[i + 3];
        /* Bt (d B): the rows */
        v[0 * es + k] = a00 - a20;  v[1 * es + k] = a01 - a21;
        v[2 * es + k] = a02 - a22;  v[3 * es + k] = a03 - a23;
        v[4 * es + k] = a10 + a20;  v[5 * es + k] = a11 + a21;
        v[6 * es + k] = a12 + a22;  v[7 * es + k] = a13 + a23;
        v[8 * es + k] = a20 - a10;  v[9 * es + k] = a21 - a11;
        v[10 * es + k] = a22 - a12; v[11 * es + k] = a23 - a13;
        v[12 * es + k] = a10 - a30; v[13 * es + k] = a11 - a31;
        v[14 * es + k] = a12 - a32; v[15 * es + k] = a13 - a33;
      }
    }
  }
}

POLYC_PART_ENTRY void polyc_winograd_f2x3_output(const float *restrict m, long es, long cols,
                                             float *restrict y)
{
  float *restrict y1 = y + 2 * cols;
#pragma omp simd
  for (long j = 0; j < cols; j++) {
    const float m0 = m[j], m1 = m[es + j], m2 = m[2 * es + j], m3 = m[3 * es + j];
    const float m4 = m[4 * es + j], m5 = m[5 * es + j], m6 = m[6 * es + j], m7 = m[7 * es + j];
    const float m8 = m[8 * es + j], m9 = m[9 * es + j], m10 = m[10 * es + j];
    const float m11 = m[11 * es + j], m12 = m[12 * es + j], m13 = m[13 * es + j];
    const float m14 = m[14 * es + j], m15 = m[15 * es + j];
    /* At m: the rows, then their columns times A */
    const float t0 = m0 + m4 + m8, t1 = m1 + m5 + m9, t2 = m2 + m6 + m10, t3 = m3 + m7 + m11;
    const float u0 = m4 - m8 - m12, u1 = m5 - m9 - m13, u2 = m6 - m10 - m14, u3 = m7 - m11 - m15;
    y[2 * j] = t0 + t1 + t2;
    y[2 * j + 1] = t1 - t2 - t3;
    y1[2 * j] = u0 + u1 + u2;
    y1[2 * j + 1] = u1 - u2 - u3;
  }
}
#endif
