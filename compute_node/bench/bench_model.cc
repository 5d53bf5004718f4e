#include "compute_node/bench/bench_model.h"

#include <utility>

#include "common/bench/demo_model.h"

namespace strata::bench {

absl::StatusOr<BenchModel> LoadBenchModel(const std::string& flag, DType kv_cache_dtype) {
  BenchModel model;
  absl::StatusOr<std::string> dir = BenchModelDir(flag);
  if (!dir.ok()) return dir.status();
  model.dir = *dir;
  absl::StatusOr<ModelConfig> config = LoadModelConfig(model.dir);
  if (!config.ok()) return config.status();
  model.config = *config;
  model.config.kv_cache_dtype = kv_cache_dtype;
  auto weights = ModelWeights::Load(model.dir, model.config);
  if (!weights.ok()) return weights.status();
  model.weights = std::move(*weights);
  return model;
}

}  // namespace strata::bench
