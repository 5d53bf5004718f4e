// The per-ISA kernels behind GemmBf16 (gemm.h). Private to kernels/cpu.
//
// A packed column block holds 16 output columns as k-pairs: element (p, j, h) at
// block[(p * 16 + j) * 2 + h] is w[column j][2p + h], zero past k. Every kernel computes
// out[r][j] = the sum, over pairs p ascending, of fma(x[r][2p + 1], w[2p + 1][j], .) then
// fma(x[r][2p], w[2p][j], .), from zero (x[r][k] is taken as zero when k is odd).
#ifndef STRATA_KERNELS_CPU_GEMM_INTERNAL_H_
#define STRATA_KERNELS_CPU_GEMM_INTERNAL_H_

#include <immintrin.h>

#include <chrono>
#include <cstdint>

namespace strata::kernels::gemm_internal {

// Elements of one packed column block.
inline int64_t PackedBlockSize(int64_t k) { return (k + 1) / 2 * 32; }

// Column groups: gemm.cc hands each kernel up to kGroupBlocks consecutive packed column
// blocks. The AVX-512 kernels run them side by side, so that a row has several independent
// chains of FMAs; the AVX2 one side by side up to 3 rows and one block after another from
// 4; the scalar one block after another.
inline constexpr int kGroupBlocks = 4;

// Rows [0, rows) of x (f32, row stride x_stride, even, with x[r][k] = 0 when k is odd)
// against `blocks` (1 to kGroupBlocks) consecutive packed column blocks; out has rows of
// out_stride floats, block b's columns at b * 16.
void ColumnGroupScalar(int rows, int blocks, int64_t k, const float* x, int64_t x_stride,
                       const uint16_t* group, float* out, int64_t out_stride);
// The AVX2 and AVX-512 kernels take `next` and `next_elements` as the AVX-512 BF16 kernel's
// below.
void ColumnGroupAvx2(int rows, int blocks, int64_t k, const float* x, int64_t x_stride,
                     const uint16_t* group, float* out, int64_t out_stride, const uint16_t* next,
                     int64_t next_elements);
void ColumnGroupAvx512(int rows, int blocks, int64_t k, const float* x, int64_t x_stride,
                       const uint16_t* group, float* out, int64_t out_stride, const uint16_t* next,
                       int64_t next_elements);

// The AVX-512 BF16 kernel (vdpbf16ps, whose per-lane arithmetic is the two FMAs above):
// as the others, but x is bf16 pairs (row stride x_stride elements, even, with x[r][k] = 0
// when k is odd). While it runs, the `next_elements` packed weights at `next` (the group
// this thread takes next; null: none) are prefetched into L2. That changes no arithmetic.
void ColumnGroupAvx512Bf16(int rows, int blocks, int64_t k, const uint16_t* x, int64_t x_stride,
                           const uint16_t* group, float* out, int64_t out_stride,
                           const uint16_t* next, int64_t next_elements);

// A tile's requests for the group its thread takes next: lines [0, lines) from `begin`,
// into L2, spread evenly over the tile's k-pairs (spread.h). From a kernel's threshold of
// rows up every tile requests an equal share of the next group (the last tiles' may be
// short or empty), and the group's arithmetic hides the next one's read. Below it the GEMM
// is near the read bound, the hardware prefetcher keeps up, and the requests only crowd
// the tiles that stream: the AVX-512 BF16 kernel from kPrefetchRows (at 8 rows they slowed
// it 1.05x on a Zen 5; at 4-6 rows 1.08x on the Xeon VM). The kernels on FMAs reach the
// read bound later (docs/benchmarks.md, "The FMA kernels request the next group from
// fewer rows"): the AVX-512 one from kFmaPrefetchRows (at 6-8 rows 1.10-1.20x faster with
// the requests on the Xeon VM), the AVX2 one, whose tiles take one block at a time from
// 4 rows, from kAvx2PrefetchRows (1.08-1.60x at 4-64 rows there).
struct TilePrefetch {
  const char* begin = nullptr;
  int64_t lines = 0;
};
inline constexpr int64_t kCacheLine = 64;
inline constexpr int kPrefetchRows = 9;
inline constexpr int kFmaPrefetchRows = 6;
inline constexpr int kAvx2PrefetchRows = 4;

// Tile `tile` of `tiles` over `rows` rows: its share of the `next_elements` packed weights
// at `next` (null: no next group), from `min_rows` rows up.
inline TilePrefetch TileShareOfNext(const uint16_t* next, int64_t next_elements, int rows, int tile,
                                    int tiles, int min_rows) {
  const int64_t lines =
      next != nullptr && rows >= min_rows ? (next_elements * 2 + kCacheLine - 1) / kCacheLine : 0;
  const int64_t share = (lines + tiles - 1) / tiles;
  TilePrefetch pf;
  if (const int64_t first = tile * share; share > 0 && first < lines) {
    pf.begin = reinterpret_cast<const char*>(next) + first * kCacheLine;
    pf.lines = share < lines - first ? share : lines - first;
  }
  return pf;
}

// Register-only throughput probes on the calling thread, in FLOP/s (2 per multiply-add):
// independent chains of vdpbf16ps (gemm_avx512bf16.cc; AVX-512 BF16 CPUs only) and of
// 512-bit f32 FMAs (gemm_avx512.cc; AVX-512 CPUs only), `iterations` steps of each chain.
// They choose the kernel of wide batches (gemm.h, GemmWideKernel).
double Bf16DotRate(int64_t iterations);
double Fma512Rate(int64_t iterations);

// The loop of both probes: `iterations` steps of twelve independent chains (more than
// either instruction's latency times its issue rate on the CPUs measured), each step
// acc = step(acc, a) for every chain, with `a` made opaque to the compiler every step so
// that the loop is not folded. FLOP/s at `flops` per step of a chain. Instantiated only in
// the files compiled for AVX-512.
template <class Operand, class Step>
double ChainRate(int64_t iterations, int flops, Operand a, Step step) {
  constexpr int kChains = 12;
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c));
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iterations; ++i) {
    for (int c = 0; c < kChains; ++c) acc[c] = step(acc[c], a);
    asm volatile("" : "+v"(a));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // The chains' results are used (one lane of their sum), so no chain is dropped.
  __m512 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  const float lane = _mm512_cvtss_f32(sum);
  asm volatile("" : : "x"(lane));
  return static_cast<double>(iterations) * kChains * flops / seconds;
}

}  // namespace strata::kernels::gemm_internal

#endif  // STRATA_KERNELS_CPU_GEMM_INTERNAL_H_
