// A model's weights in the layouts the compute node runs: GEMM weights repacked for oneDNN
// (QKV and gate/up fused), norms in f32, the embedding table in bf16.
//
// Load() memory-maps the checkpoint, validates every tensor's shape and dtype against
// config.json (errors name the file and tensor), repacks, and unmaps. Immutable after load.
#ifndef STRATA_COMPUTE_NODE_MODEL_WEIGHTS_H_
#define STRATA_COMPUTE_NODE_MODEL_WEIGHTS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/huge_pages.h"
#include "common/model/model_config.h"
#include "compute_node/linear.h"

namespace strata {

struct LayerWeights {
  std::vector<float> input_norm;    // [hidden]
  std::vector<float> post_norm;     // [hidden]
  std::unique_ptr<Linear> qkv;      // hidden -> q_size + 2 kv_size (with bias for Qwen2)
  std::unique_ptr<Linear> o;        // q_size -> hidden
  std::unique_ptr<Linear> gate_up;  // hidden -> 2 intermediate (gate first)
  std::unique_ptr<Linear> down;     // intermediate -> hidden
};

struct ModelWeights {
  ModelConfig config;
  // The linear layers' packed weights, one after another on huge pages.
  std::unique_ptr<StreamingArena> arena = std::make_unique<StreamingArena>();
  std::vector<uint16_t> embedding;  // [vocab][hidden] bf16
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;    // [hidden]
  std::unique_ptr<Linear> lm_head;  // hidden -> vocab (the embedding when tied)

  // Bytes of GEMM weights read by one decode step (all layers plus the head).
  size_t gemm_weight_bytes() const;

  static absl::StatusOr<std::unique_ptr<ModelWeights>> Load(const std::string& model_dir,
                                                            const ModelConfig& config);
};

}  // namespace strata

#endif  // STRATA_COMPUTE_NODE_MODEL_WEIGHTS_H_
