// The model a compute-node benchmark runs, loaded: the directory its --model flag names (or
// the demo shape, generated once; common/bench/demo_model.h), its config and its weights.
#ifndef STRATA_COMPUTE_NODE_BENCH_BENCH_MODEL_H_
#define STRATA_COMPUTE_NODE_BENCH_BENCH_MODEL_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/model/model_config.h"
#include "compute_node/model_weights.h"

namespace strata::bench {

struct BenchModel {
  std::string dir;
  ModelConfig config;
  std::unique_ptr<ModelWeights> weights;
};

// `flag`'s model (BenchModelDir), or why it could not be loaded.
// `kv_cache_dtype`: the KV cache's element type the bench serves with (bf16 or f16).
absl::StatusOr<BenchModel> LoadBenchModel(const std::string& flag,
                                          DType kv_cache_dtype = DType::kBF16);

}  // namespace strata::bench

#endif  // STRATA_COMPUTE_NODE_BENCH_BENCH_MODEL_H_
