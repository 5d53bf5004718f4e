// Where a decode step's time goes, operation by operation (prints figures; no assertion).
// Each timed step runs the forward pass as the compute node does (ForwardLayers, then
// Logits), with a profile attached to its buffers (ModelRunner's OpProfile) and attention
// timed around the backend; then it draws every row once under each sampling setting that
// clients use (sampler_bench's), in parallel over the team as the step engine does, in an
// order that rotates from step to step. The operations are sorted into
//   - the GEMMs: the linear layers and the LM head;
//   - attention;
//   - the rest: the embedding, norms, RoPE, rounding to bf16, SiLU, the gather before the
//     LM head, the draw, and whatever else of the step is neither a GEMM nor attention
//     (counted as the forward pass's time less the GEMMs' and attention's).
// Issue 16 holds the rest to under 5% of a batch-1 step, sampling with logprobs included,
// and the GEMMs (the LM head among them) to 85% of the read bound: each GEMM's weight bytes
// over its time are printed against a read probe taken before and after the steps.
// The step of a setting is the forward pass plus that setting's draw. Medians over the
// timed steps, per operation (the parts' medians need not add up to the step's).
//
//   bazel-bin/compute_node/bench/step_profile [--model=DIR] [--batch=1] [--ctx=256]
//       [--iters=60]
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "common/base/stopwatch.h"
#include "common/bench/median.h"
#include "common/bench/read_probe.h"
#include "compute_node/attention_backend.h"
#include "compute_node/bench/bench_model.h"
#include "compute_node/bench/filled_attention.h"
#include "compute_node/bench/sampling_settings.h"
#include "compute_node/model_runner.h"
#include "compute_node/model_weights.h"
#include "compute_node/sampler.h"
#include "kernels/cpu/isa.h"

ABSL_FLAG(std::string, model, "", "Model directory (default: generate the demo shape in /tmp)");
ABSL_FLAG(int, batch, 1, "Rows per step");
ABSL_FLAG(int, ctx, 256, "Context of every row");
ABSL_FLAG(int, iters, 60, "Timed steps (after 3 untimed ones)");

namespace strata {
namespace {

// The backend it wraps, with the time of all its calls (the step's set-up, each layer,
// the step's end) added up.
class TimedAttention : public AttentionBackend {
 public:
  explicit TimedAttention(AttentionBackend* inner) : inner_(inner) {}

  // f(), its time added to `seconds`.
  template <class F>
  std::invoke_result_t<F> Timed(F&& f) {
    const Stopwatch watch;
    auto result = f();
    seconds += watch.ElapsedSeconds();
    return result;
  }

  absl::Status BeginStep(const StepKvPlan& plan) override {
    return Timed([&] { return inner_->BeginStep(plan); });
  }
  absl::Status Attend(int layer, BatchBuffers& b, int64_t m) override {
    return Timed([&] { return inner_->Attend(layer, b, m); });
  }
  AttentionStepOutcome EndStep() override {
    return Timed([&] { return inner_->EndStep(); });
  }

  double seconds = 0;

 private:
  AttentionBackend* inner_;
};

// The weight bytes a GEMM operation reads in one step: every layer's, or the LM head's.
double WeightBytes(const ModelWeights& w, ForwardOp op) {
  if (op == ForwardOp::kLmHead) return static_cast<double>(w.lm_head->weight_bytes());
  double total = 0;
  for (const LayerWeights& l : w.layers) {
    const Linear* linear = op == ForwardOp::kQkv      ? l.qkv.get()
                           : op == ForwardOp::kO      ? l.o.get()
                           : op == ForwardOp::kGateUp ? l.gate_up.get()
                           : op == ForwardOp::kDown   ? l.down.get()
                                                      : nullptr;
    if (linear != nullptr) total += static_cast<double>(linear->weight_bytes());
  }
  return total;
}

int Run() {
  absl::StatusOr<bench::BenchModel> model = bench::LoadBenchModel(absl::GetFlag(FLAGS_model));
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
    return 1;
  }
  const ModelConfig& c = model->config;
  const int batch = absl::GetFlag(FLAGS_batch), ctx = absl::GetFlag(FLAGS_ctx);
  const int iters = absl::GetFlag(FLAGS_iters);
  const int64_t positions = ctx + iters + 8;
  ModelRunner runner(model->weights.get(), positions);
  auto local = bench::FilledLocalAttention(c, batch, positions);
  if (!local.ok()) return 1;
  TimedAttention attention(local->get());

  // The machine's streaming-read rate, before and after the steps (the figures of a step
  // follow it).
  const ReadProbe read_probe;
  std::vector<double> probe;
  for (int i = 0; i < 3; ++i) probe.push_back(read_probe.Measure());
  const std::vector<SamplingSetting> settings = ClientSamplingSettings();
  BatchBuffers buffers(c, batch);
  OpProfile profile;
  buffers.profile = &profile;
  std::vector<int32_t> tokens(batch, 100), rows(batch);
  for (int b = 0; b < batch; ++b) rows[b] = b;
  std::vector<float> logits(RowsCapacity(batch) * c.vocab_size);
  std::vector<SampleOutput> drawn(batch);
  // Per timed step: each operation's ms, attention's, and each setting's draw.
  std::vector<std::vector<double>> op_ms(kForwardOps), draw_ms(settings.size());
  std::vector<double> attention_ms, forward_ms;
  for (int it = 0; it < iters + 3; ++it) {
    const int position = ctx + it;
    const StepKvPlan plan = bench::FilledDecodePlan(batch, position);
    profile = OpProfile();
    attention.seconds = 0;
    const Stopwatch forward;
    if (!ForwardLayers(runner, attention, buffers, plan, tokens.data()).ok()) return 1;
    runner.Logits(buffers, rows, logits.data());
    const double forward_s = forward.ElapsedSeconds();
    // The settings take turns in an order that rotates from step to step, so that none
    // always follows the same other one (a draw's time depends on what ran before it).
    std::vector<double> draws(settings.size());
    for (size_t turn = 0; turn < settings.size(); ++turn) {
      const size_t k = (turn + static_cast<size_t>(it)) % settings.size();
      SamplingParams params = settings[k].params;
      params.seed = 1234;
      const Stopwatch watch;
#pragma omp parallel for schedule(dynamic, 1) if (batch > 1)
      for (int b = 0; b < batch; ++b) {
        SampleInput in;
        in.params = &params;
        in.output_position = it;
        drawn[b] = Sample(logits.data() + static_cast<size_t>(b) * c.vocab_size, c.vocab_size, in);
      }
      draws[k] = watch.ElapsedSeconds();
      if (params.greedy()) {  // the next step's tokens
        for (int b = 0; b < batch; ++b) tokens[b] = drawn[b].token;
      }
    }
    if (it < 3) continue;
    for (int op = 0; op < kForwardOps; ++op) op_ms[op].push_back(1e3 * profile.seconds[op]);
    attention_ms.push_back(1e3 * attention.seconds);
    forward_ms.push_back(1e3 * forward_s);
    for (size_t k = 0; k < settings.size(); ++k) draw_ms[k].push_back(1e3 * draws[k]);
  }

  const double probe_before = Median(probe);
  probe.clear();
  for (int i = 0; i < 3; ++i) probe.push_back(read_probe.Measure());
  std::printf("step profile: %s, batch %d, ctx %d, %d threads, %s kernels; medians of %d steps\n",
              model->dir.c_str(), batch, ctx, omp_get_max_threads(),
              kernels::CpuIsaName(kernels::ActiveCpuIsa()), iters);
  std::printf("read probe (all cores, loads only): %.1f GB/s before the steps, %.1f after\n",
              probe_before / 1e9, Median(probe) / 1e9);
  // A GEMM's weights read per second, and that rate over the probe (both readings' mean).
  const double probe_gbs = (probe_before + Median(probe)) / 2e9;
  std::printf("%-34s %9s %6s %9s %9s\n", "operation", "ms/step", "kind", "GB/s", "of_probe");
  for (int op = 0; op < kForwardOps; ++op) {
    const auto o = static_cast<ForwardOp>(op);
    if (IsGemm(o)) {
      const double gbs = WeightBytes(*model->weights, o) / Median(op_ms[op]) / 1e6;
      std::printf("%-34s %9.3f %6s %9.1f %9.2f\n", ForwardOpName(o), Median(op_ms[op]), "gemm", gbs,
                  gbs / probe_gbs);
    } else {
      std::printf("%-34s %9.3f %6s\n", ForwardOpName(o), Median(op_ms[op]), "rest");
    }
  }
  std::printf("%-34s %9.3f %6s\n", "attention", Median(attention_ms), "attn");
  for (size_t k = 0; k < settings.size(); ++k) {
    std::printf("%-34s %9.3f %6s\n", (std::string("draw: ") + settings[k].name).c_str(),
                Median(draw_ms[k]), "rest");
  }
  // Per step: the GEMMs, and the rest of the forward pass (the draw aside): all of it that
  // is neither a GEMM nor attention, the glue between operations and the profile's own
  // clock reads included.
  std::vector<double> gemm_ms(iters, 0.0), rest_ms(iters);
  for (int i = 0; i < iters; ++i) {
    for (int op = 0; op < kForwardOps; ++op) {
      if (IsGemm(static_cast<ForwardOp>(op))) gemm_ms[i] += op_ms[op][i];
    }
    rest_ms[i] = forward_ms[i] - gemm_ms[i] - attention_ms[i];
  }
  std::printf("\nforward pass %.3f ms: GEMMs %.3f, attention %.3f, rest %.3f (the draw aside)\n",
              Median(forward_ms), Median(gemm_ms), Median(attention_ms), Median(rest_ms));
  const double gemm_gbs =
      static_cast<double>(model->weights->gemm_weight_bytes()) / Median(gemm_ms) / 1e6;
  std::printf("GEMMs read their weights at %.1f GB/s, %.2f of the probe (target 0.85)\n", gemm_gbs,
              gemm_gbs / probe_gbs);
  std::printf("%-34s %9s %9s %9s %10s\n", "sampling", "step_ms", "draw_ms", "rest_ms", "rest_frac");
  for (size_t k = 0; k < settings.size(); ++k) {
    std::vector<double> step(iters), rest(iters), frac(iters);
    for (int i = 0; i < iters; ++i) {
      step[i] = forward_ms[i] + draw_ms[k][i];
      rest[i] = rest_ms[i] + draw_ms[k][i];
      frac[i] = rest[i] / step[i];
    }
    std::printf("%-34s %9.3f %9.3f %9.3f %10.3f\n", settings[k].name, Median(step),
                Median(draw_ms[k]), Median(rest), Median(frac));
  }
  std::printf("target: rest_frac under 0.05 at batch 1 (issue 16)\n");
  return 0;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return strata::Run();
}
