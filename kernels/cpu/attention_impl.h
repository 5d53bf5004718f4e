// The attention algorithm's tile kernels, written once over a SIMD "Ops" traits type and
// instantiated per instruction set (kernels_avx512bf16.cc, kernels_avx512.cc,
// kernels_avx2.cc, attention.cc for scalar): one row's tile for a range of KV heads, and
// the fold of a tile's state into a row's; their q.k and p.v over registers are in
// attention_dots.h. attention_fold.h splits a call's rows over the OpenMP team with them.
// Private to kernels/cpu; see attention.h for the contract.
//
// Ops is one of the traits in simd_ops.h. Its Exp returns exactly 0 for -inf and exactly
// 1 for 0, which makes merging into the empty state exact.
#ifndef STRATA_KERNELS_CPU_ATTENTION_IMPL_H_
#define STRATA_KERNELS_CPU_ATTENTION_IMPL_H_

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
#include "kernels/cpu/attention_dots.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/simd_ops.h"
#include "kernels/cpu/spread.h"
#include "kernels/cpu/static_count.h"

namespace strata::kernels::attention_internal {

// Per-thread scratch: one row's query and one (tile, KV head)'s state.
struct ItemScratch {
  // q.k of bf16 keys on f32 FMAs where the tile kernels take 4 heads at once (KeyDotsFourHeads;
  // `q` then holds the query in the pair-split order, SplitQueryIndex), instead of bf16 dot
  // products: the same bits; FoldImpl sets it where FMAs are the faster instruction.
  bool widened_dots = false;
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

// The lines that hold [p, p + bytes) (LinesHolding), into L1.
inline void PrefetchLines(const void* p, int bytes) {
  const char* c = LineOf(p);
  for (int i = 0, lines = LinesHolding(p, bytes); i < lines; ++i) __builtin_prefetch(c + 64 * i);
}

// The i-th of `parts` near-equal shares of [0, n): [n * i / parts, n * (i + 1) / parts).
struct Share {
  int begin, end;
};
inline Share EvenShare(int n, int i, int parts) { return {n * i / parts, n * (i + 1) / parts}; }

// Tile `tile` of a row: its slots, and how many positions it holds (1 to kTile; the last
// tile of a row may be short).
struct TileSlots {
  const int32_t* slots;
  int n;
};
inline TileSlots SlotsOfTile(const AttentionRow& row, int tile) {
  const int pos0 = tile * kTile;
  return {row.slots + pos0, std::min(kTile, row.kv_end - pos0)};
}

// Whether the n slots of a tile (n >= 1) are one run of consecutive slots, as the ledger
// hands them out, rather than scattered.
inline bool SlotsInOneRun(const int32_t* slots, int n) { return slots[n - 1] - slots[0] == n - 1; }

// Into L2 only (prefetcht1): the far prefetch of whole slots, ahead of the per-head one.
// `t2`: with prefetcht2, which on the Zen 5 these notes are measured on (where prefetcht1
// seems to fill L1 as prefetcht0 does) read grouped queries' KV 7-13% faster with bf16 and
// the demo shape's 0-8% slower (docs/benchmarks.md, "the slot prefetch with prefetcht2");
// on Intel cores both hints stop at L2.
inline void PrefetchLineL2(const char* line, bool t2) {
  if (t2) {
    __builtin_prefetch(line, 0, 1);
  } else {
    __builtin_prefetch(line, 0, 2);
  }
}
// The lines that hold [p, p + bytes) (LinesHolding). The kernels' requests of one line
// spread over their loops take PrefetchLineL2: this one's count of lines, inlined there,
// took their KV rate to 0.3-0.45 of what it was on grouped queries (attention_bench).
inline void PrefetchLinesL2(const void* p, int bytes, bool t2 = false) {
  const char* c = LineOf(p);
  for (int i = 0, lines = LinesHolding(p, bytes); i < lines; ++i) PrefetchLineL2(c + 64 * i, t2);
}

template <class Ops>
inline float ExpScalar(float x) {
  float out[Ops::kLanes];
  Ops::Store(out, Ops::Exp(Ops::Set1(x)));
  return out[0];
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
  const auto [slots, n] = SlotsOfTile(row, tile);

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

// The tile kernel when the head size is known at compile time (64, 80, 96, 128, 256): a tile
// of one row (`tile`; `one_run`: its slots are one run, SlotsInOneRun) for KV heads [h0, h1),
// the keys read slot by slot. A slot holds every KV head of one
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
void TileHeadsSlotMajor(const AttentionParams& p, const float* q_row_f32, TileSlots tile,
                        bool one_run, int h0, int h1, const NextKeys& after, bool cached,
                        const uint16_t* k_cache, const uint16_t* v_cache, ItemScratch& s,
                        Sink&& sink) {
  static_assert(kDim > 0);
  constexpr int L = Ops::kLanes;
  constexpr int kChunks = kDim / L;
  constexpr int kHeadsAtOnce = 4;  // query heads of one KV head whose dots stay in registers
  using V = typename Ops::V;
  const int group = p.num_heads / p.num_kv_heads;
  const int64_t slot_stride = static_cast<int64_t>(p.num_kv_heads) * kDim;
  const int heads = (h1 - h0) * group;  // query heads of this work
  const int32_t* const slots = tile.slots;
  const int n = tile.n;
  const int run_bytes = (h1 - h0) * kDim * 2;
  const bool t2 = group >= 4;  // grouped queries: the far prefetch with prefetcht2
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
  // q.k, slot by slot: each step's requests spread over its keys' dots. Where a KV head
  // serves 4 query heads or more (grouped queries, a prompt chunk's rows in blocks),
  // kLanes / 4 slots at a time, their dots reduced kLanes at once (KeyDotsFourHeads).
  // The far requests of slots [j, j + keys) (each slot's V run of these heads, and the K run
  // of the work after this one in the same slot), spread over `steps` calls of Request(),
  // one line a call, instead of issued at once before the step. A burst of a step's
  // requests (up to 16 slots' runs, hundreds of lines) fills the core's miss buffers and
  // the dots' own loads wait behind it. Spread, on the Zen 5 of docs/benchmarks.md ("Each
  // step's slot requests spread over its dots"), KV read 1.25-1.46x faster on slots
  // scattered in runs of 16 positions and 0.99-1.24x in runs of 64 (the ledger's whole
  // tiles; on the ledger's own layout grouped queries with bf16 keys came out about even).
  auto slot_requests = [&](int j, int keys, int steps) {
    static_assert(2 * L <= SpreadLines::kMaxRuns);
    SpreadLines runs;
    for (int t = j; t < j + keys; ++t) {
      if (!cached) runs.Add(v_cache + slots[t] * slot_stride + h0 * kDim, run_bytes);
      if (t < after.n) runs.Add(k_cache + after.slots[t] * slot_stride + after_offset, after_bytes);
    }
    runs.Begin(steps);
    return runs;
  };
  auto far_request = [t2](const char* line) { PrefetchLineL2(line, t2); };
  // Steps of up to kHeadsAtOnce query heads of one KV head in this work: the calls of
  // Request() in a step of the four-keys and the one-key walks.
  const int head_blocks = (h1 - h0) * ((group + kHeadsAtOnce - 1) / kHeadsAtOnce);
  // This head's keys in the next slots, into L1 now: where a slot's work is long (many
  // query heads), the out-of-order window does not reach the next slot's loads by itself
  // and each new line of keys stalls the dots (64 query heads over 8 KV heads: 0.82-0.87x
  // the time; 0.95-1.02x at 2-32 heads; docs/benchmarks.md, "GQA attention against a
  // compute probe").
  auto next_keys_to_l1 = [&](int kvh, int from, int to) {
    for (int jn = from; jn < to && jn < n && !cached; ++jn) {
      PrefetchLines(k_cache + slots[jn] * slot_stride + (h0 + kvh) * kDim, kDim * 2);
    }
  };
  constexpr int kKeysAtOnce = L / 4;
  const bool four_by_four = HasReduceAddAll<Ops>::value && group >= kHeadsAtOnce;
  for (int j = 0; j < n && four_by_four; j += kKeysAtOnce) {
    const int keys = std::min(kKeysAtOnce, n - j);
    auto requests = slot_requests(j, keys, head_blocks);
    for (int kvh = 0; kvh < h1 - h0; ++kvh) {
      // A short last step repeats its last key: the dots past n are set to -inf below.
      const uint16_t* k[kKeysAtOnce];
      for (int t = 0; t < kKeysAtOnce; ++t) {
        k[t] = k_cache + slots[j + std::min(t, keys - 1)] * slot_stride + (h0 + kvh) * kDim;
      }
      next_keys_to_l1(kvh, j + kKeysAtOnce, j + 2 * kKeysAtOnce);
      // A group's last 3 heads (groups of 7, 11, ...) take the same kernel with the fourth
      // head's vectors left zero: groups of 7 (28/4 heads of 128, 2 threads) took 0.79-0.81
      // of the time of one key at a time. The last 1 or 2 (groups of 5, 6) keep one key at a
      // time: padded to 4 heads they measured slower (docs/benchmarks.md, "A group's last
      // three heads 4 keys at a time").
      int g0 = 0;
      for (; group - g0 >= kHeadsAtOnce - 1; g0 += kHeadsAtOnce) {
        requests.Request(far_request);
        const size_t h = static_cast<size_t>(kvh * group + g0);
        if constexpr (HasReduceAddAll<Ops>::value) {
          WithCount<kHeadsAtOnce>(group - g0, [&](auto heads_now) {
            KeyDotsFourHeads<Ops, kKv, kDim, decltype(heads_now)::value>(
                q + h * kDim, q_bf16 + h * kDim, k, p.scale, s.widened_dots,
                scores.data() + h * kTile + j);
          });
        }
      }
      if (g0 >= group) continue;
      requests.Request(far_request);
      const size_t h = static_cast<size_t>(kvh * group + g0);
      for (int t = 0; t < keys; ++t) {
        WithCount<kHeadsAtOnce>(group - g0, [&](auto heads_now) {
          KeyDots<Ops, kKv, kDim, decltype(heads_now)::value>(
              q + h * kDim, q_bf16 + h * kDim, k[t], p.scale, scores.data() + h * kTile + j + t);
        });
      }
    }
  }
  // Fewer query heads a KV head (MHA decode rows) on a tile whose slots are not one run:
  // kLanes keys a step for each head, their dots reduced at once (KeyDotsOneHead). Many
  // independent keys a step keep more misses in flight where the slots are scattered
  // token by token: on AVX-512, 0.74 -> 0.88 of the read probe at 32 rows of 2048
  // (docs/benchmarks.md, "MHA rows 16 keys at a time"). A tile in one run reads sequential
  // lines, which the one-key walk with its requests into L1 serves better (on AVX-512, 32
  // rows of 2048 on contiguous slots: 0.93x the time with 16 keys a step). No requests into
  // L1 with many keys: they cost more than they saved.
  const bool lanes_of_keys = !four_by_four && HasReduceAddAll<Ops>::value && !one_run;
  for (int j = 0; j < n && lanes_of_keys; j += L) {
    const int keys = std::min(L, n - j);
    auto requests = slot_requests(j, keys, (h1 - h0) * group);
    for (int kvh = 0; kvh < h1 - h0; ++kvh) {
      const uint16_t* k[L];  // a short last step repeats its last key, as above
      for (int t = 0; t < L; ++t) {
        k[t] = k_cache + slots[j + std::min(t, keys - 1)] * slot_stride + (h0 + kvh) * kDim;
      }
      for (int g = 0; g < group; ++g) {
        requests.Request(far_request);
        const size_t h = static_cast<size_t>(kvh * group + g);
        if constexpr (HasReduceAddAll<Ops>::value) {
          KeyDotsOneHead<Ops, kKv, kDim>(q + h * kDim, q_bf16 + h * kDim, k, p.scale,
                                         scores.data() + h * kTile + j);
        }
      }
    }
  }
  for (int j = 0; j < n && !four_by_four && !lanes_of_keys; ++j) {
    const uint16_t* k_run = k_cache + slots[j] * slot_stride + h0 * kDim;
    auto requests = slot_requests(j, 1, head_blocks);
    for (int kvh = 0; kvh < h1 - h0; ++kvh) {
      const uint16_t* k = k_run + kvh * kDim;
      next_keys_to_l1(kvh, j + 1, j + 2);
      for (int g0 = 0; g0 < group; g0 += kHeadsAtOnce) {
        requests.Request(far_request);
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
    PrefetchLinesL2(k_cache + after.slots[j] * slot_stride + after_offset, after_bytes, t2);
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
  // The V run of the work after this one in its slot j.
  auto after_values = [&](int j) { return v_cache + after.slots[j] * slot_stride + after_offset; };
  for (int kvh = 0; kvh < h1 - h0; ++kvh) {
    const auto [j0, j1] = EvenShare(after.n, kvh, h1 - h0);
    int64_t lines = 0;
    for (int j = j0; j < j1 && after_bytes > 0; ++j) {
      lines += LinesHolding(after_values(j), after_bytes);
    }
    Spread spread(lines, static_cast<int64_t>(passes) * n);
    int at_slot = j0, left = 0;  // the next slot, and the lines left to request of the one before
    const char* line = nullptr;  // the next line to request
    // Inlined into ValueSums, always: a call there, once a slot, spills every sum held in
    // registers around it (GCC left it out of line for bf16 values on AVX-512 and for head
    // size 80; docs/benchmarks.md, "p.v's request inlined").
    auto request = [&]() __attribute__((always_inline)) {
      spread.Step([&] {
        if (left == 0) {
          const uint16_t* run = after_values(at_slot++);
          line = LineOf(run);
          left = LinesHolding(run, after_bytes);
        }
        PrefetchLineL2(line, t2);
        line += 64;
        --left;
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
  const TileSlots t = SlotsOfTile(row, tile);
  return {t.slots, t.n, k_cache + h0 * p.head_dim, h0, h1};
}

// Where a thread starts on keys no earlier work announced, the K lines of the heads after
// the first are requested at once, so that their DRAM latencies overlap instead of
// chaining head after head (which dominated short contexts).
inline void PrefetchTileStart(const AttentionParams& p, const AttentionRow& row, int tile, int h0,
                              int h1, const uint16_t* k_cache) {
  const int64_t slot_stride = static_cast<int64_t>(p.num_kv_heads) * p.head_dim;
  const auto [slots, n] = SlotsOfTile(row, tile);
  for (int j = 0; j < n; ++j) {
    PrefetchLines(k_cache + slots[j] * slot_stride + (h0 + 1) * p.head_dim,
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
    const TileSlots slots = SlotsOfTile(row, tile);
    const bool one_run = SlotsInOneRun(slots.slots, slots.n);
    // MHA rows of head size 80, 96 or 256 on a tile whose slots are not one run: slots of
    // such heads walked kLanes keys a step read 0.87-0.99x (80), 0.68-0.95x (96) and
    // 0.91-1.08x (256) as fast as the head-by-head walk, so they keep it (the same bits;
    // docs/benchmarks.md, "A tile kernel for head size 80", "... 96" and "... 256").
    if ((kDim == 80 || kDim == 96 || kDim == 256) && p.num_heads == p.num_kv_heads && !one_run) {
      TileHeadsByHead<Ops, kKv>(p, q_row_f32, row, tile, h0, h1, after, k_cache, v_cache, s,
                                std::forward<Sink>(sink));
      return;
    }
    // One pass of p.v holds a head's sums over all its value chunks in registers: not where
    // they outnumber the registers (256 on AVX2: 32 chunks), which always take passes.
    if constexpr (kDim / Ops::kLanes <= 2 * ValueSumRegs<Ops>()) {
      if (p.num_heads / p.num_kv_heads <= OnePassHeads<Ops, kDim>()) {
        TileHeadsSlotMajor<Ops, kKv, kDim, false>(p, q_row_f32, slots, one_run, h0, h1, after,
                                                  cached, k_cache, v_cache, s,
                                                  std::forward<Sink>(sink));
        return;
      }
    }
    TileHeadsSlotMajor<Ops, kKv, kDim, true>(p, q_row_f32, slots, one_run, h0, h1, after, cached,
                                             k_cache, v_cache, s, std::forward<Sink>(sink));
  } else {
    TileHeadsByHead<Ops, kKv>(p, q_row_f32, row, tile, h0, h1, after, k_cache, v_cache, s,
                              std::forward<Sink>(sink));
  }
}

}  // namespace strata::kernels::attention_internal

#endif  // STRATA_KERNELS_CPU_ATTENTION_IMPL_H_
