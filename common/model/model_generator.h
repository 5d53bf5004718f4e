// Writes deterministic random-weight models in Hugging Face layout (config.json,
// safetensors, optionally a real tokenizer), from a seed and a named shape.
//
// The weights are random, so generated text is meaningless; the architecture, file
// formats and tokenizer are real, which is what tests and benchmarks need. Every value is
// a pure function of (seed, tensor name, element index), so output does not depend on
// thread count or generation order.
#ifndef STRATA_COMMON_MODEL_MODEL_GENERATOR_H_
#define STRATA_COMMON_MODEL_MODEL_GENERATOR_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/model_config.h"

namespace strata {

// Names accepted by NamedModelShape:
//   tiny          Llama, MHA, untied head (tests)
//   tiny-gqa      Llama 3 style: GQA 4:2, llama3 rope scaling, tied embeddings (tests)
//   tiny-qwen     Qwen2: qkv bias, GQA 2:1, tied, theta 1e6 (tests)
//   tiny-mistral  Mistral: head_dim 128, GQA, linear rope scaling, untied (tests)
//   demo          dim 768, 12 layers, 12 heads, FFN 2048, vocab 32000, untied, bf16:
//                 the shape of stories110M with its own head, 134M parameters
//   demo-gqa      dim 1024, 16 layers, 16 heads over 4 KV heads, FFN 2816
std::vector<std::string> ModelShapeNames();
absl::StatusOr<ModelConfig> NamedModelShape(const std::string& name);

struct GenerateOptions {
  uint64_t seed = 0;
  // > 1 writes model-0000i-of-0000n.safetensors files plus an index.
  int num_shards = 1;
  // Checkpoint dtype; default is the shape's torch_dtype.
  std::optional<DType> dtype;
  // Directory holding tokenizer.json (and tokenizer_config.json) to copy in; empty for a
  // model without a tokenizer (runtime tests that feed token ids need none).
  std::string tokenizer_dir;
};

// Writes the model into `out_dir` (created if needed). The vocabulary size is raised to
// cover the tokenizer's when one is given, and BOS/EOS ids are taken from it.
absl::Status GenerateModel(const ModelConfig& shape, const GenerateOptions& options,
                           const std::string& out_dir);

// The normal-distributed value the generator uses for element `index` of a tensor whose
// name hashes to `stream`. Exposed so tests can check determinism.
float GeneratorNormal(uint64_t seed, uint64_t stream, uint64_t index);

}  // namespace strata

#endif  // STRATA_COMMON_MODEL_MODEL_GENERATOR_H_
