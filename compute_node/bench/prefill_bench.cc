// Prefill benchmark on the demo shape (issue "CPU speed"): the prompt-processing rate that
// llama-bench reports as pp512. One sequence's prompt of `--prompts` tokens runs as one
// chunk from an empty context through every layer (GEMMs over all rows, causal attention
// over the chunk itself), then the LM head and a greedy draw for its last row only, as a
// served prefill does. Prints, per prompt length:
//   - tok/s: prompt tokens over the chunk's time (median over rounds);
//   - gemm_ms: the same chunk with attention skipped, and vs_gemm, the GEMM-only share;
//   - GFLOP/s: the GEMMs' multiply-adds (2 FLOP each; the LM head's one row included)
//     over the GEMM-only time.
// The machine is shared and drifts, so full and GEMM-only chunks run in interleaved
// rounds and medians are compared. Figures only: no assertion.
//
//   bazel run -c opt //compute_node/bench:prefill_bench -- [--model=DIR] [--prompts=128,512]
#include <omp.h>

#include <algorithm>
#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "common/base/stopwatch.h"
#include "common/bench/int_list.h"
#include "common/bench/median.h"
#include "compute_node/attention_backend.h"
#include "compute_node/bench/bench_model.h"
#include "compute_node/bench/filled_attention.h"
#include "compute_node/model_runner.h"
#include "compute_node/model_weights.h"
#include "compute_node/sampler.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa.h"

ABSL_FLAG(std::string, model, "", "Model directory (default: generate the demo shape in /tmp)");
ABSL_FLAG(std::string, prompts, "128,512", "Prompt lengths (tokens in one chunk)");
ABSL_FLAG(int, iters, 3, "Timed chunks per round");
ABSL_FLAG(int, rounds, 5, "Interleaved rounds (full, GEMM-only) per prompt length");

namespace strata {
namespace {

using bench::NoAttention;

int Run() {
  absl::StatusOr<bench::BenchModel> model = bench::LoadBenchModel(absl::GetFlag(FLAGS_model));
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
    return 1;
  }
  const ModelConfig& c = model->config;
  // Multiply-adds per prompt row in the layers' GEMMs: each weight element once per row.
  // The LM head (vocab x hidden) runs for the last row only.
  const double lm_head_elements = static_cast<double>(c.vocab_size) * c.hidden_size;
  const double layer_elements =
      static_cast<double>(model->weights->gemm_weight_bytes()) / 2.0 - lm_head_elements;
  std::printf(
      "prefill benchmark: %s, %.1fM parameters, %d threads, %s kernels (GEMM of wide "
      "batches: %s)\n",
      model->dir.c_str(), c.NumParameters() / 1e6, omp_get_max_threads(),
      kernels::CpuIsaName(kernels::ActiveCpuIsa()),
      kernels::GemmWideKernelName(kernels::ActiveGemmWideKernel()));
  std::printf(
      "one chunk per prompt from an empty context, LM head and draw for its last row; medians "
      "over %d interleaved rounds of full and GEMM-only chunks\n",
      absl::GetFlag(FLAGS_rounds));
  std::printf("%6s %9s %9s %9s %8s %9s\n", "prompt", "chunk_ms", "tok/s", "gemm_ms", "vs_gemm",
              "GFLOP/s");
  const int iters = absl::GetFlag(FLAGS_iters);
  for (int prompt : ParseIntList(absl::GetFlag(FLAGS_prompts))) {
    if (prompt < 1) continue;
    ModelRunner runner(model->weights.get(), prompt + 8);
    auto local = bench::FilledLocalAttention(c, 1, prompt + 8);
    if (!local.ok()) return 1;
    BatchBuffers buffers(c, prompt);
    std::vector<int32_t> tokens(prompt);
    for (int i = 0; i < prompt; ++i) tokens[i] = 3 + (i * 7919) % (c.vocab_size - 3);
    std::vector<float> logits(RowsCapacity(1) * c.vocab_size);
    const std::vector<int32_t> last_row = {prompt - 1};
    StepKvPlan plan;
    for (int i = 0; i < prompt; ++i) plan.rows.push_back({SequenceId(1), PoolIndex(0), i, -1});
    SamplingParams greedy;
    greedy.temperature = 0;
    NoAttention none;
    auto chunk = [&](AttentionBackend& attention) {
      if (!ForwardLayers(runner, attention, buffers, plan, tokens.data()).ok()) std::abort();
      runner.Logits(buffers, last_row, logits.data());
      SampleInput in;
      in.params = &greedy;
      if (Sample(logits.data(), c.vocab_size, in).token < 0) std::abort();
    };
    std::vector<double> full, gemm;
    auto time_chunks = [&](AttentionBackend& attention, std::vector<double>& out) {
      for (int i = 0; i < iters; ++i) {
        const Stopwatch watch;
        chunk(attention);
        out.push_back(watch.ElapsedSeconds());
      }
    };
    chunk(**local);  // warm-up (kernel buffers, packed shapes)
    chunk(none);
    for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
      time_chunks(**local, full);
      time_chunks(none, gemm);
    }
    const double full_s = Median(full);
    const double gemm_s = Median(gemm);
    const double flops = 2.0 * (layer_elements * prompt + lm_head_elements);
    std::printf("%6d %9.2f %9.1f %9.2f %8.2f %9.1f\n", prompt, full_s * 1e3, prompt / full_s,
                gemm_s * 1e3, gemm_s / full_s, flops / gemm_s / 1e9);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return strata::Run();
}
