// Decode benchmark on the demo shape (issue: foundation). Prints, for batch sizes 1, 8, 32
// and 64 at contexts 256 and 2048:
//   - tokens/s of a full decode step (all layers, LM head, greedy sampling);
//   - the same step with attention skipped ("GEMM-only"), and the ratio of the two;
//   - at batch 1, the fraction of the memory-bandwidth bound: the time to read the step's
//     weight and KV bytes at the read bandwidth of a streaming-read probe on all cores,
//     over the step's time;
//   - attention's cost in the step (full minus GEMM-only) and the KV read rate it implies,
//     against the same probe.
// The machine is shared and its bandwidth drifts, so full steps, GEMM-only steps and the
// probe are measured in interleaved rounds and medians are compared.
// The KV cache is filled with random values instead of a prefill; attention's cost does
// not depend on the values. Figures only: no assertion.
//
//   bazel run -c opt //compute_node/bench:decode_bench -- [--model=DIR] [--batches=1,8,32,64]
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "common/base/stopwatch.h"
#include "common/bench/int_list.h"
#include "common/bench/read_probe.h"
#include "compute_node/attention_backend.h"
#include "compute_node/bench/bench_model.h"
#include "compute_node/bench/filled_attention.h"
#include "compute_node/model_runner.h"
#include "compute_node/model_weights.h"
#include "compute_node/sampler.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa.h"

ABSL_FLAG(std::string, model, "", "Model directory (default: generate the demo shape in /tmp)");
ABSL_FLAG(std::string, batches, "1,8,32,64", "Batch sizes");
ABSL_FLAG(std::string, contexts, "256,2048", "Context lengths");
ABSL_FLAG(int, iters, 8, "Timed steps per round");
ABSL_FLAG(int, rounds, 5, "Interleaved rounds (full, GEMM-only, probe) per configuration");
ABSL_FLAG(std::string, kv_cache_dtype, "bf16", "The KV cache's element type: bf16 or f16");

namespace strata {
namespace {

using bench::NoAttention;

int Run() {
  const absl::StatusOr<DType> kv = ParseKvCacheType(absl::GetFlag(FLAGS_kv_cache_dtype));
  if (!kv.ok()) {
    std::fprintf(stderr, "--kv_cache_dtype: %s\n", std::string(kv.status().message()).c_str());
    return 1;
  }
  absl::StatusOr<bench::BenchModel> model = bench::LoadBenchModel(absl::GetFlag(FLAGS_model), *kv);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
    return 1;
  }
  const ModelConfig& c = model->config;
  const std::string& dir = model->dir;
  const int threads = omp_get_max_threads();
  const ReadProbe read_probe;
  std::vector<double> start_probe;
  for (int i = 0; i < 5; ++i) start_probe.push_back(read_probe.Measure());
  const double weight_bytes = static_cast<double>(model->weights->gemm_weight_bytes());
  const double kv_bytes_per_pos = 2.0 * c.num_layers * c.kv_size() * 2;
  std::printf(
      "decode benchmark: %s, %.1fM parameters, %d threads, %s kernels (GEMM of wide "
      "batches: %s)\n",
      dir.c_str(), c.NumParameters() / 1e6, threads, kernels::CpuIsaName(kernels::ActiveCpuIsa()),
      kernels::GemmWideKernelName(kernels::ActiveGemmWideKernel()));
  std::printf(
      "read probe (all cores, loads only): median %.1f GB/s at start, re-measured between "
      "rounds for each row; GEMM weights %.1f MB\n",
      Median(start_probe) / 1e9, weight_bytes / 1e6);
  std::printf(
      "figures are medians over %d interleaved rounds of full steps, GEMM-only steps and "
      "probes\n",
      absl::GetFlag(FLAGS_rounds));
  std::printf("%6s %6s %8s %9s %9s %9s %8s %10s %9s %8s %8s\n", "batch", "ctx", "probe", "step_ms",
              "tok/s", "gemm_ms", "vs_gemm", "bound_frac", "attn_ms", "KV_GB/s", "KV_frac");
  const int iters = absl::GetFlag(FLAGS_iters);
  for (int ctx : ParseIntList(absl::GetFlag(FLAGS_contexts))) {
    for (int batch : ParseIntList(absl::GetFlag(FLAGS_batches))) {
      ModelRunner runner(model->weights.get(), ctx + iters + 8);
      auto local = bench::FilledLocalAttention(c, batch, ctx + iters + 8);
      if (!local.ok()) return 1;
      BatchBuffers buffers(c, batch);
      std::vector<int32_t> tokens(batch, 100);
      std::vector<float> logits(RowsCapacity(batch) * c.vocab_size);
      std::vector<int32_t> rows(batch);
      for (int b = 0; b < batch; ++b) rows[b] = b;
      SamplingParams greedy;
      greedy.temperature = 0;
      NoAttention none;
      auto step = [&](AttentionBackend& attention, int position) {
        const StepKvPlan plan = bench::FilledDecodePlan(batch, position);
        if (!ForwardLayers(runner, attention, buffers, plan, tokens.data()).ok()) std::abort();
        runner.Logits(buffers, rows, logits.data());
        for (int b = 0; b < batch; ++b) {
          SampleInput in;
          in.params = &greedy;
          tokens[b] =
              Sample(logits.data() + static_cast<size_t>(b) * c.vocab_size, c.vocab_size, in).token;
        }
      };
      // Steps are timed one by one, full and GEMM-only in alternating rounds with a probe
      // between, and medians are compared: the machine is shared and its bandwidth drifts.
      std::vector<double> full_steps, gemm_steps, probes;
      auto time_steps = [&](AttentionBackend& attention, std::vector<double>& out) {
        for (int i = 0; i < iters; ++i) {
          const Stopwatch watch;
          step(attention, ctx + 1 + (i % 4));
          out.push_back(watch.ElapsedSeconds());
        }
      };
      step(**local, ctx);  // warm-up (primitive creation)
      step(none, ctx);
      for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
        probes.push_back(read_probe.Measure());
        time_steps(**local, full_steps);
        time_steps(none, gemm_steps);
      }
      const double full = Median(full_steps);
      const double gemm_only = Median(gemm_steps);
      const double probe = Median(probes);
      // Attention's cost inside a step is what the full step adds to the GEMM-only one
      // (KV writes included); its KV read rate follows.
      const double kv_read = batch * (ctx + 1) * kv_bytes_per_pos;
      const double attention = std::max(full - gemm_only, 1e-9);
      const double kv_rate = kv_read / attention;
      const double bound = (weight_bytes + kv_read) / probe;
      std::printf("%6d %6d %8.1f %9.2f %9.1f %9.2f %8.2f %10s %9.2f %8.1f %8.2f\n", batch, ctx,
                  probe / 1e9, full * 1e3, batch / full, gemm_only * 1e3, gemm_only / full,
                  batch == 1 ? std::to_string(bound / full).substr(0, 5).c_str() : "-",
                  attention * 1e3, kv_rate / 1e9, kv_rate / probe);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return strata::Run();
}
