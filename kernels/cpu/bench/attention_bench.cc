// Attention kernel benchmark (prints figures; no assertion): decode rows over a
// token-granular KV cache, per instruction set, against a streaming-read probe of the
// same run. KV bytes are counted once (K and V of every attended position and KV head).
// FLOPs count the multiply-adds of q.k and p.v (2 per FMA; the softmax's exponentials
// aside), against an FMA probe of the same vector width beside each line: where GQA groups
// are large, attention does group-size FMAs per KV element loaded and becomes bound by
// arithmetic rather than by the memory (of_fma then says how near).
// Calls rotate through layers of KV that together far exceed the last-level cache, so that
// every call reads from DRAM, as in a real step where the weights stream in between. Slots
// are scattered in runs of 16 positions by default (--scatter_tokens), the scheduler's block
// size: harsher than the ledger's own layout after churn, whole tiles of 64 positions
// (server/bench/kv_layout_bench); --scatter_tokens=64 reads that layout.
// The KV cache holds bf16 by default; --kv_dtypes=bf16,f16 runs both element types.
// --prompt times the rows of one prompt chunk instead (a prefill step's attention).
//
//   bazel run -c opt //kernels/cpu/bench:attention_bench -- --batches=1,8,64 --contexts=256,2048
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/stopwatch.h"
#include "common/bench/filled_kv.h"
#include "common/bench/fma_probe.h"
#include "common/bench/int_list.h"
#include "common/bench/read_probe.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/isa.h"

ABSL_FLAG(std::string, batches, "1,8,64", "Rows per step");
ABSL_FLAG(std::string, contexts, "256,2048", "Context length of every row");
ABSL_FLAG(int, heads, 12, "Query heads");
ABSL_FLAG(int, kv_heads, 12, "KV heads");
ABSL_FLAG(int, head_dim, 64, "Head dimension");
ABSL_FLAG(int, rotate_mb, 512,
          "The cache rotates through layers of at least this many MB in all, so that every call "
          "reads from DRAM as in a real step");
ABSL_FLAG(std::string, isas, "", "Instruction sets to run (default: the active one)");
ABSL_FLAG(std::string, kv_dtypes, "bf16", "KV cache element types to run: bf16, f16 or both");
ABSL_FLAG(double, seconds, 2.0, "Approximate time per configuration and instruction set");
ABSL_FLAG(int, scatter_tokens, 16,
          "Slots come in runs of this many consecutive positions, the runs in random order over "
          "the whole cache: 16, the scheduler's block size, is harsher than the ledger's layout "
          "after churn (whole tiles of 64 positions; 64 reads that); 0: every row's slots in one "
          "contiguous run");
ABSL_FLAG(bool, prompt, false,
          "Rows are one prompt chunk instead: `batch` consecutive positions of one sequence "
          "ending at position ctx, each attending causally to those before it, as a prefill "
          "step computes them (KV_GB/s then counts the sequence's KV once)");
ABSL_FLAG(int, layout_streams, 4,
          "Runs the read of a line's own KV (of_layout) takes at once, a block of each in turn");
ABSL_FLAG(bool, probe, true,
          "Measure the read and FMA probes (the of_probe and of_fma columns need them)");

namespace strata::kernels {
namespace {

// Every (instruction set, KV type) pair, instruction sets outermost.
std::vector<std::pair<CpuIsa, KvDType>> IsaAndKvPairs(const std::vector<CpuIsa>& isas,
                                                      const std::vector<KvDType>& kv_dtypes) {
  std::vector<std::pair<CpuIsa, KvDType>> pairs;
  for (CpuIsa isa : isas) {
    for (KvDType kv : kv_dtypes) pairs.emplace_back(isa, kv);
  }
  return pairs;
}

int Run() {
  AttentionParams p;
  p.num_heads = absl::GetFlag(FLAGS_heads);
  p.num_kv_heads = absl::GetFlag(FLAGS_kv_heads);
  p.head_dim = absl::GetFlag(FLAGS_head_dim);
  p.scale = 1.0f / std::sqrt(static_cast<float>(p.head_dim));
  std::vector<KvDType> kv_dtypes;
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_kv_dtypes), ',')) {
    KvDType dtype;
    std::string error;
    if (!ParseEnumName(name, kKvDTypeNames, &dtype, &error)) {
      std::fprintf(stderr, "--kv_dtypes: %s\n", error.c_str());
      return 2;
    }
    kv_dtypes.push_back(dtype);
  }
  // The probe is read beside each line, 2 passes just before its kernel runs and 2 just
  // after, and the line is reported against their median: the machine's bandwidth moves
  // within a run (one probe at the start put the same 64 x 2048 line at 0.49 and at 0.73
  // in two runs a minute apart).
  const int layout_streams = std::max(1, absl::GetFlag(FLAGS_layout_streams));
  std::unique_ptr<ReadProbe> read_probe;
  if (absl::GetFlag(FLAGS_probe)) read_probe = std::make_unique<ReadProbe>();
  auto probe_samples = [&](std::vector<double>* samples) {
    for (int i = 0; read_probe && i < 2; ++i) samples->push_back(read_probe->Measure());
  };
  std::printf(
      "read probe (all cores, loads only): 2 passes before and 2 after each line, of_probe "
      "against their median; the same loads over the line's own KV (every layer's K and V of "
      "each row's runs of consecutive slots, %d runs at a time): as often, of_layout against "
      "their median; "
      "FMA probe (all cores, registers only, the path's vector width): once before and once "
      "after, of_fma against their mean; %d threads; slots %s\n",
      layout_streams, omp_get_max_threads(),
      absl::GetFlag(FLAGS_scatter_tokens) > 0
          ? absl::StrCat("in runs of ", absl::GetFlag(FLAGS_scatter_tokens),
                         " positions, scattered")
                .c_str()
          : "contiguous per row");
  const std::vector<CpuIsa> isas = CpuIsasFromList(absl::GetFlag(FLAGS_isas));
  std::printf("%-11s %4s %6s %6s %9s %9s %8s %8s %7s %9s\n", "isa", "kv", "batch", "ctx",
              "layer_us", "KV_GB/s", "of_probe", "GFLOP/s", "of_fma", "of_layout");
  const int64_t row_elems = static_cast<int64_t>(p.num_kv_heads) * p.head_dim;
  for (int ctx : ParseIntList(absl::GetFlag(FLAGS_contexts))) {
    for (int batch : ParseIntList(absl::GetFlag(FLAGS_batches))) {
      const bool prompt = absl::GetFlag(FLAGS_prompt);
      if (prompt && batch > ctx) continue;
      // Positions each row attends: the whole context, or its prefix of the chunk.
      auto row_end = [&](int r) { return prompt ? ctx - batch + r + 1 : ctx; };
      const int64_t slots = prompt ? ctx : static_cast<int64_t>(batch) * ctx;
      const double kv_bytes = 2.0 * slots * row_elems * 2;
      double attended = 0;
      for (int r = 0; r < batch; ++r) attended += row_end(r);
      const double flops = 4.0 * attended * p.num_heads * p.head_dim;  // q.k and p.v FMAs
      const int layers =
          std::max(2, static_cast<int>(absl::GetFlag(FLAGS_rotate_mb) * 1e6 / kv_bytes + 0.999));
      const FilledKv kv_cache = MakeFilledKv(static_cast<size_t>(layers) * 2 * slots * row_elems);
      const uint16_t* kv = kv_cache.get();
      std::mt19937 rng(1);
      std::vector<uint16_t> q(static_cast<size_t>(batch) * p.num_heads * p.head_dim, 0x3f80);
      std::vector<int32_t> slot_table(slots);
      for (int64_t i = 0; i < slots; ++i) slot_table[i] = static_cast<int32_t>(i);
      if (const int run = absl::GetFlag(FLAGS_scatter_tokens); run > 0) {
        std::vector<int32_t> runs((slots + run - 1) / run);
        for (size_t i = 0; i < runs.size(); ++i) runs[i] = static_cast<int32_t>(i);
        std::shuffle(runs.begin(), runs.end(), rng);
        for (int64_t i = 0; i < slots; ++i) {
          const int64_t slot = static_cast<int64_t>(runs[i / run]) * run + i % run;
          slot_table[i] = static_cast<int32_t>(slot < slots ? slot : i);
        }
      }
      std::vector<AttentionRow> rows(batch);
      for (int r = 0; r < batch; ++r) {
        rows[r].slots = slot_table.data() + (prompt ? 0 : static_cast<int64_t>(r) * ctx);
        rows[r].kv_end = row_end(r);
      }
      // The KV the calls read, as runs of consecutive slots: each layer's K and V of every
      // row's runs (a prompt's rows share one), for the layout's own read bound.
      std::vector<ReadRun> layout;
      const int64_t positions = prompt ? ctx : slots;
      const size_t slot_bytes = static_cast<size_t>(row_elems) * 2;
      for (int l = 0; l < layers; ++l) {
        const uint16_t* k = kv + static_cast<size_t>(l) * 2 * slots * row_elems;
        for (int64_t i = 0, j = 0; i < positions; i = j) {
          // [i, j): one run of consecutive slots.
          for (j = i + 1; j < positions && slot_table[j] == slot_table[j - 1] + 1;) ++j;
          for (const uint16_t* base : {k, k + slots * row_elems}) {
            layout.push_back({base + static_cast<size_t>(slot_table[i]) * row_elems,
                              static_cast<size_t>(j - i) * slot_bytes});
          }
        }
      }
      std::vector<float> state(static_cast<size_t>(batch) * p.num_heads * (p.head_dim + 2));
      std::vector<uint16_t> out(q.size());
      for (const auto& [isa, kv_dtype] : IsaAndKvPairs(isas, kv_dtypes)) {
        if (!ForceCpuIsa(isa)) continue;
        p.kv_dtype = kv_dtype;
        // Calls per pass estimated at 10 GB/s of KV and 50 GFLOP/s, whichever is slower (a
        // prompt chunk is bound by its arithmetic).
        const double call_estimate = std::max(kv_bytes / 1e10, flops / 5e10);
        const int iters =
            std::max(3, static_cast<int>(absl::GetFlag(FLAGS_seconds) / (call_estimate * layers)));
        // The FMA probe at the width the path computes in, once before and once after.
        // (None for the scalar path, whose FMAs are whatever the compiler makes of them.)
        const int fma_bits = isa >= CpuIsa::kAvx512 ? 512 : isa == CpuIsa::kAvx2 ? 256 : 0;
        std::vector<double> probes, fma_peaks, layout_reads;
        auto sample = [&] {
          probe_samples(&probes);
          for (int i = 0; read_probe && i < 2; ++i)
            layout_reads.push_back(MeasureRunsRead(layout, layout_streams));
          if (read_probe && fma_bits > 0) fma_peaks.push_back(MeasureFmaPeak(fma_bits));
        };
        sample();
        double best = 1e30;
        for (int it = 0; it < iters + 1; ++it) {
          const Stopwatch watch;
          for (int l = 0; l < layers; ++l) {
            const uint16_t* k = kv + static_cast<size_t>(l) * 2 * slots * row_elems;
            Attention(p, batch, q.data(), rows.data(), k, k + slots * row_elems, state.data(),
                      out.data());
          }
          const double s = watch.ElapsedSeconds() / layers;
          if (it > 0) best = std::min(best, s);
        }
        sample();
        const double probe = probes.empty() ? 0.0 : Median(probes);
        const double layout_read = layout_reads.empty() ? 0.0 : Median(layout_reads);
        const double fma_peak =
            fma_peaks.empty() ? 0.0 : (fma_peaks.front() + fma_peaks.back()) / 2;
        std::printf("%-11s %4s %6d %6d %9.1f %9.1f %8.2f %8.1f %7.2f %9.2f\n", CpuIsaName(isa),
                    EnumNameOf(kv_dtype, kKvDTypeNames), batch, ctx, best * 1e6,
                    kv_bytes / best / 1e9, probe > 0 ? kv_bytes / best / probe : 0.0,
                    flops / best / 1e9, fma_peak > 0 ? flops / best / fma_peak : 0.0,
                    layout_read > 0 ? kv_bytes / best / layout_read : 0.0);
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace strata::kernels

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return strata::kernels::Run();
}
