#include "compute_node/bench/bench_model.h"

#include <utility>

#include "common/bench/demo_model.h"

namespace strata::bench {

absl::StatusOr<BenchModel> LoadBenchModel(const std::string& flag) {
  BenchModel model;
  absl::StatusOr<std::string> dir = BenchModelDir(flag);
  if (!dir.ok()) return dir.status();
  model.dir = *dir;
  absl::StatusOr<ModelConfig> config = LoadModelConfig(model.dir);
  if (!config.ok()) return config.status();
  model.config = *config;
  auto weights = ModelWeights::Load(model.dir, model.config);
  if (!weights.ok()) return weights.status();
  model.weights = std::move(*weights);
  return model;
}

}  // namespace strata::bench
