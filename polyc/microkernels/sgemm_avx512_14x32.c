/* polyc microkernel sgemm_avx512_14x32: a register-blocked float32 matmul tile.
 *
 * Contract (mirrored as data in polyc/microkernels/registry.py):
 *   tile        MR = 14 rows x NR = 32 columns of C, any depth kc >= 1
 *   A           packed column panel, A[p * 14 + r] = a(r, p); 64-byte aligned; rows past
 *               the matrix edge are packed as zeros
 *   B           packed row panel, B[p * 32 + c] = b(p, c); 64-byte aligned; columns past
 *               the matrix edge are packed as zeros
 *   C           row-major tile C[r * ldc + c], no alignment needed; all 14 x 32 entries
 *               are written
 *   accumulate  0: C = A B (C is not read), 1: C += A B
 *   features    avx512f. 28 zmm accumulators, 2 B vectors, A broadcast from memory into
 *               each FMA: 30 of 32 zmm. The code is sgemm_avx512.c's, on this tile.
 *
 *   polyc_sgemm_avx512_14x32_rows(kc, A, B, C, ldc, accumulate, rows, cols),
 *   1 <= rows <= 14, 1 <= cols <= 32: the same on the tile's first `rows` rows and
 *   `cols` columns only (operands still packed 14 and 32 wide); other entries of C are
 *   neither read nor written (masked loads and stores). For edge tiles, straight into C.
 *
 *   polyc_sgemm_avx512_14x32_b_rows(kc, A, B, off, C, ldc, accumulate): B not packed
 *   but read in place, row p being the 32 floats at B + off[p] (any alignment, all 32
 *   readable): conv2d's window rows straight from its (padded) input, no im2col.
 *
 *   polyc_sgemm_avx512_14x32_a_rows(kc, A, lda, B, C, ldc, accumulate, rows, cols): as _rows,
 *   with A read in place, a(r, p) = A[r * lda + p] for r < rows (lda > 0).
 */
#ifndef POLYC_SGEMM_AVX512_14X32
#define POLYC_SGEMM_AVX512_14X32
POLYC_SGEMM_AVX512_KERNEL(polyc_sgemm_avx512_14x32, 14, 2)
#endif
