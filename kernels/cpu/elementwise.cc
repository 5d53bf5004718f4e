#include "kernels/cpu/elementwise.h"

#include "kernels/cpu/elementwise_impl.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/isa_kernels.h"

namespace strata::kernels {
namespace isa_internal {

void RmsNormScalar(int rows, int dim, const float* x, const float* weight, float eps,
                   uint16_t* out) {
  elementwise_internal::RmsNorm<simd::ScalarOps>(rows, dim, x, weight, eps, out);
}

void SiluMulScalar(int rows, int ffn, const float* gate_up, uint16_t* out) {
  elementwise_internal::SiluMul<simd::ScalarOps>(rows, ffn, gate_up, out);
}

void ApplyRopeScalar(int rows, int num_heads, int head_dim, int64_t row_stride,
                     const int32_t* positions, const float* cos, const float* sin, float* x) {
  elementwise_internal::ApplyRope<simd::ScalarOps>(rows, num_heads, head_dim, row_stride, positions,
                                                   cos, sin, x);
}

void ConvertToBf16Scalar(int64_t n, const float* in, uint16_t* out) {
  elementwise_internal::ConvertToBf16<simd::ScalarOps>(n, in, out);
}

void ConvertToF16Scalar(int64_t n, const float* in, uint16_t* out) {
  elementwise_internal::ConvertToF16<simd::ScalarOps>(n, in, out);
}

double ExpShiftedScalar(int64_t n, const float* x, float shift, float scale, float* out) {
  return elementwise_internal::ExpShifted<simd::ScalarOps>(n, x, shift, scale, out);
}

int64_t ArgmaxScalar(int64_t n, const float* x) {
  return elementwise_internal::Argmax<simd::ScalarOps>(n, x);
}

}  // namespace isa_internal

using namespace isa_internal;

#define STRATA_DISPATCH(fn, ...)          \
  switch (ActiveCpuIsa()) {               \
    case CpuIsa::kAvx512Bf16:             \
      return fn##Avx512Bf16(__VA_ARGS__); \
    case CpuIsa::kAvx512:                 \
      return fn##Avx512(__VA_ARGS__);     \
    case CpuIsa::kAvx2:                   \
      return fn##Avx2(__VA_ARGS__);       \
    case CpuIsa::kScalar:                 \
      return fn##Scalar(__VA_ARGS__);     \
  }

void RmsNorm(int rows, int dim, const float* x, const float* weight, float eps, uint16_t* out) {
  STRATA_DISPATCH(RmsNorm, rows, dim, x, weight, eps, out);
}

void SiluMul(int rows, int ffn, const float* gate_up, uint16_t* out) {
  STRATA_DISPATCH(SiluMul, rows, ffn, gate_up, out);
}

void ApplyRope(int rows, int num_heads, int head_dim, int64_t row_stride, const int32_t* positions,
               const float* cos, const float* sin, float* x) {
  STRATA_DISPATCH(ApplyRope, rows, num_heads, head_dim, row_stride, positions, cos, sin, x);
}

void ConvertToBf16(int64_t n, const float* in, uint16_t* out) {
  STRATA_DISPATCH(ConvertToBf16, n, in, out);
}

void ConvertToF16(int64_t n, const float* in, uint16_t* out) {
  STRATA_DISPATCH(ConvertToF16, n, in, out);
}

double ExpShifted(int64_t n, const float* x, float shift, float scale, float* out) {
  STRATA_DISPATCH(ExpShifted, n, x, shift, scale, out);
  return 0.0;
}

int64_t Argmax(int64_t n, const float* x) {
  STRATA_DISPATCH(Argmax, n, x);
  return 0;
}

#undef STRATA_DISPATCH

}  // namespace strata::kernels
