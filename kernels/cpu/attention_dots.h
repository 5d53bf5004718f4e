// The register-level pieces of the attention tile kernels (attention_impl.h), written once
// over a SIMD "Ops" traits type (simd_ops.h): q.k of a few query heads against one or a
// few keys at a time (bf16 dot products or f32 fused products, then one reduction), and
// p.v of a few query heads over chunks of a tile's values with the sums in registers. Each
// gives the head-by-head walk's arithmetic term for term (TileState), so the results are
// bit-identical to it. Private to kernels/cpu.
#ifndef STRATA_KERNELS_CPU_ATTENTION_DOTS_H_
#define STRATA_KERNELS_CPU_ATTENTION_DOTS_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/simd_ops.h"
#include "kernels/cpu/static_count.h"

namespace strata::kernels::attention_internal {

inline constexpr int kTile = kAttentionTileTokens;
inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

template <class Ops, class = void>
struct HasBf16Dot : std::false_type {};
template <class Ops>
struct HasBf16Dot<Ops, std::void_t<decltype(Ops::kBf16Dot)>> : std::true_type {};

// Whether q.k of this key type runs on bf16 dot products (Ops::DotPairs, vdpbf16ps) over
// the query as given in bf16, rather than on f32 fused products over the widened keys. One
// or the other for every q.k of an instruction set and key type, in the head-by-head walk
// and the tile kernels alike, so that they give the same bits. Pairs of elements fold into
// each lane, so the dot's bits differ from the f32 chain's (and from other instruction
// sets'). Grouped-query shapes, whose keys each serve several query heads, took 5-11% less
// time this way; MHA the same (docs/benchmarks.md, "q.k of bf16 keys on the BF16 dot
// product").
template <class Ops, KvDType kKv>
inline constexpr bool kBf16Dots = (kKv == KvDType::kBF16) && HasBf16Dot<Ops>::value;

// Elements [c, c + 32) of a head of `d` elements (a multiple of 16) as bf16 pairs, in the
// steps of q.k's bf16 dot products: 32 at a time, the last 16 as half pairs where d is not
// a multiple of 32 (80: 32, 32, 16).
template <class Ops>
inline auto LoadPairsAt(const uint16_t* p, int c, int d) {
  return c + 32 > d ? Ops::LoadHalfPairs(p + c) : Ops::LoadPairs(p + c);
}

// acc + q.k over `d` elements on bf16 dot products, in LoadPairsAt's steps.
template <class Ops>
inline typename Ops::V DotBf16(const uint16_t* q, const uint16_t* k, int d, typename Ops::V acc) {
  int c = 0;
  for (; c + 32 <= d; c += 32) {
    acc = Ops::DotPairs(acc, Ops::LoadPairs(q + c), Ops::LoadPairs(k + c));
  }
  if (c < d) acc = Ops::DotPairs(acc, LoadPairsAt<Ops>(q, c, d), LoadPairsAt<Ops>(k, c, d));
  return acc;
}

// Whether q.k of a head of kDim elements can take the f32 FMAs over widened pairs
// (KeyDotsFourHeads' `widened`, with the query in SplitQueryIndex's order): only a tile
// kernel's head size that is whole steps of 32 (80 is not). FoldImpl lays the query out
// that way only where this holds.
template <int kDim>
inline constexpr bool kWidenable = kDim > 0 && kDim % 32 == 0;

// The same for a head size known at compile time: whole steps only where kDim is a
// multiple of 32.
template <class Ops, int kDim>
inline auto LoadPairsAt(const uint16_t* p, int c) {
  if constexpr (kDim % 32 != 0) return LoadPairsAt<Ops>(p, c, kDim);
  return Ops::LoadPairs(p + c);
}

// q.k of one key for G query heads (their queries kDim elements apart, as f32 in `q` and as
// given in `q_bf16`) at once, the dots in registers: out[g * kTile] = scale * (q_g . k).
// Each dot is TileState's: fused products over ascending chunks (bf16 dot products where
// kBf16Dots), then one reduction. Inlined, always: GCC left the instances for 2 and 3
// heads (a group's last heads) out of line, a call per key.
template <class Ops, KvDType kKv, int kDim, int G>
__attribute__((always_inline)) inline void KeyDots(const float* q, const uint16_t* q_bf16,
                                                   const uint16_t* k, float scale, float* out) {
  constexpr int L = Ops::kLanes;
  typename Ops::V dot[G];
  for (int g = 0; g < G; ++g) dot[g] = Ops::Zero();
  if constexpr (kBf16Dots<Ops, kKv>) {
    // DotBf16's products in its order (a last 16 as half pairs), each key chunk loaded once
    // for the G heads.
    for (int c = 0; c < kDim; c += 32) {
      const auto kc = LoadPairsAt<Ops, kDim>(k, c);
      for (int g = 0; g < G; ++g) {
        dot[g] = Ops::DotPairs(dot[g], LoadPairsAt<Ops, kDim>(q_bf16 + g * kDim, c), kc);
      }
    }
  } else {
    for (int c = 0; c < kDim / L; ++c) {
      const typename Ops::V kv = Ops::template LoadKv<kKv>(k + c * L);
      for (int g = 0; g < G; ++g) dot[g] = Ops::Fma(Ops::Load(q + g * kDim + c * L), kv, dot[g]);
    }
  }
  for (int g = 0; g < G; ++g) out[g * kTile] = Ops::ReduceAdd(dot[g]) * scale;
}

template <class Ops, class = void>
struct HasReduceAddAll : std::false_type {};
template <class Ops>  // (a void expression: a vector type as a template argument loses attributes)
struct HasReduceAddAll<Ops, std::void_t<decltype(static_cast<void>(Ops::ReduceAddAll(nullptr)))>>
    : std::true_type {};

// Where element i of a head's query goes in the pair-split order that KeyDotsFourHeads reads
// on FMAs: per 32 elements, the 16 odd ones, then the 16 even ones (head sizes are multiples
// of 32 there).
inline size_t SplitQueryIndex(size_t i) {
  return (i & ~size_t{31}) + ((i & 1) ? 0 : 16) + ((i & 31) >> 1);
}

// KeyDots for H (up to 4) query heads and kLanes / 4 keys (k[0..]) at once: 4 keys on
// AVX-512, 2 on AVX2; out[g * kTile + t] = scale * (q_g . k[t]). Each dot is KeyDots' (the
// same products in the same order), and the kLanes dots end in one ReduceAddAll, whose sums
// are ReduceAdd's bit for bit, at about a third of the instructions of as many reductions
// (docs/benchmarks.md, "Prompt rows' dot products reduced 16 at a time"); with H < 4 the
// missing heads' vectors stay zero through it and are not written. `widened` (AVX-512 BF16
// only, which has bf16 dot products to replace): bf16 keys' dots run on f32 FMAs
// (Ops::WidenPairs) over the queries in the pair-split order, each key chunk widened once
// for the heads, where vdpbf16ps issues at half the FMAs' FLOP rate: the same lanes,
// products and roundings as vdpbf16ps, so the same bits, and 16 independent chains keep
// both FMA units busy ("q.k on FMAs, 4 keys at a time"). Inlined, always: GCC left the
// instances for 2 and 3 heads out of line.
template <class Ops, KvDType kKv, int kDim, int H = 4>
__attribute__((always_inline)) inline void KeyDotsFourHeads(const float* q, const uint16_t* q_bf16,
                                                            const uint16_t* const* k, float scale,
                                                            bool widened, float* out) {
  static_assert(H >= 1 && H <= 4);
  constexpr int L = Ops::kLanes;
  constexpr int kKeys = L / 4;
  // Key t's dot with head g goes in as the vector whose sum lands in lane kKeys * g + t.
  auto at = [](int t, int g) { return simd::ReduceAddAllSource(L, kKeys * g + t); };
  typename Ops::V dot[L];
  for (int i = 0; i < L; ++i) dot[i] = Ops::Zero();
  if constexpr (kBf16Dots<Ops, kKv> && kWidenable<kDim>) {
    for (int c = 0; c < kDim && widened; c += 32) {
      typename Ops::V odd[kKeys], even[kKeys];
      for (int t = 0; t < kKeys; ++t) Ops::WidenPairs(k[t] + c, &odd[t], &even[t]);
      for (int g = 0; g < H; ++g) {
        const typename Ops::V q_odd = Ops::Load(q + g * kDim + c);
        const typename Ops::V q_even = Ops::Load(q + g * kDim + c + L);
        for (int t = 0; t < kKeys; ++t) {
          dot[at(t, g)] = Ops::Fma(q_even, even[t], Ops::Fma(q_odd, odd[t], dot[at(t, g)]));
        }
      }
    }
  }
  if constexpr (kBf16Dots<Ops, kKv>) {
    // (Never widened where !kWidenable: FoldImpl.)
    for (int c = 0; c < kDim && !widened; c += 32) {
      typename Ops::Pairs kc[kKeys];
      for (int t = 0; t < kKeys; ++t) kc[t] = LoadPairsAt<Ops, kDim>(k[t], c);
      for (int g = 0; g < H; ++g) {
        const auto qg = LoadPairsAt<Ops, kDim>(q_bf16 + g * kDim, c);
        for (int t = 0; t < kKeys; ++t) dot[at(t, g)] = Ops::DotPairs(dot[at(t, g)], qg, kc[t]);
      }
    }
  } else {
    for (int c = 0; c < kDim / L; ++c) {
      typename Ops::V kv[kKeys];
      for (int t = 0; t < kKeys; ++t) kv[t] = Ops::template LoadKv<kKv>(k[t] + c * L);
      for (int g = 0; g < H; ++g) {
        const typename Ops::V qg = Ops::Load(q + g * kDim + c * L);
        for (int t = 0; t < kKeys; ++t) dot[at(t, g)] = Ops::Fma(qg, kv[t], dot[at(t, g)]);
      }
    }
  }
  alignas(64) float sums[L];
  Ops::Store(sums, Ops::Mul(Ops::ReduceAddAll(dot), Ops::Set1(scale)));
  for (int g = 0; g < H; ++g) std::memcpy(out + g * kTile, sums + kKeys * g, kKeys * sizeof(float));
}

// q.k of one query head against kLanes keys (k[0..]): out[t] = scale * (q . k[t]), each dot
// KeyDots' (the same products in the same order), all ending in one ReduceAddAll (key t's
// dot goes in as the vector whose sum lands in lane t, so that the sums come out in key
// order).
template <class Ops, KvDType kKv, int kDim>
inline void KeyDotsOneHead(const float* q, const uint16_t* q_bf16, const uint16_t* const* k,
                           float scale, float* out) {
  constexpr int L = Ops::kLanes;
  typename Ops::V dot[L];
  for (int i = 0; i < L; ++i) dot[i] = Ops::Zero();
  auto at = [](int t) { return simd::ReduceAddAllSource(L, t); };
  if constexpr (kBf16Dots<Ops, kKv>) {
    for (int c = 0; c < kDim; c += 32) {
      const auto qc = LoadPairsAt<Ops, kDim>(q_bf16, c);
      for (int t = 0; t < L; ++t) {
        dot[at(t)] = Ops::DotPairs(dot[at(t)], qc, LoadPairsAt<Ops, kDim>(k[t], c));
      }
    }
  } else {
    for (int c = 0; c < kDim / L; ++c) {
      const typename Ops::V qc = Ops::Load(q + c * L);
      for (int t = 0; t < L; ++t) {
        dot[at(t)] = Ops::Fma(qc, Ops::template LoadKv<kKv>(k[t] + c * L), dot[at(t)]);
      }
    }
  }
  Ops::Store(out, Ops::Mul(Ops::ReduceAddAll(dot), Ops::Set1(scale)));
}

// p.v of one KV head's tile for G of its query heads at once (their scores kTile floats
// apart, their sums kDim apart in `acc`), over value chunks [c0, c0 + CC) of kLanes
// elements: each chunk of a slot's values is loaded and widened once for all G, the sums in
// registers. Each head's sums are TileState's, term for term: a fused product per slot,
// slots ascending. step() runs before each slot.
template <class Ops, KvDType kKv, int kDim, int G, int CC, class Step>
inline void ValueSums(const float* sc, const uint16_t* v_base, const int32_t* slots, int n,
                      int64_t slot_stride, int c0, float* acc, Step&& step) {
  constexpr int L = Ops::kLanes;
  using V = typename Ops::V;
  V a[G][CC];
  for (int g = 0; g < G; ++g) {
    for (int c = 0; c < CC; ++c) a[g][c] = Ops::Zero();
  }
  for (int j = 0; j < n; ++j) {
    step();
    const uint16_t* v = v_base + slots[j] * slot_stride + c0 * L;
    V pj[G];
    for (int g = 0; g < G; ++g) pj[g] = Ops::Set1(sc[g * kTile + j]);
    for (int c = 0; c < CC; ++c) {
      const V x = Ops::template LoadKv<kKv>(v + c * L);
      for (int g = 0; g < G; ++g) a[g][c] = Ops::Fma(pj[g], x, a[g][c]);
    }
  }
  for (int g = 0; g < G; ++g) {
    for (int c = 0; c < CC; ++c) Ops::Store(acc + g * kDim + (c0 + c) * L, a[g][c]);
  }
}

// Value chunks a pass of ValueSums takes for `heads` query heads: as few passes as keep
// their sums (heads per chunk) in kSumRegs registers, as even as they come, the last pass
// the rest (head sizes of 64 and 128 take powers of two for powers of two of heads; 96,
// 6 chunks on AVX-512, takes 3 and 3 for 4 heads; 80, 5 chunks, 3 and 2). Each chunk's sums
// are its own, so how the chunks are cut into passes leaves the bits alone.
constexpr int ValueChunksAtOnce(int chunks, int sum_regs, int heads) {
  const int most = sum_regs / heads > 1 ? sum_regs / heads : 1;
  const int passes = (chunks + most - 1) / most;
  return (chunks + passes - 1) / passes;
}

// Passes of ValueSums over `heads` query heads (at most sum_regs) of one KV head: the chunks
// ValueChunksAtOnce at a time, the last pass the rest.
constexpr int ValueChunkPasses(int chunks, int sum_regs, int heads) {
  const int at_once = ValueChunksAtOnce(chunks, sum_regs, heads);
  return (chunks + at_once - 1) / at_once;
}

// Passes of ValueSums over `group` query heads of one KV head whose sums do not all fit in
// kSumRegs registers at once: up to kSumRegs heads a pass, each pass over as many value
// chunks as keep their sums there, so that each chunk of a slot's values is widened once
// per pass of heads.
template <class Ops, KvDType kKv, int kDim, int kSumRegs, class Step>
void ValueSumPasses(const float* sc, const uint16_t* v_base, const int32_t* slots, int n,
                    int64_t slot_stride, int group, float* acc, Step& step) {
  constexpr int kChunks = kDim / Ops::kLanes;
  for (int g0 = 0; g0 < group; g0 += kSumRegs) {
    WithCount<kSumRegs>(group - g0, [&](auto heads_now) {
      constexpr int G = decltype(heads_now)::value;
      constexpr int CC = ValueChunksAtOnce(kChunks, kSumRegs, G);
      constexpr int kLast = ValueChunkPasses(kChunks, kSumRegs, G) - 1;  // the last pass
      const float* sc_g = sc + static_cast<size_t>(g0) * kTile;
      float* acc_g = acc + static_cast<size_t>(g0) * kDim;
      for (int pass = 0; pass < kLast; ++pass) {
        ValueSums<Ops, kKv, kDim, G, CC>(sc_g, v_base, slots, n, slot_stride, pass * CC, acc_g,
                                         step);
      }
      ValueSums<Ops, kKv, kDim, G, kChunks - kLast * CC>(sc_g, v_base, slots, n, slot_stride,
                                                         kLast * CC, acc_g, step);
    });
  }
}

// Vector registers the sums of a pass of ValueSums may take: half of them (AVX-512 has 32,
// AVX2 16). Query heads whose sums over all of a head's value chunks fit in them.
template <class Ops>
constexpr int ValueSumRegs() {
  return Ops::kLanes == 16 ? 16 : 8;
}
template <class Ops, int kDim>
constexpr int OnePassHeads() {
  return std::max(1, ValueSumRegs<Ops>() / (kDim / Ops::kLanes));
}

// Passes ValueSumPasses makes over a KV head's tile.
constexpr int ValueSumPassCount(int chunks, int sum_regs, int group) {
  int passes = 0;
  for (int g0 = 0; g0 < group; g0 += sum_regs) {
    passes += ValueChunkPasses(chunks, sum_regs, std::min(group - g0, sum_regs));
  }
  return passes;
}

}  // namespace strata::kernels::attention_internal

#endif  // STRATA_KERNELS_CPU_ATTENTION_DOTS_H_
