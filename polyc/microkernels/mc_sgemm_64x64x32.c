/* polyc microkernel mc_sgemm_64x64x32: the many-core chip's fixed-shape float32 tile.
 *
 * Contract (mirrored as data in polyc/microkernels/registry.py):
 *   tile        C[64][64] += A[64][32] B[32][64]: 64 rows, 64 columns, depth 32, always
 *               whole (the caller pads operands with zeros at the matrix edge)
 *   A, B, C     row-major in this compute core's LDM, `lda`, `ldb`, `ldc` floats a row
 *               (lda >= 32, ldb >= 64, ldc >= 64); each operand must lie inside one LDM
 *               buffer the core allocated, else the run records an error naming the
 *               kernel, the operand and the buffer, and nothing is computed
 *   accumulate  always (C += A B)
 *   cost        16,384 cycles and 262,144 flops (DESIGN.md's cycle model: 16 fp32 FLOP
 *               per cycle); the host computes it in plain C, the model times it
 *   features    sw_cpe (the simulated compute core; runtime: polyc_manycore.h)
 */
#ifndef POLYC_MC_SGEMM_64X64X32
#define POLYC_MC_SGEMM_64X64X32

static inline void polyc_mc_sgemm_64x64x32(polyc_mc_core *core, const float *a, long lda,
                                           const float *b, long ldb, float *c, long ldc)
{
  static const char *const names[3] = {"A", "B", "C"};
  const void *operand[3] = {a, b, c};
  const size_t bytes[3] = {(63 * lda + 32) * sizeof(float), (31 * ldb + 64) * sizeof(float),
                           (63 * ldc + 64) * sizeof(float)};
  for (int k = 0; k < 3; k++) {
    const polyc_mc_buffer *near = NULL;
    if (!polyc_mc__buffer(core, operand[k], bytes[k], &near)) {
      if (near)
        polyc_sim_fail(&core->error, "kernel %s: core %d: sgemm_64x64x32: operand %s of %zu bytes "
                       "at byte %zu of LDM buffer %s runs past its %zu bytes",
                       core->kernel, core->id, names[k], bytes[k],
                       (size_t)((const char *)operand[k] - near->base), near->name, near->bytes);
      else
        polyc_sim_fail(&core->error, "kernel %s: core %d: sgemm_64x64x32: operand %s of %zu bytes "
                       "is in no LDM buffer of this core",
                       core->kernel, core->id, names[k], bytes[k]);
      return;
    }
  }
  for (int i = 0; i < 64; i++)
    for (int p = 0; p < 32; p++) {
      float aip = a[i * lda + p];
      for (int j = 0; j < 64; j++)
        c[i * ldc + j] += aip * b[p * ldb + j];
    }
  core->clock += POLYC_MC_SGEMM_CYCLES;
  core->flops += POLYC_MC_SGEMM_FLOPS;
}
#endif
