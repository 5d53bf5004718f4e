// The AVX-512 BF16 kernel of GemmBf16. This file alone is compiled with AVX-512 BF16
// enabled (see BUILD); gemm.cc calls it only where the CPU has it. vdpbf16ps adds, per f32
// lane, the odd pair's product and then the even pair's, each rounded once, as the other
// kernels' two FMAs do, so all of them agree bit for bit. x stays bf16: a row's pair is
// one 32-bit broadcast. R rows by C column blocks of accumulators (R * C <= 24) leave room
// for C weight vectors and a broadcast in the 32 registers; C blocks side by side give
// batch 1 C independent chains.
#include <immintrin.h>

#include <array>
#include <cstring>

#include "kernels/cpu/gemm_internal.h"

namespace strata::kernels::gemm_internal {
namespace {

constexpr int kTileRows = 6;

template <int R, int C>
void Tile(int64_t pairs, const uint16_t* x, int64_t x_stride, const uint16_t* group,
          int64_t block_size, float* out, int64_t out_stride) {
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh w[C];
    for (int c = 0; c < C; ++c) {
      w[c] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(group + c * block_size + p * 32));
    }
    for (int r = 0; r < R; ++r) {
      int32_t pair;
      std::memcpy(&pair, x + r * x_stride + 2 * p, sizeof(pair));
      const __m512bh xv = reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair));
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv, w[c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(out + r * out_stride + c * 16, acc[r][c]);
  }
}

using TileFn = void (*)(int64_t, const uint16_t*, int64_t, const uint16_t*, int64_t, float*,
                        int64_t);

template <int R>
constexpr std::array<TileFn, kGroupBlocks> RowTiles() {
  return {&Tile<R, 1>, &Tile<R, 2>, &Tile<R, 3>, &Tile<R, 4>};
}

constexpr std::array<std::array<TileFn, kGroupBlocks>, kTileRows> kTiles = {
    RowTiles<1>(), RowTiles<2>(), RowTiles<3>(), RowTiles<4>(), RowTiles<5>(), RowTiles<6>()};

}  // namespace

void ColumnGroupAvx512Bf16(int rows, int blocks, int64_t k, const uint16_t* x, int64_t x_stride,
                           const uint16_t* group, float* out, int64_t out_stride) {
  const int64_t pairs = (k + 1) / 2;
  for (int r = 0; r < rows; r += kTileRows) {
    const int n = rows - r < kTileRows ? rows - r : kTileRows;
    kTiles[n - 1][blocks - 1](pairs, x + r * x_stride, x_stride, group, PackedBlockSize(k),
                              out + r * out_stride, out_stride);
  }
}

}  // namespace strata::kernels::gemm_internal
