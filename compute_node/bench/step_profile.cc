// Where a decode step's time goes (diagnostic, prints figures): pre-attention, attention
// and post-attention per step, then the same layers one operation at a time.
//
//   bazel run -c opt //compute_node/bench:step_profile -- --model=DIR --batch=1 --ctx=256
#include <omp.h>

#include <cstdio>
#include <random>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/time.h"
#include "common/base/bfloat16.h"
#include "common/base/stopwatch.h"
#include "compute_node/attention_backend.h"
#include "compute_node/model_runner.h"
#include "compute_node/model_weights.h"
#include "kernels/cpu/elementwise.h"

ABSL_FLAG(std::string, model, "/tmp/strata-bench-demo", "Model directory");
ABSL_FLAG(int, batch, 8, "Batch");
ABSL_FLAG(int, ctx, 256, "Context");
ABSL_FLAG(int, iters, 10, "Timed steps");

namespace strata {
namespace {
double Ms(const Stopwatch& watch) { return absl::ToDoubleMilliseconds(watch.Elapsed()); }

int Run() {
  auto config = LoadModelConfig(absl::GetFlag(FLAGS_model));
  auto weights = ModelWeights::Load(absl::GetFlag(FLAGS_model), *config);
  const ModelConfig& c = *config;
  const int batch = absl::GetFlag(FLAGS_batch), ctx = absl::GetFlag(FLAGS_ctx);
  ModelRunner runner(weights->get(), ctx + 16);
  auto local = LocalAttention::Create(c, batch * (ctx + 16), true);
  StepKvPlan setup;
  for (int b = 0; b < batch; ++b) {
    SlotAssignment a;
    a.request_id = SequenceId(b + 1);
    for (int p = 0; p < ctx + 16; ++p) a.slots.push_back(b * (ctx + 16) + p);
    setup.assignments.push_back(a);
  }
  (*local)->BeginStep(setup);
  BatchBuffers b(c, batch);
  std::vector<int32_t> tokens(batch, 100), pos(batch, ctx);
  StepKvPlan plan;
  for (int i = 0; i < batch; ++i)
    plan.rows.push_back({SequenceId(static_cast<uint64_t>(i + 1)), PoolIndex(0), ctx, -1});
  (*local)->BeginStep(plan);
  double pre = 0, attn = 0, post = 0;
  const int iters = absl::GetFlag(FLAGS_iters);
  for (int it = 0; it < iters + 2; ++it) {
    runner.Embed(b, batch, tokens.data(), pos.data());
    for (int l = 0; l < c.num_layers; ++l) {
      Stopwatch watch;
      runner.PreAttention(b, batch, l);
      if (it >= 2) pre += Ms(watch);
      watch.Reset();
      (*local)->Attend(l, b, batch);
      if (it >= 2) attn += Ms(watch);
      watch.Reset();
      runner.PostAttention(b, batch, l);
      if (it >= 2) post += Ms(watch);
    }
  }
  std::printf(
      "batch %d ctx %d per step: pre %.2f ms, attention %.2f ms, post %.2f ms (threads %d)\n",
      batch, ctx, pre / iters, attn / iters, post / iters, omp_get_max_threads());
  // The same layers, one operation at a time (what PreAttention and PostAttention do).
  const ModelWeights& w = **weights;
  const int64_t qkv_width = c.q_size() + 2 * c.kv_size();
  std::vector<float> cos_table(static_cast<size_t>(ctx + 16) * c.head_dim / 2, 1.0f),
      sin_table(cos_table.size(), 0.0f);
  std::vector<std::pair<const char*, double>> ops = {
      {"input_norm", 0}, {"qkv", 0},       {"rope", 0},    {"to_bf16", 0},  {"attend", 0},
      {"o", 0},          {"post_norm", 0}, {"gate_up", 0}, {"silu_mul", 0}, {"down", 0}};
  for (int it = 0; it < iters + 2; ++it) {
    for (int l = 0; l < c.num_layers; ++l) {
      const LayerWeights& lw = w.layers[l];
      int op = 0;
      auto timed = [&](auto&& f) {
        const Stopwatch watch;
        f();
        if (it >= 2) ops[op].second += Ms(watch);
        ++op;
      };
      timed([&] {
        kernels::RmsNorm(batch, c.hidden_size, b.x.data(), lw.input_norm.data(), 1e-5f,
                         b.normed.data());
      });
      timed([&] { lw.qkv->Forward(batch, b.normed.data(), b.qkv.data(), false); });
      timed([&] {
        kernels::ApplyRope(batch, c.num_heads + c.num_kv_heads, c.head_dim, qkv_width,
                           b.positions.data(), cos_table.data(), sin_table.data(), b.qkv.data());
      });
      timed([&] {
        for (int r = 0; r < batch; ++r) {
          kernels::ConvertToBf16(c.q_size(), b.qkv.data() + r * qkv_width,
                                 b.q.data() + r * c.q_size());
          kernels::ConvertToBf16(c.kv_size(), b.qkv.data() + r * qkv_width + c.q_size(),
                                 b.k.data() + r * c.kv_size());
          kernels::ConvertToBf16(c.kv_size(),
                                 b.qkv.data() + r * qkv_width + c.q_size() + c.kv_size(),
                                 b.v.data() + r * c.kv_size());
        }
      });
      timed([&] { (void)(*local)->Attend(l, b, batch); });
      timed([&] { lw.o->Forward(batch, b.attn.data(), b.x.data(), true); });
      timed([&] {
        kernels::RmsNorm(batch, c.hidden_size, b.x.data(), lw.post_norm.data(), 1e-5f,
                         b.normed.data());
      });
      timed([&] { lw.gate_up->Forward(batch, b.normed.data(), b.gate_up.data(), false); });
      timed([&] { kernels::SiluMul(batch, c.intermediate_size, b.gate_up.data(), b.act.data()); });
      timed([&] { lw.down->Forward(batch, b.act.data(), b.x.data(), true); });
    }
  }
  for (const auto& [name, ms] : ops) std::printf("  %-10s %.3f ms/step\n", name, ms / iters);
  return 0;
}
}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return strata::Run();
}
