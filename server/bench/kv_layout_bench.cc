// KV layout benchmark (prints figures; no assertion): the slot tables that serving's
// allocation leaves, and what attention over them costs. The same workload runs through
// the scheduler's KV ledger (KvPool, server/kv_manager.h) and through a plain LIFO free list
// (the ledger's policy before runs: every sequence's next slot the newest free one), and
// through the ledger with the prefix cache on ("KvPool+cache": finished sequences' blocks
// stay cached and idle, so once the pool has filled, fresh slots come from evictions, as in
// serving's steady state); then the demo shape's attention kernel reads each layout, and one
// with every sequence contiguous, in interleaved rounds.
//
// The workload: --sequences decode together, one slot each per step (as the scheduler's
// decode rows allocate); each starts with a prompt of 64 to ctx/2 positions allocated at
// once and finishes at a length drawn from [ctx/2, 3 ctx/2], when a new one takes its
// place. After --generations lengths' worth of steps the tables of the sequences then
// running are the layout. No prompts are shared, so there are no prefix hits: every
// sequence's slots are its own (KvPool+cache caches blocks only for eviction to take).
//
// Per layout it prints the mean run of consecutive slots in a table and the share of the
// full tiles (64 positions, the kernel's unit) that are one run, then the kernel's time
// per layer (medians of the rounds), its KV read rate, and the time over the free list's.
// --heads, --kv_heads, --head_dim and --kv_dtype set the attention's shape (default: the
// demo's, bf16).
//
//   bazel build -c opt //server/bench:kv_layout_bench
//   OMP_NUM_THREADS=2 bazel-bin/server/bench/kv_layout_bench --sequences=32 --ctx=2048
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "common/base/enum_names.h"
#include "common/base/stopwatch.h"
#include "common/bench/filled_kv.h"
#include "common/bench/read_probe.h"
#include "kernels/cpu/attention.h"
#include "server/kv_manager.h"

ABSL_FLAG(int, sequences, 32, "Sequences decoding together");
ABSL_FLAG(int, ctx, 2048, "Typical context: prompts up to ctx/2, lengths from ctx/2 to 3ctx/2");
ABSL_FLAG(double, pool_factor, 2.0,
          "Pool slots over sequences x ctx (the most the sequences hold at once is 1.5x that)");
ABSL_FLAG(int, generations, 4, "Steps to run before the snapshot, in units of ctx");
ABSL_FLAG(int, rounds, 5, "Interleaved timing rounds");
ABSL_FLAG(int, heads, 12, "Query heads (the demo shape)");
ABSL_FLAG(int, kv_heads, 12, "KV heads");
ABSL_FLAG(int, head_dim, 64, "Head dimension");
ABSL_FLAG(int, rotate_mb, 512,
          "Calls rotate through layers whose attended KV is at least this many MB in all, so "
          "that every call reads from DRAM as in a real step");
ABSL_FLAG(std::string, kv_dtype, "bf16", "KV cache element type: bf16 or f16");

namespace strata {
namespace {

constexpr int kTile = kernels::kAttentionTileTokens;

// The ledger's allocation before runs: a LIFO stack of free slots.
class LifoFreeList {
 public:
  explicit LifoFreeList(int64_t slots) {
    for (int64_t s = slots - 1; s >= 0; --s) free_.push_back(static_cast<int32_t>(s));
  }
  bool Allocate(int64_t n, std::vector<int32_t>* out) {
    if (n > static_cast<int64_t>(free_.size())) return false;
    for (int64_t i = 0; i < n; ++i) {
      out->push_back(free_.back());
      free_.pop_back();
    }
    return true;
  }
  void Unref(const std::vector<int32_t>& slots) {
    free_.insert(free_.end(), slots.begin(), slots.end());
  }

 private:
  std::vector<int32_t> free_;
};

// The ledger with the prefix cache on (serving's default): a finished sequence's full
// blocks stay cached, idle, so once the pool has filled, fresh slots come from evicting
// them (least recently used first).
class CachingPool {
 public:
  CachingPool(int64_t slots, int block_tokens)
      : pool_(PoolIndex(0), slots, block_tokens), block_tokens_(block_tokens) {}
  bool Allocate(int64_t n, std::vector<int32_t>* out) { return pool_.Allocate(n, out); }
  void Unref(const std::vector<int32_t>& table) {
    const std::vector<int32_t> tokens(block_tokens_, 0);
    for (size_t b = 0; b + block_tokens_ <= table.size(); b += block_tokens_) {
      const uint64_t hash = ++next_hash_;  // every block its own: no hits, only eviction
      if (pool_.InsertBlock(hash, tokens.data(), table.data() + b)) pool_.DropBlock(hash);
    }
    pool_.Unref(table);
  }

 private:
  KvPool pool_;
  int block_tokens_;
  uint64_t next_hash_ = 0;
};

template <class Pool>
std::vector<std::vector<int32_t>> Simulate(Pool& pool, int sequences, int ctx, int64_t steps) {
  std::mt19937 rng(7);  // the same workload for every pool
  auto uniform = [&](int lo, int hi) { return lo + static_cast<int>(rng() % (hi - lo + 1)); };
  struct Seq {
    std::vector<int32_t> table;
    int64_t target = 0;
  };
  std::vector<Seq> seqs(sequences);
  auto start = [&](Seq& s) {
    s.table.clear();
    s.target = uniform(ctx / 2, 3 * ctx / 2);
    if (!pool.Allocate(uniform(64, ctx / 2), &s.table)) {
      std::fprintf(stderr, "the pool ran out of slots: raise --pool_factor\n");
      std::exit(2);
    }
  };
  for (Seq& s : seqs) {
    start(s);
    // Staggered: the first generation ends at different times.
    s.target = uniform(static_cast<int>(s.table.size()) + 1, 3 * ctx / 2);
  }
  for (int64_t step = 0; step < steps; ++step) {
    for (Seq& s : seqs) {
      if (static_cast<int64_t>(s.table.size()) >= s.target) {
        pool.Unref(s.table);
        start(s);
      } else if (!pool.Allocate(1, &s.table)) {
        std::fprintf(stderr, "the pool ran out of slots: raise --pool_factor\n");
        std::exit(2);
      }
    }
  }
  std::vector<std::vector<int32_t>> tables;
  for (Seq& s : seqs) tables.push_back(std::move(s.table));
  return tables;
}

struct LayoutFigures {
  double mean_run = 0;     // positions per run of consecutive slots
  double whole_tiles = 0;  // share of full tiles that are one run
};

LayoutFigures Describe(const std::vector<std::vector<int32_t>>& tables) {
  int64_t positions = 0, runs = 0, tiles = 0, whole = 0;
  for (const auto& t : tables) {
    positions += static_cast<int64_t>(t.size());
    for (size_t p = 0; p < t.size(); ++p) runs += p == 0 || t[p] != t[p - 1] + 1 ? 1 : 0;
    for (size_t b = 0; b + kTile <= t.size(); b += kTile) {
      ++tiles;
      bool one = true;
      for (size_t p = b + 1; p < b + kTile; ++p) one = one && t[p] == t[p - 1] + 1;
      whole += one ? 1 : 0;
    }
  }
  return {runs > 0 ? static_cast<double>(positions) / runs : 0.0,
          tiles > 0 ? static_cast<double>(whole) / tiles : 0.0};
}

int Run() {
  const int sequences = absl::GetFlag(FLAGS_sequences);
  const int ctx = absl::GetFlag(FLAGS_ctx);
  if (sequences < 1 || ctx < 256) {
    std::fprintf(stderr, "--sequences must be at least 1 and --ctx at least 256\n");
    return 2;
  }
  const int64_t pool_slots = static_cast<int64_t>(
      std::ceil(absl::GetFlag(FLAGS_pool_factor) * sequences * ctx / kTile) * kTile);
  const int64_t steps = static_cast<int64_t>(absl::GetFlag(FLAGS_generations)) * ctx;

  struct Layout {
    std::string name;
    std::vector<std::vector<int32_t>> tables;
    std::vector<double> seconds;
  };
  std::vector<Layout> layouts(4);
  layouts[0].name = "free list";
  LifoFreeList lifo(pool_slots);
  layouts[0].tables = Simulate(lifo, sequences, ctx, steps);
  layouts[1].name = "KvPool";
  KvPool pool(PoolIndex(0), pool_slots, 16);
  layouts[1].tables = Simulate(pool, sequences, ctx, steps);
  layouts[2].name = "KvPool+cache";
  CachingPool caching(pool_slots, 16);
  layouts[2].tables = Simulate(caching, sequences, ctx, steps);
  layouts[3].name = "contiguous";
  int64_t next = 0;
  for (const auto& t : layouts[1].tables) {
    std::vector<int32_t> row(t.size());
    for (auto& s : row) s = static_cast<int32_t>(next++);
    layouts[3].tables.push_back(std::move(row));
  }

  kernels::AttentionParams p;
  p.num_heads = absl::GetFlag(FLAGS_heads);
  p.num_kv_heads = absl::GetFlag(FLAGS_kv_heads);
  p.head_dim = absl::GetFlag(FLAGS_head_dim);
  p.scale = 1.0f / std::sqrt(static_cast<float>(p.head_dim));
  if (std::string error;
      !ParseEnumName(absl::GetFlag(FLAGS_kv_dtype), kernels::kKvDTypeNames, &p.kv_dtype, &error)) {
    std::fprintf(stderr, "--kv_dtype: %s\n", error.c_str());
    return 2;
  }
  const int64_t row_elems = static_cast<int64_t>(p.num_kv_heads) * p.head_dim;
  int64_t positions = 0;
  for (const auto& t : layouts[1].tables) positions += static_cast<int64_t>(t.size());
  const double kv_bytes = 2.0 * positions * row_elems * 2;
  // Calls rotate through layers of K and V whose attended positions together exceed
  // --rotate_mb, far beyond the last-level cache, so that every call reads from DRAM.
  const int layers =
      std::max(2, static_cast<int>(std::ceil(absl::GetFlag(FLAGS_rotate_mb) * 1e6 / kv_bytes)));
  const FilledKv kv_cache = MakeFilledKv(static_cast<size_t>(layers) * 2 * pool_slots * row_elems);
  const uint16_t* kv = kv_cache.get();
  std::vector<uint16_t> q(static_cast<size_t>(sequences) * p.num_heads * p.head_dim, 0x3f80);
  std::vector<float> state(static_cast<size_t>(sequences) * p.num_heads * (p.head_dim + 2));
  std::vector<uint16_t> out(q.size());

  ReadProbe probe;
  std::vector<double> probes;
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    probes.push_back(probe.Measure());
    for (Layout& layout : layouts) {
      std::vector<kernels::AttentionRow> rows(sequences);
      for (int r = 0; r < sequences; ++r) {
        rows[r].slots = layout.tables[r].data();
        rows[r].kv_end = static_cast<int32_t>(layout.tables[r].size());
      }
      double best = 1e30;
      for (int it = 0; it < 6; ++it) {
        const Stopwatch watch;
        for (int l = 0; l < layers; ++l) {
          const uint16_t* k = kv + static_cast<size_t>(l) * 2 * pool_slots * row_elems;
          kernels::Attention(p, sequences, q.data(), rows.data(), k, k + pool_slots * row_elems,
                             state.data(), out.data());
        }
        if (it > 0) best = std::min(best, watch.ElapsedSeconds() / layers);
      }
      layout.seconds.push_back(best);
    }
  }
  std::printf(
      "%d sequences, context %d (%lld positions attended), pool of %lld slots, %lld steps of "
      "churn; %d/%d heads of %d, %s; %d threads; read probe median %.1f GB/s\n",
      sequences, ctx, static_cast<long long>(positions), static_cast<long long>(pool_slots),
      static_cast<long long>(steps), p.num_heads, p.num_kv_heads, p.head_dim,
      EnumNameOf(p.kv_dtype, kernels::kKvDTypeNames), omp_get_max_threads(), Median(probes) / 1e9);
  std::printf("%-13s %9s %11s %9s %8s %8s %13s\n", "layout", "mean_run", "whole_tiles", "layer_us",
              "KV_GB/s", "of_probe", "vs_free_list");
  const double lifo_time = Median(layouts[0].seconds);
  for (const Layout& layout : layouts) {
    const LayoutFigures f = Describe(layout.tables);
    const double t = Median(layout.seconds);
    std::printf("%-13s %9.1f %11.2f %9.1f %8.1f %8.2f %13.3f\n", layout.name.c_str(), f.mean_run,
                f.whole_tiles, t * 1e6, kv_bytes / t / 1e9, kv_bytes / t / Median(probes),
                lifo_time / t);
  }
  return 0;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return strata::Run();
}
