/* polyc microkernel sgemm_avx512_8x48: a register-blocked float32 matmul tile.
 *
 * Contract (mirrored as data in polyc/microkernels/registry.py):
 *   tile        MR = 8 rows x NR = 48 columns of C, any depth kc >= 1
 *   A           packed column panel, A[p * 8 + r] = a(r, p); 64-byte aligned; rows past
 *               the matrix edge are packed as zeros
 *   B           packed row panel, B[p * 48 + c] = b(p, c); 64-byte aligned; columns past
 *               the matrix edge are packed as zeros
 *   C           row-major tile C[r * ldc + c], no alignment needed; all 8 x 48 entries
 *               are written
 *   accumulate  0: C = A B (C is not read), 1: C += A B
 *   features    avx512f. 24 zmm accumulators, 3 B vectors, A broadcast from memory into
 *               each FMA: 27 of 32 zmm. The code is sgemm_avx512.c's, on this tile.
 *
 *   polyc_sgemm_avx512_8x48_rows(kc, A, B, C, ldc, accumulate, rows, cols),
 *   1 <= rows <= 8, 1 <= cols <= 48: the same on the tile's first `rows` rows and
 *   `cols` columns only (operands still packed 8 and 48 wide); other entries of C are
 *   neither read nor written (masked loads and stores). For edge tiles, straight into C.
 *
 *   polyc_sgemm_avx512_8x48_b_rows(kc, A, B, off, C, ldc, accumulate): B not packed
 *   but read in place, row p being the 48 floats at B + off[p] (any alignment, all 48
 *   readable): conv2d's window rows straight from its (padded) input, no im2col.
 *
 *   polyc_sgemm_avx512_8x48_a_rows(kc, A, lda, B, C, ldc, accumulate, rows, cols): as _rows,
 *   with A read in place, a(r, p) = A[r * lda + p] for r < rows (lda > 0).
 */
#ifndef POLYC_SGEMM_AVX512_8X48
#define POLYC_SGEMM_AVX512_8X48
POLYC_SGEMM_AVX512_KERNEL(polyc_sgemm_avx512_8x48, 8, 3)
#endif
