// The attention algorithm, written once over a SIMD "Ops" traits type and instantiated
// per instruction set (attention_avx512.cc, attention_avx2.cc, attention.cc for scalar).
// Private to kernels/cpu; see attention.h for the contract.
//
// Ops is one of the traits in simd_ops.h. Its Exp returns exactly 0 for -inf and exactly
// 1 for 0, which makes merging into the empty state exact.
#ifndef STRATA_KERNELS_CPU_ATTENTION_IMPL_H_
#define STRATA_KERNELS_CPU_ATTENTION_IMPL_H_

#include <omp.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/base/bfloat16.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/simd_ops.h"
#include "kernels/cpu/spread.h"
#include "kernels/cpu/static_count.h"
#include "kernels/cpu/work_ranges.h"

namespace strata::kernels::attention_internal {

inline constexpr int kTile = kAttentionTileTokens;
inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Per-thread scratch: one row's query and one (tile, KV head)'s state.
struct ItemScratch {
  std::vector<float> q;          // [num_heads][head_dim] one row's query as f32
  std::vector<uint16_t> q_bf16;  // the same, as given (bf16), for the bf16 dot products
  std::vector<float> scores;     // [group][kTile] scores, then probabilities
  std::vector<float> acc;        // [group][head_dim] one tile's unnormalised output
  std::vector<float> m, l;       // [group]
  void Reserve(int num_heads, int group, int head_dim) {
    q.resize(static_cast<size_t>(num_heads) * head_dim);
    q_bf16.resize(static_cast<size_t>(num_heads) * head_dim);
    scores.resize(static_cast<size_t>(group) * kTile);
    acc.resize(static_cast<size_t>(group) * head_dim);
    m.resize(group);
    l.resize(group);
  }
};

// Software prefetch. A tile walks one KV head's keys, whose lines are strided by the slot
// size; the hardware prefetchers do not run far enough ahead on that pattern to cover
// DRAM latency, and a burst of prefetches stalls the core as much as the loads would.
// So the tile kernels spread them over their own work: while the keys of a tile are
// scored, the V lines of those keys are requested, and the lines of the work that follows
// (`NextKeys`: the next KV head of the tile, or the next tile) are requested meanwhile: by
// the head-by-head walk (TileState) while V is accumulated, by the slot-major kernel keys
// during q.k and values during p.v. Measured on the demo shape at context 2048
// (kernels/cpu/bench), this took the KV read rate from about 0.5 to about 0.75 of a
// streaming-read probe.
struct NextKeys {
  const int32_t* slots = nullptr;
  int n = 0;
  const uint16_t* k_base = nullptr;
  int h0 = 0, h1 = 0;  // the KV heads that work reads: [h0, h1)
};

inline void PrefetchLines(const void* p, int bytes) {
  const char* c = static_cast<const char*>(p);
  for (int b = 0; b < bytes; b += 64) __builtin_prefetch(c + b);
}

// The i-th of `parts` near-equal shares of [0, n): [n * i / parts, n * (i + 1) / parts).
struct Share {
  int begin, end;
};
inline Share EvenShare(int n, int i, int parts) { return {n * i / parts, n * (i + 1) / parts}; }

// Into L2 only (prefetcht1): the far prefetch of whole slots, ahead of the per-head one.
inline void PrefetchLinesL2(const void* p, int bytes) {
  const char* c = static_cast<const char*>(p);
  for (int b = 0; b < bytes; b += 64) __builtin_prefetch(c + b, 0, 2);
}

template <class Ops>
inline float ExpScalar(float x) {
  float out[Ops::kLanes];
  Ops::Store(out, Ops::Exp(Ops::Set1(x)));
  return out[0];
}

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

// acc + q.k over `d` elements (a multiple of 16) on bf16 dot products: 32 at a time, then
// the last 16 if d is not a multiple of 32.
template <class Ops>
inline typename Ops::V DotBf16(const uint16_t* q, const uint16_t* k, int d, typename Ops::V acc) {
  int c = 0;
  for (; c + 32 <= d; c += 32) {
    acc = Ops::DotPairs(acc, Ops::LoadPairs(q + c), Ops::LoadPairs(k + c));
  }
  if (c < d) acc = Ops::DotPairs(acc, Ops::LoadHalfPairs(q + c), Ops::LoadHalfPairs(k + c));
  return acc;
}

// Computes the softmax state of tile `tile` for the `group` query heads that share one KV
// head, for a head size known only at run time (TileHeadsSlotMajor serves the others).
// kv_* point at that KV head inside slot 0; slot s is at + s * slot_stride.
template <class Ops, KvDType kKv>
void TileState(int d, int group, float scale, const AttentionRow& row, int tile, const float* q_f32,
               const uint16_t* q_bf16, const uint16_t* k_base, const uint16_t* v_base,
               int64_t slot_stride, const NextKeys& next, ItemScratch& s) {
  constexpr int L = Ops::kLanes;
  const int chunks = d / L;
  const int pos0 = tile * kTile;
  const int n = std::min(kTile, row.kv_end - pos0);
  const int32_t* slots = row.slots + pos0;

  for (int g = 0; g < group; ++g) {
    const float* q = q_f32 + static_cast<size_t>(g) * d;
    float* scores = s.scores.data() + static_cast<size_t>(g) * kTile;
    for (int j = 0; j < n; ++j) {
      const uint16_t* k = k_base + slots[j] * slot_stride;
      if (g == 0) PrefetchLines(v_base + slots[j] * slot_stride, d * 2);
      typename Ops::V dot = Ops::Zero();
      if constexpr (kBf16Dots<Ops, kKv>) {
        dot = DotBf16<Ops>(q_bf16 + static_cast<size_t>(g) * d, k, d, dot);
      } else {
        for (int c = 0; c < chunks; ++c) {
          dot = Ops::Fma(Ops::Load(q + c * L), Ops::template LoadKv<kKv>(k + c * L), dot);
        }
      }
      scores[j] = Ops::ReduceAdd(dot) * scale;
    }
    for (int j = n; j < kTile; ++j) scores[j] = kNegInf;

    typename Ops::V vmax = Ops::Set1(kNegInf);
    for (int j = 0; j < kTile; j += L) vmax = Ops::Max(vmax, Ops::Load(scores + j));
    const float m = Ops::ReduceMax(vmax);
    const typename Ops::V vm = Ops::Set1(m);
    typename Ops::V vsum = Ops::Zero();
    for (int j = 0; j < kTile; j += L) {
      const typename Ops::V p = Ops::Exp(Ops::Sub(Ops::Load(scores + j), vm));
      Ops::Store(scores + j, p);
      vsum = Ops::Add(vsum, p);
    }
    s.m[g] = m;
    s.l[g] = Ops::ReduceAdd(vsum);

    float* acc = s.acc.data() + static_cast<size_t>(g) * d;
    const bool last = g + 1 == group;
    for (int c = 0; c < chunks; ++c) Ops::Store(acc + c * L, Ops::Zero());
    for (int j = 0; j < n; ++j) {
      const uint16_t* v = v_base + slots[j] * slot_stride;
      if (last && j < next.n) PrefetchLines(next.k_base + next.slots[j] * slot_stride, d * 2);
      const typename Ops::V p = Ops::Set1(scores[j]);
      for (int c = 0; c < chunks; ++c) {
        Ops::Store(acc + c * L,
                   Ops::Fma(p, Ops::template LoadKv<kKv>(v + c * L), Ops::Load(acc + c * L)));
      }
    }
  }
}

// state = merge(state, tile): the fold step. state holds acc[d], m, l.
template <class Ops>
inline void MergeInto(int d, float* state, float tile_m, float tile_l, const float* tile_acc) {
  constexpr int L = Ops::kLanes;
  float& m = state[d];
  float& l = state[d + 1];
  const float new_m = std::max(m, tile_m);
  const float a = ExpScalar<Ops>(m - new_m);  // m may be -inf (empty): a = 0
  const float b = ExpScalar<Ops>(tile_m - new_m);
  const typename Ops::V va = Ops::Set1(a);
  const typename Ops::V vb = Ops::Set1(b);
  for (int c = 0; c < d; c += L) {
    Ops::Store(state + c,
               Ops::Add(Ops::Mul(Ops::Load(state + c), va), Ops::Mul(Ops::Load(tile_acc + c), vb)));
  }
  l = l * a + tile_l * b;
  m = new_m;
}

// q.k of one key for G query heads (their queries kDim elements apart, as f32 in `q` and as
// given in `q_bf16`) at once, the dots in registers: out[g * kTile] = scale * (q_g . k).
// Each dot is TileState's: fused products over ascending chunks (bf16 dot products where
// kBf16Dots), then one reduction.
template <class Ops, KvDType kKv, int kDim, int G>
inline void KeyDots(const float* q, const uint16_t* q_bf16, const uint16_t* k, float scale,
                    float* out) {
  constexpr int L = Ops::kLanes;
  typename Ops::V dot[G];
  for (int g = 0; g < G; ++g) dot[g] = Ops::Zero();
  if constexpr (kBf16Dots<Ops, kKv>) {
    // DotBf16's products in its order, each key chunk loaded once for the G heads.
    static_assert(kDim % 32 == 0);
    for (int c = 0; c < kDim; c += 32) {
      const auto kc = Ops::LoadPairs(k + c);
      for (int g = 0; g < G; ++g) {
        dot[g] = Ops::DotPairs(dot[g], Ops::LoadPairs(q_bf16 + g * kDim + c), kc);
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

// Value chunks a pass of ValueSums takes for `heads` query heads: the most, a power of two
// that divides the head's kChunks, whose sums (heads per chunk) fit in kSumRegs registers.
constexpr int ValueChunksAtOnce(int chunks, int sum_regs, int heads) {
  int cc = 1;
  while (cc * 2 <= chunks && cc * 2 * heads <= sum_regs && chunks % (cc * 2) == 0) cc *= 2;
  return cc;
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
      for (int c0 = 0; c0 < kChunks; c0 += CC) {
        ValueSums<Ops, kKv, kDim, G, CC>(sc + static_cast<size_t>(g0) * kTile, v_base, slots, n,
                                         slot_stride, c0, acc + static_cast<size_t>(g0) * kDim,
                                         step);
      }
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
    const int heads = group - g0 < sum_regs ? group - g0 : sum_regs;
    passes += chunks / ValueChunksAtOnce(chunks, sum_regs, heads);
  }
  return passes;
}

// The tile kernel when the head size is known at compile time (64, 128): tile `tile` of one
// row for KV heads [h0, h1), the keys read slot by slot. A slot holds every KV head of one
// position, so each slot's K of those heads is one contiguous run, which DRAM and the
// hardware prefetchers serve far better than the per-head pieces, strided by the slot, that
// a walk head by head reads (docs/benchmarks.md, "Attention slot by slot"). Each slot's V
// run is requested into L2 meanwhile, and p.v then walks the tile over those lines, a few
// query heads of a KV head at a time, their sums in registers. Each head's arithmetic is
// the head-by-head walk's (TileState), term for term: the same fused products in the same
// order and the same reductions, so the results are bit-identical to it (checked on the
// demo model's logits); only the order of the memory reads differs. Hands each head's state
// (in s.acc/s.m/s.l) to sink(kvh). The work `after` names is requested into L2, spread over
// all of this tile's work: its keys during q.k, one slot's with each slot here, and its
// values during p.v, one share of the slots per KV head, a line every few steps of that
// head's sums. (Requesting both during p.v alone left DRAM idle through q.k: 5-8% slower on
// the demo shape, up to 30% on AVX2; docs/benchmarks.md, "The next tile's keys requested
// during q.k". Each head's share at once, before its sums, left p.v's requests bunched:
// 3-9% slower; "The next tile's values spread over p.v".) kPasses: the KV head's query
// heads' sums over all its value chunks do not fit in registers at once, and p.v takes
// passes (ValueSumPasses); a template parameter so that the one-pass code (MHA, small
// groups) is compiled without the passes beside it, which slowed it.
template <class Ops, KvDType kKv, int kDim, bool kPasses, class Sink>
void TileHeadsSlotMajor(const AttentionParams& p, const float* q_row_f32, const AttentionRow& row,
                        int tile, int h0, int h1, const NextKeys& after, bool cached,
                        const uint16_t* k_cache, const uint16_t* v_cache, ItemScratch& s,
                        Sink&& sink) {
  static_assert(kDim > 0);
  static_assert(kDim * 2 % 64 == 0, "p.v's requests count whole 64-byte lines per head");
  constexpr int L = Ops::kLanes;
  constexpr int kChunks = kDim / L;
  constexpr int kHeadsAtOnce = 4;  // query heads of one KV head whose dots stay in registers
  using V = typename Ops::V;
  const int group = p.num_heads / p.num_kv_heads;
  const int64_t slot_stride = static_cast<int64_t>(p.num_kv_heads) * kDim;
  const int heads = (h1 - h0) * group;  // query heads of this work
  const int pos0 = tile * kTile;
  const int n = std::min(kTile, row.kv_end - pos0);
  const int32_t* slots = row.slots + pos0;
  const int run_bytes = (h1 - h0) * kDim * 2;
  thread_local std::vector<float> scores, m, l;  // [heads][kTile]; [heads]
  scores.resize(static_cast<size_t>(heads) * kTile);
  m.resize(heads);
  l.resize(heads);
  const float* q = q_row_f32 + static_cast<size_t>(h0) * group * kDim;
  const uint16_t* q_bf16 = s.q_bf16.data() + static_cast<size_t>(h0) * group * kDim;

  // The work after this one: its keys are requested during q.k, slot for slot, and its
  // values during p.v, so that its reads spread over all of this tile's work.
  const int64_t after_offset = static_cast<int64_t>(after.h0) * kDim;
  const int after_bytes = after.n > 0 ? (after.h1 - after.h0) * kDim * 2 : 0;
  // q.k, slot by slot.
  for (int j = 0; j < n; ++j) {
    const uint16_t* k_run = k_cache + slots[j] * slot_stride + h0 * kDim;
    if (!cached) PrefetchLinesL2(v_cache + slots[j] * slot_stride + h0 * kDim, run_bytes);
    if (j < after.n && after_bytes > 0) {
      PrefetchLinesL2(k_cache + after.slots[j] * slot_stride + after_offset, after_bytes);
    }
    for (int kvh = 0; kvh < h1 - h0; ++kvh) {
      const uint16_t* k = k_run + kvh * kDim;
      // This head's keys in the next slot, into L1 now: where a slot's work is long (many
      // query heads), the out-of-order window does not reach the next slot's loads by
      // itself and each new line of keys stalls the dots (64 query heads over 8 KV heads:
      // 0.82-0.87x the time; 0.95-1.02x at 2-32 heads; docs/benchmarks.md, "GQA
      // attention against a compute probe").
      if (j + 1 < n && !cached) {
        PrefetchLines(k_cache + slots[j + 1] * slot_stride + (h0 + kvh) * kDim, kDim * 2);
      }
      for (int g0 = 0; g0 < group; g0 += kHeadsAtOnce) {
        const size_t h = static_cast<size_t>(kvh * group + g0);
        float* out = scores.data() + h * kTile + j;
        WithCount<kHeadsAtOnce>(group - g0, [&](auto heads_now) {
          KeyDots<Ops, kKv, kDim, decltype(heads_now)::value>(q + h * kDim, q_bf16 + h * kDim, k,
                                                              p.scale, out);
        });
      }
    }
  }
  // Softmax numerators, per head.
  for (int h = 0; h < heads; ++h) {
    float* sc = scores.data() + static_cast<size_t>(h) * kTile;
    for (int j = n; j < kTile; ++j) sc[j] = kNegInf;
    V vmax = Ops::Set1(kNegInf);
    for (int j = 0; j < kTile; j += L) vmax = Ops::Max(vmax, Ops::Load(sc + j));
    m[h] = Ops::ReduceMax(vmax);
    const V vm = Ops::Set1(m[h]);
    V vsum = Ops::Zero();
    for (int j = 0; j < kTile; j += L) {
      const V e = Ops::Exp(Ops::Sub(Ops::Load(sc + j), vm));
      Ops::Store(sc + j, e);
      vsum = Ops::Add(vsum, e);
    }
    l[h] = Ops::ReduceAdd(vsum);
  }
  // Keys of the work after this one that q.k had no slot for (this tile is shorter).
  for (int j = n; j < after.n && after_bytes > 0; ++j) {
    PrefetchLinesL2(k_cache + after.slots[j] * slot_stride + after_offset, after_bytes);
  }
  // p.v over the tile's V lines, already requested. Where the sums of all the query heads
  // of a KV head over all its value chunks fit in half the vector registers (kSumRegs:
  // AVX-512 has 32, AVX2 16), one pass of ValueSums takes them (MHA, small groups);
  // otherwise ValueSumPasses takes up to kSumRegs heads a pass over part of the chunks, so
  // that each chunk of a slot's values is widened once per pass of heads, not once per few
  // heads (docs/benchmarks.md, "p.v over all of a KV head's query heads at once"). Each KV
  // head requests the values of its share of the next work's slots, a line every few of its
  // steps (the steps of all its passes), so that they spread over the whole of p.v.
  constexpr int kSumRegs = ValueSumRegs<Ops>();
  constexpr int kOnePassHeads = OnePassHeads<Ops, kDim>();
  const int passes = kPasses ? ValueSumPassCount(kChunks, kSumRegs, group) : 1;
  const int lines_per_slot = after_bytes / 64;
  for (int kvh = 0; kvh < h1 - h0; ++kvh) {
    const auto [j0, j1] = EvenShare(after.n, kvh, h1 - h0);
    Spread spread(static_cast<int64_t>(j1 - j0) * lines_per_slot, static_cast<int64_t>(passes) * n);
    int at_slot = j0, at_line = 0;  // the next line to request
    auto request = [&] {
      spread.Step([&] {
        PrefetchLinesL2(v_cache + after.slots[at_slot] * slot_stride + after_offset + at_line * 32,
                        64);
        if (++at_line == lines_per_slot) {
          at_line = 0;
          ++at_slot;
        }
      });
    };
    const uint16_t* v_base = v_cache + (h0 + kvh) * kDim;
    const float* sc = scores.data() + static_cast<size_t>(kvh) * group * kTile;
    if constexpr (!kPasses) {
      assert(group <= kOnePassHeads);  // TileHeads chooses kPasses
      WithCount<kOnePassHeads>(group, [&](auto heads_now) {
        ValueSums<Ops, kKv, kDim, decltype(heads_now)::value, kChunks>(
            sc, v_base, slots, n, slot_stride, 0, s.acc.data(), request);
      });
    } else {
      ValueSumPasses<Ops, kKv, kDim, kSumRegs>(sc, v_base, slots, n, slot_stride, group,
                                               s.acc.data(), request);
    }
    for (int g = 0; g < group; ++g) {
      s.m[g] = m[kvh * group + g];
      s.l[g] = l[kvh * group + g];
    }
    sink(h0 + kvh);
  }
}

// KV heads [h0, h1) of tile `tile` of `row`, as the NextKeys of the work before it (k_base:
// head h0).
inline NextKeys TileKeys(const AttentionParams& p, const AttentionRow& row, int tile, int h0,
                         int h1, const uint16_t* k_cache) {
  const int pos0 = tile * kTile;
  return {row.slots + pos0, std::min(kTile, row.kv_end - pos0), k_cache + h0 * p.head_dim, h0, h1};
}

// Where a thread starts on keys no earlier work announced, the K lines of the heads after
// the first are requested at once, so that their DRAM latencies overlap instead of
// chaining head after head (which dominated short contexts).
inline void PrefetchTileStart(const AttentionParams& p, const AttentionRow& row, int tile, int h0,
                              int h1, const uint16_t* k_cache) {
  const int64_t slot_stride = static_cast<int64_t>(p.num_kv_heads) * p.head_dim;
  const int pos0 = tile * kTile;
  const int n = std::min(kTile, row.kv_end - pos0);
  for (int j = 0; j < n; ++j) {
    PrefetchLines(k_cache + row.slots[pos0 + j] * slot_stride + (h0 + 1) * p.head_dim,
                  (h1 - h0 - 1) * p.head_dim * 2);
  }
}

// TileHeads for a head size known only at run time: head by head.
template <class Ops, KvDType kKv, class Sink>
void TileHeadsByHead(const AttentionParams& p, const float* q_row_f32, const AttentionRow& row,
                     int tile, int h0, int h1, const NextKeys& after, const uint16_t* k_cache,
                     const uint16_t* v_cache, ItemScratch& s, Sink&& sink) {
  const int d = p.head_dim;
  const int group = p.num_heads / p.num_kv_heads;
  const int64_t slot_stride = static_cast<int64_t>(p.num_kv_heads) * d;
  // The keys after these heads (`after`), for all of its KV heads at once: each slot's
  // heads are one contiguous run of K and one of V (the whole slot when `after` reads every
  // head), which DRAM serves far better than the per-head pieces the kernels read. Spread
  // over the heads of this tile, one share of the slots each, so that the requests are in
  // flight while this tile computes.
  const int64_t run_offset = static_cast<int64_t>(after.h0) * d;
  const int run_bytes = (after.h1 - after.h0) * d * 2;
  const int heads = h1 - h0;
  for (int kvh = h0; kvh < h1; ++kvh) {
    if (after.n > 0 && run_bytes > 0) {
      const Share share = EvenShare(after.n, kvh - h0, heads);
      for (int j = share.begin; j < share.end; ++j) {
        const int64_t at = after.slots[j] * slot_stride + run_offset;
        PrefetchLinesL2(k_cache + at, run_bytes);
        PrefetchLinesL2(v_cache + at, run_bytes);
      }
    }
    const NextKeys next = kvh + 1 < h1 ? TileKeys(p, row, tile, kvh + 1, h1, k_cache) : after;
    const size_t q_offset = static_cast<size_t>(kvh) * group * d;
    TileState<Ops, kKv>(d, group, p.scale, row, tile, q_row_f32 + q_offset,
                        s.q_bf16.data() + q_offset, k_cache + kvh * d, v_cache + kvh * d,
                        slot_stride, next, s);
    sink(kvh);
  }
}

// Computes tile `tile` of one row for KV heads [h0, h1), handing each head's tile state
// (in s.acc/s.m/s.l) to sink(kvh). `after` names the keys the caller reads next.
template <class Ops, KvDType kKv, int kDim, class Sink>
void TileHeads(const AttentionParams& p, const float* q_row_f32, const AttentionRow& row, int tile,
               int h0, int h1, const NextKeys& after, bool cached, const uint16_t* k_cache,
               const uint16_t* v_cache, ItemScratch& s, Sink&& sink) {
  if constexpr (kDim > 0) {
    if (p.num_heads / p.num_kv_heads <= OnePassHeads<Ops, kDim>()) {
      TileHeadsSlotMajor<Ops, kKv, kDim, false>(p, q_row_f32, row, tile, h0, h1, after, cached,
                                                k_cache, v_cache, s, std::forward<Sink>(sink));
    } else {
      TileHeadsSlotMajor<Ops, kKv, kDim, true>(p, q_row_f32, row, tile, h0, h1, after, cached,
                                               k_cache, v_cache, s, std::forward<Sink>(sink));
    }
  } else {
    TileHeadsByHead<Ops, kKv>(p, q_row_f32, row, tile, h0, h1, after, k_cache, v_cache, s,
                              std::forward<Sink>(sink));
  }
}

// Rows b right after a in one prompt chunk: the same slot table, the next position, the
// same first tile and at least as many tiles, both with tiles to fold.
inline bool SameChunk(const AttentionRow& a, const AttentionRow& b) {
  return b.slots == a.slots && b.kv_end == a.kv_end + 1 && b.tile_begin == a.tile_begin &&
         b.tile_end >= a.tile_end && a.tile_end > a.tile_begin;
}
// Query heads per KV head that a block of prompt rows takes at once (FoldImpl): 16 rows of
// MHA, 2 of a group of 8.
inline constexpr int kChunkHeads = 16;

// Splits the work over the OpenMP team. When there are enough rows, each thread folds
// whole rows (its range of them, then what is left of another's: work_ranges.h), tile by
// tile in ascending order, every KV head of a tile before the next
// tile (a tile of a row is one contiguous run of KV slots when the scheduler placed it
// so). Otherwise ("split-K") the states of (row, tile, block of KV heads) units are
// computed in parallel into scratch and folded afterwards in ascending tile order, which
// gives the same bits.
template <class Ops, KvDType kKv, int kDim>
int FoldImpl(const AttentionParams& p, int num_rows, const uint16_t* q, const AttentionRow* rows,
             const void* k_cache_v, const void* v_cache_v, float* state) {
  const auto* k_cache = static_cast<const uint16_t*>(k_cache_v);
  const auto* v_cache = static_cast<const uint16_t*>(v_cache_v);
  const int d = p.head_dim;
  const int group = p.num_heads / p.num_kv_heads;
  const int num_threads = omp_get_max_threads();
  const size_t row_q = static_cast<size_t>(p.num_heads) * d;
  int64_t total_tiles = 0;
  for (int r = 0; r < num_rows; ++r) {
    const AttentionRow& row = rows[r];
    if (row.tile_end <= row.tile_begin) continue;  // nothing to fold for this row
    if (row.tile_begin < 0 || row.kv_end <= 0 || row.tile_end > AttentionNumTiles(row.kv_end) ||
        row.slots == nullptr) {
      return kAttentionBadRow;
    }
    total_tiles += row.tile_end - row.tile_begin;
  }
  auto state_at = [&](int r, int kvh) {
    return state + (static_cast<size_t>(r) * p.num_heads + kvh * group) * (d + 2);
  };
  // `n` query elements from `from` into s's queries at element `to`: as f32, and as given
  // where q.k runs on bf16 dot products.
  auto load_q_part = [&](const uint16_t* from, size_t n, ItemScratch& s, size_t to) {
    for (size_t i = 0; i < n; ++i) s.q[to + i] = Bf16ToFloat(from[i]);
    if constexpr (kBf16Dots<Ops, kKv>) std::copy_n(from, n, s.q_bf16.data() + to);
  };
  auto load_q = [&](int r, ItemScratch& s) { load_q_part(q + r * row_q, row_q, s, 0); };
  // Merges s's tile states of heads [first, first + group) into one row's states of a KV
  // head at st.
  auto merge_tile = [&](float* st, const ItemScratch& s, int first = 0) {
    for (int g = 0; g < group; ++g) {
      const int h = first + g;
      MergeInto<Ops>(d, st + static_cast<size_t>(g) * (d + 2), s.m[h], s.l[h],
                     s.acc.data() + static_cast<size_t>(h) * d);
    }
  };

  const bool split_k = num_threads > 1 && num_rows < 2 * num_threads && total_tiles > num_rows;
  if (!split_k) {
    // Rows go through the ranges as split-K's units do below: each thread takes its own
    // rows front first, so the last tile of a row requests the first tile of the row it
    // takes next. (schedule(dynamic) did not know that row, and each row's first tile
    // started cold: about 1.05x the time at context 128, where rows are 2 tiles long;
    // docs/benchmarks.md, "Attention announces the next row".)
    // Work items: single rows, and (head sizes 64 and 128) blocks of up to kChunkHeads /
    // group consecutive rows of one prompt chunk (SameChunk), whose tiles that every row of the
    // block reads whole are folded for the block at once: its rows' query heads of a KV
    // head are taken as one group, so each key and value of such a tile is loaded once for
    // the block instead of once per row. Each (row, head) keeps its own arithmetic, term for
    // term, and each row folds its tiles in ascending order, so the bits are those of the
    // rows one by one.
    const int chunk_rows = kDim > 0 ? std::max(1, kChunkHeads / group) : 1;
    std::vector<std::pair<int, int>> item_list;  // [first row, rows]
    for (int r = 0; r < num_rows;) {
      int count = 1;
      while (count < chunk_rows && r + count < num_rows &&
             SameChunk(rows[r + count - 1], rows[r + count])) {
        ++count;
      }
      item_list.push_back({r, count});
      r += count;
    }
    const std::pair<int, int>* items = item_list.data();
    WorkRanges& work = CallerWorkRanges();
    work.Reset(static_cast<int64_t>(item_list.size()), num_threads);
#pragma omp parallel num_threads(num_threads)
    {
      EnableFlushToZero();
      thread_local ItemScratch s, block;
      s.Reserve(p.num_heads, group, d);
      const int id = omp_get_thread_num();
      int64_t warmed = -1;  // the item whose first tile the previous item's last one requested
      AttentionRow last;    // the row this thread folded last
      // Folds tiles [first, row.tile_end) of row r (s holds its query). `announce`: its
      // last tile requests the first tile of the item the thread takes next.
      auto fold_row = [&](int r, int first, bool cached, bool announce) {
        const AttentionRow& row = rows[r];
        for (int t = first; t < row.tile_end; ++t) {
          NextKeys after;
          if (t + 1 < row.tile_end) {
            if (!cached) after = TileKeys(p, row, t + 1, 0, p.num_kv_heads, k_cache);
          } else if (const int64_t following = announce ? work.PeekFront(id) : -1; following >= 0) {
            // The next item's first tile, unless it is this sequence's: this row just read it.
            const AttentionRow& next_row = rows[items[following].first];
            if (next_row.tile_end > next_row.tile_begin && next_row.slots != row.slots) {
              after = TileKeys(p, next_row, next_row.tile_begin, 0, p.num_kv_heads, k_cache);
              warmed = following;
            }
          }
          TileHeads<Ops, kKv, kDim>(p, s.q.data(), row, t, 0, p.num_kv_heads, after, cached,
                                    k_cache, v_cache, s,
                                    [&](int kvh) { merge_tile(state_at(r, kvh), s); });
        }
      };
      for (int64_t item = work.Next(id); item >= 0; item = work.Next(id)) {
        const int r0 = items[item].first, count = items[item].second;
        const AttentionRow& row = rows[r0];
        if (row.tile_end <= row.tile_begin) continue;
        // A row of the sequence this thread just folded, over the same tiles or one more
        // (the rows of a prompt chunk, in order): its keys and values are in cache, the
        // tile past the last row's written in this very step, and the requests only cost
        // their instructions (docs/benchmarks.md, "A prompt chunk's rows fold their tiles
        // without requests").
        const bool cached = row.slots == last.slots && row.tile_begin >= last.tile_begin &&
                            row.tile_end <= last.tile_end + 1;
        last = rows[r0 + count - 1];
        if (item != warmed && !cached) {
          PrefetchTileStart(p, row, row.tile_begin, 0, p.num_kv_heads, k_cache);
        }
        warmed = -1;
        if (count == 1) {
          load_q(r0, s);
          fold_row(r0, row.tile_begin, cached, /*announce=*/true);
          continue;
        }
        // The block's shared tiles: those whole for its first row (the shortest).
        const int shared_end = std::min(row.tile_end, row.kv_end / kTile);
        if (shared_end > row.tile_begin) {
          AttentionParams bp = p;
          bp.num_heads = p.num_heads * count;
          block.Reserve(bp.num_heads, group * count, d);
          // The block's queries as heads of one row: KV head kvh's group is its rows' heads
          // of kvh, row by row.
          const size_t group_q = static_cast<size_t>(group) * d;
          for (int i = 0; i < count; ++i) {
            for (int kvh = 0; kvh < p.num_kv_heads; ++kvh) {
              load_q_part(q + (r0 + i) * row_q + kvh * group_q, group_q, block,
                          (static_cast<size_t>(kvh) * count + i) * group_q);
            }
          }
          for (int t = row.tile_begin; t < shared_end; ++t) {
            NextKeys after;
            if (t + 1 < shared_end && !cached) {
              after = TileKeys(p, row, t + 1, 0, p.num_kv_heads, k_cache);
            }
            TileHeads<Ops, kKv, kDim>(bp, block.q.data(), row, t, 0, p.num_kv_heads, after, cached,
                                      k_cache, v_cache, block, [&](int kvh) {
                                        for (int i = 0; i < count; ++i)
                                          merge_tile(state_at(r0 + i, kvh), block, i * group);
                                      });
          }
        }
        // Then each row's own tiles past them, in order (after the first row's, in cache).
        for (int i = 0; i < count; ++i) {
          load_q(r0 + i, s);
          fold_row(r0 + i, std::max(row.tile_begin, shared_end), cached || i > 0,
                   /*announce=*/i == count - 1);
        }
      }
    }
    return kAttentionOk;
  }

  // Split-K: units of (row, tile, block of KV heads), enough of them to balance the team.
  const int64_t want_units = 4LL * num_threads;
  const int blocks = static_cast<int>(
      std::clamp<int64_t>((want_units + total_tiles - 1) / total_tiles, 1, p.num_kv_heads));
  const int heads_per_block = (p.num_kv_heads + blocks - 1) / blocks;
  struct Unit {
    int r, tile, h0, h1;
    int64_t offset;  // into the tile-state scratch, in floats
  };
  const int64_t head_floats = static_cast<int64_t>(group) * (d + 2);
  std::vector<Unit> units;
  int64_t scratch_floats = 0;
  for (int r = 0; r < num_rows; ++r) {
    for (int t = rows[r].tile_begin; t < rows[r].tile_end; ++t) {
      for (int h0 = 0; h0 < p.num_kv_heads; h0 += heads_per_block) {
        const int h1 = std::min(p.num_kv_heads, h0 + heads_per_block);
        units.push_back({r, t, h0, h1, scratch_floats});
        scratch_floats += (h1 - h0) * head_floats;
      }
    }
  }
  std::vector<float> tile_states(scratch_floats);
  const int num_items = num_rows * p.num_kv_heads;
  std::vector<size_t> row_first(num_rows + 1, units.size());
  for (size_t u = units.size(); u-- > 0;) row_first[units[u].r] = u;
  // Units are of near-equal cost; each thread takes a contiguous range front first, so it
  // knows which keys it reads next, and one that is done takes units from the back of
  // another's (work_ranges.h): a thread the OS stops does not hold the team at the barrier.
  // Each unit has its own tile state, folded below in a fixed order: who computed a unit
  // does not change the result.
  const int64_t num_units = static_cast<int64_t>(units.size());
  WorkRanges& work = CallerWorkRanges();
  work.Reset(num_units, num_threads);
#pragma omp parallel num_threads(num_threads)
  {
    EnableFlushToZero();
    thread_local ItemScratch s;
    s.Reserve(p.num_heads, group, d);
    const int id = omp_get_thread_num();
    int loaded_row = -1;
    int64_t warmed = -1;  // the unit whose keys the previous one requested (`after`)
    for (int64_t u = work.Next(id); u >= 0; u = work.Next(id)) {
      const Unit& unit = units[u];
      if (unit.r != loaded_row) {
        load_q(unit.r, s);
        loaded_row = unit.r;
      }
      // The first unit, and one taken from another thread's range, starts cold.
      if (u != warmed) PrefetchTileStart(p, rows[unit.r], unit.tile, unit.h0, unit.h1, k_cache);
      NextKeys after;
      warmed = work.PeekFront(id);
      if (warmed >= 0) {
        const Unit& following = units[warmed];
        after = TileKeys(p, rows[following.r], following.tile, following.h0, following.h1, k_cache);
      }
      TileHeads<Ops, kKv, kDim>(
          p, s.q.data(), rows[unit.r], unit.tile, unit.h0, unit.h1, after, /*cached=*/false,
          k_cache, v_cache, s, [&](int kvh) {
            float* out = tile_states.data() + unit.offset + (kvh - unit.h0) * head_floats;
            for (int g = 0; g < group; ++g) {
              std::copy_n(s.acc.data() + static_cast<size_t>(g) * d, d, out + g * (d + 2));
              out[g * (d + 2) + d] = s.m[g];
              out[g * (d + 2) + d + 1] = s.l[g];
            }
          });
    }
    // Fold per (row, KV head), in ascending tile order.
#pragma omp barrier
#pragma omp for schedule(static)
    for (int item = 0; item < num_items; ++item) {
      const int r = item / p.num_kv_heads;
      const int kvh = item % p.num_kv_heads;
      float* st = state_at(r, kvh);
      for (size_t u = row_first[r]; u < units.size() && units[u].r == r; ++u) {
        if (kvh < units[u].h0 || kvh >= units[u].h1) continue;
        const float* ts = tile_states.data() + units[u].offset + (kvh - units[u].h0) * head_floats;
        for (int g = 0; g < group; ++g) {
          MergeInto<Ops>(d, st + static_cast<size_t>(g) * (d + 2), ts[g * (d + 2) + d],
                         ts[g * (d + 2) + d + 1], ts + g * (d + 2));
        }
      }
    }
  }
  return kAttentionOk;
}

// `by_head`: every head size through the head-by-head walk (TileState), which serves the
// sizes without a kernel of their own; for tests of the claim that the kernels of 64 and
// 128 give its bits.
template <class Ops>
int Fold(const AttentionParams& p, int num_rows, const uint16_t* q, const AttentionRow* rows,
         const void* k, const void* v, float* state, bool by_head = false) {
  const bool f16 = p.kv_dtype == KvDType::kF16;
  if (by_head) {
    return f16 ? FoldImpl<Ops, KvDType::kF16, 0>(p, num_rows, q, rows, k, v, state)
               : FoldImpl<Ops, KvDType::kBF16, 0>(p, num_rows, q, rows, k, v, state);
  }
  if (p.head_dim == 64) {
    return f16 ? FoldImpl<Ops, KvDType::kF16, 64>(p, num_rows, q, rows, k, v, state)
               : FoldImpl<Ops, KvDType::kBF16, 64>(p, num_rows, q, rows, k, v, state);
  }
  if (p.head_dim == 128) {
    return f16 ? FoldImpl<Ops, KvDType::kF16, 128>(p, num_rows, q, rows, k, v, state)
               : FoldImpl<Ops, KvDType::kBF16, 128>(p, num_rows, q, rows, k, v, state);
  }
  return f16 ? FoldImpl<Ops, KvDType::kF16, 0>(p, num_rows, q, rows, k, v, state)
             : FoldImpl<Ops, KvDType::kBF16, 0>(p, num_rows, q, rows, k, v, state);
}

template <class Ops>
void MergeStates(const AttentionParams& p, int num_rows, const float* src, float* dst) {
  const int d = p.head_dim;
  const int n = num_rows * p.num_heads;
#pragma omp parallel for schedule(static)
  for (int i = 0; i < n; ++i) {
    EnableFlushToZero();
    const float* s = src + static_cast<size_t>(i) * (d + 2);
    MergeInto<Ops>(d, dst + static_cast<size_t>(i) * (d + 2), s[d], s[d + 1], s);
  }
}

}  // namespace strata::kernels::attention_internal

#endif  // STRATA_KERNELS_CPU_ATTENTION_IMPL_H_
