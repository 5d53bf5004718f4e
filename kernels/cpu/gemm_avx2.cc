// The AVX2 + FMA column-block kernel of GemmBf16. This file alone is compiled with AVX2
// enabled (see BUILD); gemm.cc calls it only where the CPU has it. Same arithmetic as the
// scalar kernel (gemm_internal.h), bit for bit.
#include <immintrin.h>

#include "kernels/cpu/gemm_internal.h"

namespace strata::kernels::gemm_internal {
namespace {

// R rows by 16 columns: 2R accumulators, 4 weight vectors and a broadcast fit AVX2's 16
// registers for R <= 5.
template <int R>
void Tile(int64_t k, const float* x, const uint16_t* block, float* out) {
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  const int64_t pairs = (k + 1) / 2;
  for (int64_t p = 0; p < pairs; ++p) {
    // Columns 0-7 and 8-15 of the pair: each 32-bit lane holds (even, odd) weights.
    const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + p * 32));
    const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + p * 32 + 16));
    const __m256 even0 = _mm256_castsi256_ps(_mm256_slli_epi32(v0, 16));
    const __m256 even1 = _mm256_castsi256_ps(_mm256_slli_epi32(v1, 16));
    const __m256 odd0 = _mm256_castsi256_ps(_mm256_and_si256(v0, high));
    const __m256 odd1 = _mm256_castsi256_ps(_mm256_and_si256(v1, high));
    const bool last_odd = 2 * p + 1 == k;  // x[r][k] is zero
    for (int r = 0; r < R; ++r) {
      const __m256 xo = _mm256_set1_ps(last_odd ? 0.0f : x[r * k + 2 * p + 1]);
      acc[r][0] = _mm256_fmadd_ps(xo, odd0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(xo, odd1, acc[r][1]);
      const __m256 xe = _mm256_broadcast_ss(x + r * k + 2 * p);
      acc[r][0] = _mm256_fmadd_ps(xe, even0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(xe, even1, acc[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(out + r * 16, acc[r][0]);
    _mm256_storeu_ps(out + r * 16 + 8, acc[r][1]);
  }
}

}  // namespace

void ColumnBlockAvx2(int rows, int64_t k, const float* x, const uint16_t* block, float* out) {
  int r = 0;
  for (; r + 5 <= rows; r += 5) Tile<5>(k, x + r * k, block, out + r * 16);
  switch (rows - r) {
    case 4:
      Tile<4>(k, x + r * k, block, out + r * 16);
      break;
    case 3:
      Tile<3>(k, x + r * k, block, out + r * 16);
      break;
    case 2:
      Tile<2>(k, x + r * k, block, out + r * 16);
      break;
    case 1:
      Tile<1>(k, x + r * k, block, out + r * 16);
      break;
    default:
      break;
  }
}

}  // namespace strata::kernels::gemm_internal
