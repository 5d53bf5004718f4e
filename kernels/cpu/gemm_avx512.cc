// The AVX-512 column-block kernel of GemmBf16. This file alone is compiled with AVX-512
// enabled (see BUILD); gemm.cc calls it only where the CPU has it (and lacks AVX-512 BF16).
// Same arithmetic as the scalar kernel (gemm_internal.h: per k-pair, the odd term's FMA
// and then the even term's, from zero), so they agree bit for bit. One 64-byte load holds a
// pair for 16 columns: shifting each 32-bit lane left by 16 gives the even weights, masking
// its low half the odd ones. One register holds a row's 16 columns, and the weights of a
// pair serve up to 12 rows.
#include <immintrin.h>

#include <array>
#include <utility>

#include "kernels/cpu/gemm_internal.h"

namespace strata::kernels::gemm_internal {
namespace {

template <int R>
void Tile(int64_t k, const float* x, const uint16_t* block, float* out) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  const int64_t pairs = (k + 1) / 2;
  for (int64_t p = 0; p < pairs; ++p) {
    const __m512i v = _mm512_loadu_si512(block + p * 32);
    const __m512 even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    const __m512 odd = _mm512_castsi512_ps(_mm512_and_si512(v, high));
    const bool last_odd = 2 * p + 1 == k;  // x[r][k] is zero
    for (int r = 0; r < R; ++r) {
      const float xo = last_odd ? 0.0f : x[r * k + 2 * p + 1];
      acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(xo), odd, acc[r]);
      acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * k + 2 * p]), even, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + r * 16, acc[r]);
}

constexpr int kTileRows = 12;

using TileFn = void (*)(int64_t, const float*, const uint16_t*, float*);

template <int... Rs>
constexpr auto MakeTiles(std::integer_sequence<int, Rs...>) {
  return std::array<TileFn, sizeof...(Rs)>{&Tile<Rs + 1>...};
}

}  // namespace

void ColumnBlockAvx512(int rows, int64_t k, const float* x, const uint16_t* block, float* out) {
  static constexpr auto kTiles = MakeTiles(std::make_integer_sequence<int, kTileRows>());
  for (int r = 0; r < rows; r += kTileRows) {
    const int n = rows - r < kTileRows ? rows - r : kTileRows;
    kTiles[n - 1](k, x + r * k, block, out + r * 16);
  }
}

}  // namespace strata::kernels::gemm_internal
