// Where a decode step's time goes, phase by phase (diagnostic, prints figures).
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <random>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "common/base/bfloat16.h"
#include "compute_node/attention_backend.h"
#include "compute_node/model_runner.h"
#include "compute_node/model_weights.h"

ABSL_FLAG(std::string, model, "/tmp/strata-bench-demo", "Model directory");
ABSL_FLAG(int, batch, 8, "Batch");
ABSL_FLAG(int, ctx, 256, "Context");

namespace strata {
namespace {
using Clock = std::chrono::steady_clock;
double Ms(Clock::time_point a) { return std::chrono::duration<double, std::milli>(Clock::now() - a).count(); }

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
    a.request_id = b + 1;
    for (int p = 0; p < ctx + 16; ++p) a.slots.push_back(b * (ctx + 16) + p);
    setup.assignments.push_back(a);
  }
  (*local)->BeginStep(setup);
  BatchBuffers b(c, batch);
  std::vector<int32_t> tokens(batch, 100), pos(batch, ctx);
  StepKvPlan plan;
  for (int i = 0; i < batch; ++i) plan.rows.push_back({static_cast<uint64_t>(i + 1), ctx, -1});
  (*local)->BeginStep(plan);
  double pre = 0, attn = 0, post = 0;
  for (int it = 0; it < 12; ++it) {
    runner.Embed(b, batch, tokens.data(), pos.data());
    for (int l = 0; l < c.num_layers; ++l) {
      auto t = Clock::now();
      runner.PreAttention(b, batch, l);
      if (it >= 2) pre += Ms(t);
      t = Clock::now();
      (*local)->Attend(l, b, batch);
      if (it >= 2) attn += Ms(t);
      t = Clock::now();
      runner.PostAttention(b, batch, l);
      if (it >= 2) post += Ms(t);
    }
  }
  std::printf("batch %d ctx %d per step: pre %.2f ms, attention %.2f ms, post %.2f ms (threads %d)\n", batch, ctx,
              pre / 10, attn / 10, post / 10, omp_get_max_threads());
  return 0;
}
}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return strata::Run();
}
