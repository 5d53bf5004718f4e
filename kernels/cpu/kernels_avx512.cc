// Avx512 instantiation of every CPU kernel. This file alone is compiled with the Avx512
// instruction set enabled (see BUILD); dispatch happens in attention.cc / elementwise.cc.
#include "kernels/cpu/attention_fold.h"
#include "kernels/cpu/elementwise_impl.h"
#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/simd_ops.h"

namespace strata::kernels::isa_internal {

using Ops = simd::Avx512Ops;

int AttentionFoldAvx512(const AttentionParams& p, int num_rows, const uint16_t* q,
                        const AttentionRow* rows, const void* k, const void* v, float* state,
                        bool by_head, bool widened_dots) {
  return attention_internal::Fold<Ops>(p, num_rows, q, rows, k, v, state, by_head, widened_dots);
}

void AttentionMergeStatesAvx512(const AttentionParams& p, int num_rows, const float* src,
                                float* dst) {
  attention_internal::MergeStates<Ops>(p, num_rows, src, dst);
}

void RmsNormAvx512(int rows, int dim, const float* x, const float* weight, float eps,
                   uint16_t* out) {
  elementwise_internal::RmsNorm<Ops>(rows, dim, x, weight, eps, out);
}

void SiluMulAvx512(int rows, int ffn, const float* gate_up, uint16_t* out) {
  elementwise_internal::SiluMul<Ops>(rows, ffn, gate_up, out);
}

void ApplyRopeAvx512(int rows, int num_heads, int head_dim, int64_t row_stride,
                     const int32_t* positions, const float* cos, const float* sin, float* x) {
  elementwise_internal::ApplyRope<Ops>(rows, num_heads, head_dim, row_stride, positions, cos, sin,
                                       x);
}

void ConvertToBf16Avx512(int64_t n, const float* in, uint16_t* out) {
  elementwise_internal::ConvertToBf16<Ops>(n, in, out);
}

void ConvertToF16Avx512(int64_t n, const float* in, uint16_t* out) {
  elementwise_internal::ConvertToF16<Ops>(n, in, out);
}

double ExpShiftedAvx512(int64_t n, const float* x, float shift, float scale, float* out) {
  return elementwise_internal::ExpShifted<Ops>(n, x, shift, scale, out);
}

int64_t ArgmaxAvx512(int64_t n, const float* x) { return elementwise_internal::Argmax<Ops>(n, x); }

}  // namespace strata::kernels::isa_internal
