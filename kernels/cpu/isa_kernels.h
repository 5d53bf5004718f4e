// Per-ISA entry points of the CPU kernels (attention and elementwise). Private to
// kernels/cpu: callers use attention.h and elementwise.h, which dispatch on isa.h.
#ifndef STRATA_KERNELS_CPU_ISA_KERNELS_H_
#define STRATA_KERNELS_CPU_ISA_KERNELS_H_

#include <cstdint>

#include "kernels/cpu/attention.h"

namespace strata::kernels::isa_internal {

#define STRATA_DECLARE_CPU_KERNELS(suffix)                                                        \
  int AttentionFold##suffix(const AttentionParams& p, int num_rows, const uint16_t* q,            \
                            const AttentionRow* rows, const void* k, const void* v, float* state, \
                            bool by_head, bool widened_dots);                                     \
  void AttentionMergeStates##suffix(const AttentionParams& p, int num_rows, const float* src,     \
                                    float* dst);                                                  \
  void RmsNorm##suffix(int rows, int dim, const float* x, const float* weight, float eps,         \
                       uint16_t* out);                                                            \
  void SiluMul##suffix(int rows, int ffn, const float* gate_up, uint16_t* out);                   \
  void ApplyRope##suffix(int rows, int num_heads, int head_dim, int64_t row_stride,               \
                         const int32_t* positions, const float* cos, const float* sin, float* x); \
  void ConvertToBf16##suffix(int64_t n, const float* in, uint16_t* out);                          \
  void ConvertToF16##suffix(int64_t n, const float* in, uint16_t* out);                           \
  double ExpShifted##suffix(int64_t n, const float* x, float shift, float scale, float* out);     \
  int64_t Argmax##suffix(int64_t n, const float* x);

STRATA_DECLARE_CPU_KERNELS(Scalar)
STRATA_DECLARE_CPU_KERNELS(Avx2)
STRATA_DECLARE_CPU_KERNELS(Avx512)
STRATA_DECLARE_CPU_KERNELS(Avx512Bf16)

#undef STRATA_DECLARE_CPU_KERNELS

}  // namespace strata::kernels::isa_internal

#endif  // STRATA_KERNELS_CPU_ISA_KERNELS_H_
