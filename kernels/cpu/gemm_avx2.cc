// The AVX2 + FMA column-group kernel of GemmBf16. This file alone is compiled with AVX2
// enabled (see BUILD); gemm.cc calls it only where the CPU has it. Same arithmetic as the
// scalar kernel (gemm_internal.h), bit for bit.
//
// From 4 rows a group's blocks are taken one at a time: R rows against one block (2R chains
// of FMAs, its 4 weight vectors in registers for every row). Taking up to 4 blocks side by
// side there, as the AVX-512 kernel does, was measured slower on a Zen 5 (docs/benchmarks.md,
// "The AVX2 and AVX-512 GEMMs take four blocks at once"), and tiles of 3 rows against 2
// blocks on the Xeon VM (1.1-1.3x the time from 8 rows). Up to 3 rows take them side by
// side (Tile).
#include <immintrin.h>

#include "kernels/cpu/gemm_internal.h"
#include "kernels/cpu/spread.h"
#include "kernels/cpu/static_count.h"

namespace strata::kernels::gemm_internal {
namespace {

// R rows against C blocks side by side: 2RC chains of FMAs, each block's weights widened as
// they are used, and `pf`'s lines requested over the k-pairs. From 4 rows one block at a
// time (C = 1): 2R accumulators, 4 weight vectors and a broadcast fit AVX2's 16 registers
// for R <= kTileRows. Up to kSideRows rows all of a group's blocks (1 row) or two at a time:
// one block at a time kept a single row at 2 chains and its weights in one stream, and a
// batch-1 decode step's GEMMs read 0.75 of what the AVX-512 BF16 kernel reads on the 2-core
// Xeon VM (docs/benchmarks.md, "Small batches' blocks side by side on AVX2 and AVX-512").
constexpr int kTileRows = 5;
constexpr int kSideRows = 3;
template <int R, int C>
void Tile(int64_t k, const float* x, int64_t x_stride, const uint16_t* group, int64_t block_size,
          float* out, int64_t out_stride, TilePrefetch pf) {
  __m256 acc[R][C][2];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) acc[r][c][0] = acc[r][c][1] = _mm256_setzero_ps();
  }
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  const int64_t pairs = (k + 1) / 2;
  Spread spread(pf.lines, pairs);
  int64_t line = 0;  // lines requested
  for (int64_t p = 0; p < pairs; ++p) {
    spread.Step([&] { _mm_prefetch(pf.begin + line++ * kCacheLine, _MM_HINT_T1); });
    for (int c = 0; c < C; ++c) {
      // Columns 0-7 and 8-15 of the pair: each 32-bit lane holds (even, odd) weights.
      const uint16_t* w = group + c * block_size + p * 32;
      const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
      const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 16));
      const __m256 odd0 = _mm256_castsi256_ps(_mm256_and_si256(v0, high));
      const __m256 odd1 = _mm256_castsi256_ps(_mm256_and_si256(v1, high));
      const __m256 even0 = _mm256_castsi256_ps(_mm256_slli_epi32(v0, 16));
      const __m256 even1 = _mm256_castsi256_ps(_mm256_slli_epi32(v1, 16));
      for (int r = 0; r < R; ++r) {
        const __m256 xo = _mm256_broadcast_ss(x + r * x_stride + 2 * p + 1);
        acc[r][c][0] = _mm256_fmadd_ps(xo, odd0, acc[r][c][0]);
        acc[r][c][1] = _mm256_fmadd_ps(xo, odd1, acc[r][c][1]);
        const __m256 xe = _mm256_broadcast_ss(x + r * x_stride + 2 * p);
        acc[r][c][0] = _mm256_fmadd_ps(xe, even0, acc[r][c][0]);
        acc[r][c][1] = _mm256_fmadd_ps(xe, even1, acc[r][c][1]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) {
      _mm256_storeu_ps(out + r * out_stride + c * 16, acc[r][c][0]);
      _mm256_storeu_ps(out + r * out_stride + c * 16 + 8, acc[r][c][1]);
    }
  }
}

// R rows against blocks [0, blocks), one block at a time, each block's tile requesting
// its share of the next group into L2 (TileShareOfNext).
template <int R>
void BlockRows(int blocks, int64_t k, const float* x, int64_t x_stride, const uint16_t* group,
               int64_t block_size, float* out, int64_t out_stride, const uint16_t* next,
               int64_t next_elements, int rows, int tile, int tiles) {
  for (int b = 0; b < blocks; ++b) {
    const TilePrefetch pf = TileShareOfNext(next, next_elements, rows, tile * blocks + b,
                                            tiles * blocks, kAvx2PrefetchRows);
    Tile<R, 1>(k, x, x_stride, group + b * block_size, block_size, out + b * 16, out_stride, pf);
  }
}

}  // namespace

void ColumnGroupAvx2(int rows, int blocks, int64_t k, const float* x, int64_t x_stride,
                     const uint16_t* group, float* out, int64_t out_stride, const uint16_t* next,
                     int64_t next_elements) {
  const int64_t block_size = PackedBlockSize(k);
  if (rows <= kSideRows) {
    // Blocks side by side: all of the group's for 1 row, two at a time for 2 or 3 rows. At
    // 3 rows the 12 accumulators, the widened weights and the broadcasts outnumber the 16
    // registers and some go through memory; it still measured 1.33x one block at a time.
    WithCount<kSideRows>(rows, [&](auto r) {
      constexpr int R = decltype(r)::value;
      constexpr int kAtOnce = R == 1 ? kGroupBlocks : 2;
      for (int b = 0; b < blocks; b += kAtOnce) {
        WithCount<kAtOnce>(blocks - b, [&](auto c) {
          Tile<R, decltype(c)::value>(k, x, x_stride, group + b * block_size, block_size,
                                      out + b * 16, out_stride, TilePrefetch{});
        });
      }
    });
    return;
  }
  const int tiles = (rows + kTileRows - 1) / kTileRows;
  for (int t = 0; t < tiles; ++t) {
    const int r = t * kTileRows;
    WithCount<kTileRows>(rows - r, [&](auto tile_rows) {
      BlockRows<decltype(tile_rows)::value>(blocks, k, x + r * x_stride, x_stride, group,
                                            block_size, out + r * out_stride, out_stride, next,
                                            next_elements, rows, t, tiles);
    });
  }
}

}  // namespace strata::kernels::gemm_internal
