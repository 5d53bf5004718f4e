// The AVX-512 BF16 kernel of GemmBf16. This file alone is compiled with AVX-512 BF16
// enabled (see BUILD); gemm.cc calls it only where the CPU has it. vdpbf16ps adds, per f32
// lane, the odd pair's product and then the even pair's, each rounded once, as the other
// kernels' two FMAs do, so all of them agree bit for bit. x stays bf16: a row's pair is
// one 32-bit broadcast. R rows by C column blocks of accumulators (R * C <= 24) leave room
// for C weight vectors and a broadcast in the 32 registers; C blocks side by side give
// batch 1 C independent chains.
//
// Every row tile after the first reads the group from L2, where the first tile brought it,
// and would leave DRAM idle. So from kPrefetchRows rows up every tile requests a share of
// the next group into L2 (an equal share, the last tiles' possibly less), spread evenly
// over its k-steps (1-2 lines a step at 9-24 rows, one every few steps past that), and the
// whole group's arithmetic hides the next group's read: the first tile then finds its
// lines in L2 too. (Requests only from tiles 2 and later, from 13 rows up, bunched at each
// tile's start, ran 1.15-1.26x slower at 16 to 24 rows, and none at 9-12 rows 1.02-1.13x;
// docs/benchmarks.md, "The GEMM spreads its requests over the whole group".)
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "kernels/cpu/gemm_internal.h"
#include "kernels/cpu/spread.h"

namespace strata::kernels::gemm_internal {
namespace {

constexpr int kTileRows = 6;

template <int R, int C, bool kPrefetch>
void Tile(int64_t pairs, const uint16_t* x, int64_t x_stride, const uint16_t* group,
          int64_t block_size, float* out, int64_t out_stride, TilePrefetch pf) {
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  Spread spread(pf.lines, pairs);
  int64_t line = 0;  // lines requested
  for (int64_t p = 0; p < pairs; ++p) {
    if constexpr (kPrefetch) {
      spread.Step([&] { _mm_prefetch(pf.begin + line++ * kCacheLine, _MM_HINT_T1); });
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
                        int64_t, TilePrefetch);

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
  for (int t = 0; t < tiles; ++t) {
    const int r = t * kTileRows;
    const int n = rows - r < kTileRows ? rows - r : kTileRows;
    const TilePrefetch pf = TileShareOfNext(next, next_elements, rows, t, tiles, kPrefetchRows);
    kTiles[pf.lines > 0][n - 1][blocks - 1](pairs, x + r * x_stride, x_stride, group,
                                            PackedBlockSize(k), out + r * out_stride, out_stride,
                                            pf);
  }
}

double Bf16DotRate(int64_t iterations) {
  const __m512bh b = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x33d633d6));  // 1e-7 pairs
  return ChainRate(iterations, 64, reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x3f803f80)),
                   [&](__m512 acc, __m512bh a) { return _mm512_dpbf16_ps(acc, a, b); });
}

}  // namespace strata::kernels::gemm_internal
