// The AVX-512 BF16 kernel of GemmBf16. This file alone is compiled with AVX-512 BF16
// enabled (see BUILD); gemm.cc calls it only where the CPU has it. vdpbf16ps adds, per f32
// lane, the odd pair's product and then the even pair's, each rounded once, as the other
// kernels' two FMAs do, so all of them agree bit for bit. x stays bf16: a row's pair is
// one 32-bit broadcast. R rows by C column blocks of accumulators (R * C <= 24) leave room
// for C weight vectors and a broadcast in the 32 registers; C blocks side by side give
// batch 1 C independent chains.
//
// Every row tile after the first reads the group from L2, where the first tile brought it,
// and leaves DRAM idle; those tiles prefetch a share of the next group into L2 instead, so
// that its first tile does not wait on DRAM either.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "kernels/cpu/gemm_internal.h"

namespace strata::kernels::gemm_internal {
namespace {

constexpr int kTileRows = 6;

constexpr int64_t kLine = 64;
constexpr int kPrefetchTiles = 3;

// Lines [0, lines) from `begin`, spread over the tile's `pairs` steps.
struct Prefetch {
  const char* begin = nullptr;
  int64_t lines = 0;
  int per_step = 0;  // lines per step: ceil(lines / pairs)
};

template <int R, int C, bool kPrefetch>
void Tile(int64_t pairs, const uint16_t* x, int64_t x_stride, const uint16_t* group,
          int64_t block_size, float* out, int64_t out_stride, Prefetch pf) {
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  for (int64_t p = 0; p < pairs; ++p) {
    if constexpr (kPrefetch) {
      for (int i = 0; i < pf.per_step; ++i) {
        const int64_t line = p * pf.per_step + i;
        if (line < pf.lines) _mm_prefetch(pf.begin + line * kLine, _MM_HINT_T1);
      }
    }
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
                        int64_t, Prefetch);

template <int R, bool kPrefetch>
constexpr std::array<TileFn, kGroupBlocks> RowTiles() {
  return {&Tile<R, 1, kPrefetch>, &Tile<R, 2, kPrefetch>, &Tile<R, 3, kPrefetch>,
          &Tile<R, 4, kPrefetch>};
}

template <bool kPrefetch>
constexpr std::array<std::array<TileFn, kGroupBlocks>, kTileRows> Tiles() {
  return {RowTiles<1, kPrefetch>(), RowTiles<2, kPrefetch>(), RowTiles<3, kPrefetch>(),
          RowTiles<4, kPrefetch>(), RowTiles<5, kPrefetch>(), RowTiles<6, kPrefetch>()};
}

// [prefetching][rows - 1][blocks - 1]
constexpr std::array<std::array<std::array<TileFn, kGroupBlocks>, kTileRows>, 2> kTiles = {
    Tiles<false>(), Tiles<true>()};

}  // namespace

void ColumnGroupAvx512Bf16(int rows, int blocks, int64_t k, const uint16_t* x, int64_t x_stride,
                           const uint16_t* group, float* out, int64_t out_stride,
                           const uint16_t* next, int64_t next_elements) {
  const int64_t pairs = (k + 1) / 2;
  const int tiles = (rows + kTileRows - 1) / kTileRows;
  // Tiles 1 .. tiles-1 each prefetch an equal share of the next group's lines. With fewer
  // than kPrefetchTiles tiles the GEMM is near the read bound, the hardware prefetcher
  // keeps up, and the extra prefetches only crowd the tiles that stream (8 rows: 0.85x).
  const int64_t next_lines =
      next != nullptr && tiles >= kPrefetchTiles ? (next_elements * 2 + kLine - 1) / kLine : 0;
  const int64_t share = tiles > 1 ? (next_lines + tiles - 2) / (tiles - 1) : 0;
  for (int t = 0; t < tiles; ++t) {
    const int r = t * kTileRows;
    const int n = rows - r < kTileRows ? rows - r : kTileRows;
    Prefetch pf;
    if (t > 0 && share > 0) {
      const int64_t first = (t - 1) * share;
      pf.begin = reinterpret_cast<const char*>(next) + first * kLine;
      pf.lines = std::max<int64_t>(0, std::min(share, next_lines - first));
      pf.per_step = static_cast<int>((pf.lines + pairs - 1) / pairs);
    }
    kTiles[pf.lines > 0][n - 1][blocks - 1](pairs, x + r * x_stride, x_stride, group,
                                            PackedBlockSize(k), out + r * out_stride, out_stride,
                                            pf);
  }
}

}  // namespace strata::kernels::gemm_internal
