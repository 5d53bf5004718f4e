// The AVX-512 column-block kernel of GemmBf16. This file alone is compiled with AVX-512
// enabled (see BUILD); gemm.cc calls it only where the CPU has it. Same arithmetic as the
// AVX2 and scalar kernels (one FMA per term, k ascending, from zero), so the three agree
// bit for bit; one register holds a row's 16 columns, and a weight vector loaded once
// serves up to 12 rows.
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
  for (int64_t kk = 0; kk < k; ++kk) {
    const __m512 w = _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + kk * 16))),
        16));
    for (int r = 0; r < R; ++r) {
      acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * k + kk]), w, acc[r]);
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
