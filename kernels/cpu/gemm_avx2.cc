// The AVX2 + FMA column-block kernel of GemmBf16. This file alone is compiled with AVX2
// enabled (see BUILD); gemm.cc calls it only where the CPU has it.
#include <immintrin.h>

#include "kernels/cpu/gemm_internal.h"

namespace strata::kernels::gemm_internal {
namespace {

// R rows by 16 columns: 2R accumulators, 2 weight vectors and a broadcast fit AVX2's 16
// registers for R <= 6.
template <int R>
void Tile(int64_t k, const float* x, const uint16_t* block, float* out) {
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t kk = 0; kk < k; ++kk) {
    const uint16_t* w = block + kk * 16;
    const __m256 w0 = _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w))), 16));
    const __m256 w1 = _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 8))), 16));
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_broadcast_ss(x + r * k + kk);
      acc[r][0] = _mm256_fmadd_ps(xv, w0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(xv, w1, acc[r][1]);
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
  for (; r + 6 <= rows; r += 6) Tile<6>(k, x + r * k, block, out + r * 16);
  switch (rows - r) {
    case 5:
      Tile<5>(k, x + r * k, block, out + r * 16);
      break;
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
