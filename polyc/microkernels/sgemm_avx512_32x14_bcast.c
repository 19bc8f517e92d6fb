/* polyc microkernel sgemm_avx512_32x14_bcast: the window kernel (sgemm_avx512_window.c)
 * with each pixel broadcast into a register once for its two FMAs: a 16-instruction
 * longer K step, where each folded broadcast costs Zen 5 more (1152 deep in cache: 247
 * GFLOP/s against 222; 8x256x14x14 3x3, 1 thread: 1.08x torch's speed against
 * 0.95x). The calibration times both; the plan takes the faster (`plan.window_kernel`).
 *
 * Contract (mirrored as data in polyc/microkernels/registry.py):
 *   tile        MR = 32 rows x NR = 14 columns of C, any depth kc >= 1
 *   A           packed column panel, A[p * 32 + r] = a(r, p); 64-byte aligned; rows past
 *               the matrix edge are packed as zeros
 *   B           packed row panel, B[p * 14 + c] = b(p, c), any alignment; columns past
 *               the matrix edge are packed as zeros
 *   C           row-major tile C[r * ldc + c], no alignment needed; all 32 x 14 entries
 *               are written
 *   accumulate  0: C = A B (C is not read), 1: C += A B
 *   features    avx512f, avx512vl (C's rows stored 4 floats at a time). 28 zmm
 *               accumulators, 2 A vectors, B's value in 1: 31 of 32 zmm.
 *
 *   polyc_sgemm_avx512_32x14_bcast_rows(kc, A, B, C, ldc, accumulate, rows, cols),
 *   polyc_sgemm_avx512_32x14_bcast_b_rows(kc, A, B, off, C, ldc, accumulate) and
 *   polyc_sgemm_avx512_32x14_bcast_b_taps9(kc, A, B, off, plane, step, C, ldc, accumulate, cols):
 *   as sgemm_avx512_window.c says, whose code this is; the weights are A (the vectors),
 *   the window's pixels B (broadcast), read in place from the padded input.
 */
#ifndef POLYC_SGEMM_AVX512_32X14_BCAST
#define POLYC_SGEMM_AVX512_32X14_BCAST
POLYC_SGEMM_AVX512_WINDOW_KERNEL(polyc_sgemm_avx512_32x14_bcast, 0)
#endif
