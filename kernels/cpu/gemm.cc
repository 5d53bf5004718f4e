#include "kernels/cpu/gemm.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/base/bfloat16.h"
#include "kernels/cpu/gemm_internal.h"
#include "kernels/cpu/isa.h"

namespace strata::kernels {
namespace gemm_internal {

void ColumnBlockScalar(int rows, int64_t k, const float* x, const uint16_t* block, float* out) {
  for (int r = 0; r < rows; ++r) {
    float acc[16] = {};
    for (int64_t kk = 0; kk < k; ++kk) {
      const float xv = x[r * k + kk];
      for (int j = 0; j < 16; ++j) acc[j] = std::fmaf(xv, Bf16ToFloat(block[kk * 16 + j]), acc[j]);
    }
    std::memcpy(out + r * 16, acc, sizeof(acc));
  }
}

}  // namespace gemm_internal

namespace {

// Rows per pass: their f32 copy (rows x k) stays in cache while every column block of the
// weight streams past it once.
constexpr int64_t kRowBlock = 48;

}  // namespace

int64_t PackedGemmWeightSize(int64_t n, int64_t k) {
  return (n + kGemmColumnBlock - 1) / kGemmColumnBlock * kGemmColumnBlock * k;
}

void PackGemmWeight(const uint16_t* w, int64_t n, int64_t k, uint16_t* packed) {
  const int64_t blocks = (n + kGemmColumnBlock - 1) / kGemmColumnBlock;
  for (int64_t b = 0; b < blocks; ++b) {
    uint16_t* out = packed + b * k * kGemmColumnBlock;
    for (int64_t kk = 0; kk < k; ++kk) {
      for (int64_t j = 0; j < kGemmColumnBlock; ++j) {
        const int64_t col = b * kGemmColumnBlock + j;
        out[kk * kGemmColumnBlock + j] = col < n ? w[col * k + kk] : 0;
      }
    }
  }
}

void GemmBf16(int64_t m, int64_t n, int64_t k, const uint16_t* x, const uint16_t* packed,
              const float* bias, bool accumulate, float* y) {
  const bool avx2 = ActiveCpuIsa() >= CpuIsa::kAvx2;
  const bool avx512 = ActiveCpuIsa() >= CpuIsa::kAvx512;
  const int64_t blocks = (n + kGemmColumnBlock - 1) / kGemmColumnBlock;
  thread_local std::vector<float> xf;
  for (int64_t r0 = 0; r0 < m; r0 += kRowBlock) {
    const int rows = static_cast<int>(std::min(kRowBlock, m - r0));
    xf.resize(static_cast<size_t>(rows) * k);
    for (int64_t i = 0; i < rows * k; ++i) xf[i] = Bf16ToFloat(x[r0 * k + i]);
    const float* xr = xf.data();
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      EnableFlushToZero();
      float out[kRowBlock * kGemmColumnBlock];
      const uint16_t* block = packed + b * k * kGemmColumnBlock;
      if (avx512) {
        gemm_internal::ColumnBlockAvx512(rows, k, xr, block, out);
      } else if (avx2) {
        gemm_internal::ColumnBlockAvx2(rows, k, xr, block, out);
      } else {
        gemm_internal::ColumnBlockScalar(rows, k, xr, block, out);
      }
      const int64_t c0 = b * kGemmColumnBlock;
      const int64_t cols = std::min(kGemmColumnBlock, n - c0);
      for (int r = 0; r < rows; ++r) {
        float* dst = y + (r0 + r) * n + c0;
        const float* acc = out + r * kGemmColumnBlock;
        for (int64_t j = 0; j < cols; ++j) {
          float v = acc[j];
          if (bias != nullptr) v += bias[c0 + j];
          if (accumulate) v += dst[j];
          dst[j] = v;
        }
      }
    }
  }
}

}  // namespace strata::kernels
