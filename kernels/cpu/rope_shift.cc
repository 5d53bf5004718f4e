#include "kernels/cpu/rope_shift.h"

#include <vector>

#include "common/base/bfloat16.h"

namespace strata::kernels {
namespace {

template <float (*kLoad)(uint16_t), uint16_t (*kStore)(float)>
void ShiftRows(int64_t rows, int num_heads, int head_dim, const float* cos, const float* sin,
               const uint16_t* in, uint16_t* out) {
  const int half = head_dim / 2;
  const int64_t row_elements = static_cast<int64_t>(num_heads) * head_dim;
#pragma omp parallel for schedule(static) if (rows * row_elements >= (1 << 16))
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<float> a(half), b(half);
    for (int h = 0; h < num_heads; ++h) {
      const int64_t base = r * row_elements + static_cast<int64_t>(h) * head_dim;
      for (int i = 0; i < half; ++i) {
        a[i] = kLoad(in[base + i]);
        b[i] = kLoad(in[base + half + i]);
      }
      for (int i = 0; i < half; ++i) {
        out[base + i] = kStore(a[i] * cos[i] - b[i] * sin[i]);
        out[base + half + i] = kStore(b[i] * cos[i] + a[i] * sin[i]);
      }
    }
  }
}

}  // namespace

void ShiftRope(int64_t rows, int num_heads, int head_dim, KvDType dtype, const float* cos,
               const float* sin, const uint16_t* in, uint16_t* out) {
  if (dtype == KvDType::kF16) {
    ShiftRows<F16ToFloat, FloatToF16>(rows, num_heads, head_dim, cos, sin, in, out);
  } else {
    ShiftRows<Bf16ToFloat, FloatToBf16>(rows, num_heads, head_dim, cos, sin, in, out);
  }
}

}  // namespace strata::kernels
