// The AVX-512 column-group kernel of GemmBf16. This file alone is compiled with AVX-512
// enabled (see BUILD); gemm.cc calls it only where the CPU has it and either lacks AVX-512
// BF16 or runs wide batches on FMAs (gemm.h, GemmWideKernel).
// Same arithmetic as the scalar kernel (gemm_internal.h: per k-pair, the odd term's FMA
// and then the even term's, from zero), so they agree bit for bit. One 64-byte load holds a
// pair for 16 columns: shifting each 32-bit lane left by 16 gives the even weights, masking
// its low half the odd ones. One register holds a row's 16 columns.
//
// Each output register is one chain of dependent FMAs, two per pair, so a tile needs many
// of them to keep the FMA units busy: R rows by C blocks side by side (R * C accumulators,
// 2C weight vectors and two broadcasts in the 32 registers). One block at a time (up to
// 12 rows against it) ran 8 rows 2.2x and 64 rows 1.4x slower (docs/benchmarks.md, "The
// AVX2 and AVX-512 GEMMs take four blocks at once"). Below 4 rows too, since 1-3 rows
// against one block at a time read the weights at 0.67-0.80 of the rate of 4 side by side
// on the 2-core Xeon VM ("Small batches' blocks side by side on AVX2 and AVX-512"; a Zen 5
// had measured the opposite, 1.03-1.08x). From kFmaPrefetchRows rows up each tile requests
// a share of the group the thread takes next into L2, as the AVX-512 BF16 kernel's tiles do
// from kPrefetchRows.
//
// Widening each chunk of 32-64 pairs of the group to f32 once, into L1, for all the row
// tiles to read (FMAs and loads only), was tried and not kept: its tiles ran at the FMA
// probe's rate, but the widening pass and the tiles' reloads of their sums cost what the
// tiles saved (docs/benchmarks.md, "Weights widened once per chunk: not kept").
#include <immintrin.h>

#include <array>

#include "kernels/cpu/gemm_internal.h"
#include "kernels/cpu/spread.h"

namespace strata::kernels::gemm_internal {
namespace {

constexpr int kTileRows = 5;  // 5 x 4 accumulators, 8 weight vectors, 2 broadcasts

template <int R, int C, bool kPrefetch>
void Tile(int64_t k, const float* x, int64_t x_stride, const uint16_t* group, int64_t block_size,
          float* out, int64_t out_stride, TilePrefetch pf) {
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  const int64_t pairs = (k + 1) / 2;
  Spread spread(pf.lines, pairs);
  int64_t line = 0;  // lines requested
  for (int64_t p = 0; p < pairs; ++p) {
    if constexpr (kPrefetch) {
      spread.Step([&] { _mm_prefetch(pf.begin + line++ * kCacheLine, _MM_HINT_T1); });
    }
    __m512 even[C], odd[C];
    for (int c = 0; c < C; ++c) {
      const __m512i v = _mm512_loadu_si512(group + c * block_size + p * 32);
      even[c] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
      odd[c] = _mm512_castsi512_ps(_mm512_and_si512(v, high));
    }
    for (int r = 0; r < R; ++r) {
      const __m512 xo = _mm512_set1_ps(x[r * x_stride + 2 * p + 1]);
      const __m512 xe = _mm512_set1_ps(x[r * x_stride + 2 * p]);
      for (int c = 0; c < C; ++c) {
        acc[r][c] = _mm512_fmadd_ps(xo, odd[c], acc[r][c]);
        acc[r][c] = _mm512_fmadd_ps(xe, even[c], acc[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(out + r * out_stride + c * 16, acc[r][c]);
  }
}

using TileFn = void (*)(int64_t, const float*, int64_t, const uint16_t*, int64_t, float*, int64_t,
                        TilePrefetch);

template <int R, bool kPrefetch>
constexpr std::array<TileFn, kGroupBlocks> RowTiles() {
  return {&Tile<R, 1, kPrefetch>, &Tile<R, 2, kPrefetch>, &Tile<R, 3, kPrefetch>,
          &Tile<R, 4, kPrefetch>};
}

template <bool kPrefetch>
constexpr std::array<std::array<TileFn, kGroupBlocks>, kTileRows> Tiles() {
  return {RowTiles<1, kPrefetch>(), RowTiles<2, kPrefetch>(), RowTiles<3, kPrefetch>(),
          RowTiles<4, kPrefetch>(), RowTiles<5, kPrefetch>()};
}

// [prefetching][rows - 1][blocks - 1]
constexpr std::array<std::array<std::array<TileFn, kGroupBlocks>, kTileRows>, 2> kTiles = {
    Tiles<false>(), Tiles<true>()};

}  // namespace

void ColumnGroupAvx512(int rows, int blocks, int64_t k, const float* x, int64_t x_stride,
                       const uint16_t* group, float* out, int64_t out_stride, const uint16_t* next,
                       int64_t next_elements) {
  const int tiles = (rows + kTileRows - 1) / kTileRows;
  for (int t = 0; t < tiles; ++t) {
    const int r = t * kTileRows;
    const int n = rows - r < kTileRows ? rows - r : kTileRows;
    const TilePrefetch pf = TileShareOfNext(next, next_elements, rows, t, tiles, kFmaPrefetchRows);
    kTiles[pf.lines > 0][n - 1][blocks - 1](k, x + r * x_stride, x_stride, group,
                                            PackedBlockSize(k), out + r * out_stride, out_stride,
                                            pf);
  }
}

double Fma512Rate(int64_t iterations) {
  const __m512 b = _mm512_set1_ps(1e-7f);
  return ChainRate(iterations, 32, _mm512_set1_ps(1.0f),
                   [&](__m512 acc, __m512 a) { return _mm512_fmadd_ps(a, b, acc); });
}

}  // namespace strata::kernels::gemm_internal
