// The architecture description of a Hugging Face causal LM, read from config.json.
//
// Supported: LlamaForCausalLM (Llama 2/3), MistralForCausalLM and Qwen2ForCausalLM (qkv
// bias), with GQA, RoPE theta, rope_scaling of type "linear" or "llama3", and tied or
// untied embeddings. Anything else is rejected with a message that names the field.
#ifndef STRATA_COMMON_MODEL_MODEL_CONFIG_H_
#define STRATA_COMMON_MODEL_MODEL_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/dtype.h"

namespace strata {

struct RopeScaling {
  enum class Type { kNone, kLinear, kLlama3 };
  Type type = Type::kNone;
  double factor = 1.0;
  // llama3 only.
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct ModelConfig {
  std::string architecture;  // e.g. "LlamaForCausalLM"
  std::string model_type;    // e.g. "llama"
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;       // Qwen2 always; Llama when "attention_bias" is true.
  DType dtype = DType::kBF16;  // torch_dtype
  // The KV cache's element type, kBF16 or kF16: how this deployment serves the model (the
  // compute node's --kv_cache_dtype), not read from config.json.
  DType kv_cache_dtype = DType::kBF16;
  int64_t bos_token_id = -1;
  std::vector<int64_t> eos_token_ids;
  // Mistral v0.1 declares a sliding window; strata caps the context at it instead.
  int64_t sliding_window = 0;

  int64_t q_size() const { return num_heads * head_dim; }
  int64_t kv_size() const { return num_kv_heads * head_dim; }
  // Elements of K plus V for one token in one layer.
  int64_t kv_elements_per_token_per_layer() const { return 2 * kv_size(); }
  // Parameters, embedding and head included.
  int64_t NumParameters() const;
};

// Parses and validates config.json text. `source` names the file in error messages.
absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text,
                                             const std::string& source);

// Reads <model_dir>/config.json.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir);

// Writes config.json text for `config` (used by the demo model generator).
std::string ModelConfigToJson(const ModelConfig& config);

// The inverse frequencies of RoPE for `config`, with its rope_scaling applied:
// inv_freq[i] = theta^(-2i/head_dim), then linear (divide by factor) or llama3 scaling.
std::vector<double> RopeInverseFrequencies(const ModelConfig& config);

}  // namespace strata

#endif  // STRATA_COMMON_MODEL_MODEL_CONFIG_H_
