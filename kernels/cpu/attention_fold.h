// How one attention call's rows are split over the OpenMP team (FoldImpl): whole rows per
// thread, prompt rows in blocks, or (few rows) split-K units merged in tile order; the
// tile kernels it calls are in attention_impl.h. Private to kernels/cpu; see attention.h
// for the contract.
#ifndef STRATA_KERNELS_CPU_ATTENTION_FOLD_H_
#define STRATA_KERNELS_CPU_ATTENTION_FOLD_H_

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/base/bfloat16.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_impl.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/work_ranges.h"

namespace strata::kernels::attention_internal {

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
// `widened_dots`: q.k of bf16 keys on FMAs where the tile kernel takes 4 keys x 4 heads
// (ItemScratch::widened_dots); the same bits either way.
template <class Ops, KvDType kKv, int kDim>
int FoldImpl(const AttentionParams& p, int num_rows, const uint16_t* q, const AttentionRow* rows,
             const void* k_cache_v, const void* v_cache_v, float* state, bool widened_dots) {
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
  // `n` query elements (whole heads) from `from` into s's queries at element `to` (a
  // head's start): as f32, and as given where q.k runs on bf16 dot products; as f32 in the
  // pair-split order where those run on FMAs (the f32 query serves nothing else then).
  const bool widened = widened_dots && kBf16Dots<Ops, kKv> && kWidenable<kDim>;
  auto load_q_part = [&](const uint16_t* from, size_t n, ItemScratch& s, size_t to) {
    s.widened_dots = widened;
    if (widened) {
      for (size_t i = 0; i < n; ++i) s.q[to + SplitQueryIndex(i)] = Bf16ToFloat(from[i]);
    } else {
      for (size_t i = 0; i < n; ++i) s.q[to + i] = Bf16ToFloat(from[i]);
    }
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
    // Work items: single rows, and (head sizes 64, 80, 96, 128, 256) blocks of up to kChunkHeads /
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
// sizes without a kernel of their own; for tests of the claim that the kernels of 64, 80,
// 96, 128 and 256 give its bits. `widened_dots`: FoldImpl's.
template <class Ops>
int Fold(const AttentionParams& p, int num_rows, const uint16_t* q, const AttentionRow* rows,
         const void* k, const void* v, float* state, bool by_head = false,
         bool widened_dots = false) {
  const bool f16 = p.kv_dtype == KvDType::kF16;
  auto fold = [&](auto head_dim) {
    constexpr int kDim = decltype(head_dim)::value;
    return f16 ? FoldImpl<Ops, KvDType::kF16, kDim>(p, num_rows, q, rows, k, v, state, widened_dots)
               : FoldImpl<Ops, KvDType::kBF16, kDim>(p, num_rows, q, rows, k, v, state,
                                                     widened_dots);
  };
  if (!by_head && p.head_dim == 64) return fold(std::integral_constant<int, 64>());
  if (!by_head && p.head_dim == 128) return fold(std::integral_constant<int, 128>());
  if (!by_head && p.head_dim == 80) return fold(std::integral_constant<int, 80>());
  if (!by_head && p.head_dim == 96) return fold(std::integral_constant<int, 96>());
  if (!by_head && p.head_dim == 256) return fold(std::integral_constant<int, 256>());
  return fold(std::integral_constant<int, 0>());
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

#endif  // STRATA_KERNELS_CPU_ATTENTION_FOLD_H_
