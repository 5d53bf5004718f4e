// The per-ISA column-block kernels behind GemmBf16 (gemm.h). Private to kernels/cpu.
#ifndef STRATA_KERNELS_CPU_GEMM_INTERNAL_H_
#define STRATA_KERNELS_CPU_GEMM_INTERNAL_H_

#include <cstdint>

namespace strata::kernels::gemm_internal {

// Rows [0, rows) of x (f32, row stride k) against one packed column block (k x 16 bf16):
// out[r][j] = sum over kk ascending of fma(x[r][kk], w[kk][j], .), from zero.
// out has rows of 16 floats.
void ColumnBlockScalar(int rows, int64_t k, const float* x, const uint16_t* block, float* out);
void ColumnBlockAvx2(int rows, int64_t k, const float* x, const uint16_t* block, float* out);
void ColumnBlockAvx512(int rows, int64_t k, const float* x, const uint16_t* block, float* out);

}  // namespace strata::kernels::gemm_internal

#endif  // STRATA_KERNELS_CPU_GEMM_INTERNAL_H_
