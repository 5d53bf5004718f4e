#include "common/model/model_config.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/file.h"
#include "common/base/status_macros.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

using json = nlohmann::json;

absl::Status FieldError(const std::string& source, const std::string& field,
                        const std::string& problem) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": field \"", field, "\" ", problem));
}

absl::StatusOr<int64_t> RequiredInt(const json& j, const std::string& source,
                                    const std::string& field, int64_t min_value = 1) {
  auto it = j.find(field);
  if (it == j.end()) return FieldError(source, field, "is missing");
  if (!it->is_number_integer()) return FieldError(source, field, "must be an integer");
  const int64_t value = it->get<int64_t>();
  if (value < min_value) {
    return FieldError(source, field, absl::StrCat("must be >= ", min_value, ", got ", value));
  }
  return value;
}

absl::StatusOr<double> OptionalNumber(const json& j, const std::string& source,
                                      const std::string& field, double default_value) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return default_value;
  if (!it->is_number()) return FieldError(source, field, "must be a number");
  return it->get<double>();
}

absl::StatusOr<RopeScaling> ParseRopeScaling(const json& j, const std::string& source) {
  RopeScaling scaling;
  auto it = j.find("rope_scaling");
  if (it == j.end() || it->is_null()) return scaling;
  if (!it->is_object()) return FieldError(source, "rope_scaling", "must be an object or null");
  const json& rs = *it;
  std::string type;
  if (rs.contains("rope_type") && rs["rope_type"].is_string()) {
    type = rs["rope_type"].get<std::string>();
  } else if (rs.contains("type") && rs["type"].is_string()) {
    type = rs["type"].get<std::string>();
  } else {
    return FieldError(source, "rope_scaling", "has no \"rope_type\"");
  }
  ASSIGN_OR_RETURN(scaling.factor, OptionalNumber(rs, source, "factor", 1.0));
  if (scaling.factor <= 0) return FieldError(source, "rope_scaling.factor", "must be > 0");
  if (type == "default") {
    scaling.type = RopeScaling::Type::kNone;
  } else if (type == "linear") {
    scaling.type = RopeScaling::Type::kLinear;
  } else if (type == "llama3") {
    scaling.type = RopeScaling::Type::kLlama3;
    ASSIGN_OR_RETURN(scaling.low_freq_factor, OptionalNumber(rs, source, "low_freq_factor", 1.0));
    ASSIGN_OR_RETURN(scaling.high_freq_factor, OptionalNumber(rs, source, "high_freq_factor", 4.0));
    ASSIGN_OR_RETURN(double original,
                     OptionalNumber(rs, source, "original_max_position_embeddings", 8192));
    scaling.original_max_position_embeddings = static_cast<int64_t>(original);
    if (scaling.high_freq_factor <= scaling.low_freq_factor) {
      return FieldError(source, "rope_scaling", "needs high_freq_factor > low_freq_factor");
    }
  } else {
    return FieldError(
        source, "rope_scaling",
        absl::StrCat("has unsupported type \"", type, "\" (supported: linear, llama3)"));
  }
  return scaling;
}

std::vector<int64_t> TokenIdList(const json& j) {
  std::vector<int64_t> ids;
  if (j.is_number_integer()) ids.push_back(j.get<int64_t>());
  if (j.is_array()) {
    for (const json& e : j) {
      if (e.is_number_integer()) ids.push_back(e.get<int64_t>());
    }
  }
  return ids;
}

}  // namespace

int64_t ModelConfig::NumParameters() const {
  const int64_t attn = hidden_size * (q_size() + 2 * kv_size()) + q_size() * hidden_size +
                       (qkv_bias ? q_size() + 2 * kv_size() : 0);
  const int64_t ffn = 3 * hidden_size * intermediate_size;
  const int64_t per_layer = attn + ffn + 2 * hidden_size;
  const int64_t embeddings = vocab_size * hidden_size * (tie_word_embeddings ? 1 : 2);
  return num_layers * per_layer + embeddings + hidden_size;
}

absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text,
                                             const std::string& source) {
  json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(source + ": not valid JSON");
  if (!j.is_object()) return absl::InvalidArgumentError(source + ": must be a JSON object");

  ModelConfig c;
  auto archs = j.find("architectures");
  if (archs == j.end() || !archs->is_array() || archs->empty() || !(*archs)[0].is_string()) {
    return FieldError(source, "architectures", "must be a non-empty list of names");
  }
  c.architecture = (*archs)[0].get<std::string>();
  if (c.architecture != "LlamaForCausalLM" && c.architecture != "MistralForCausalLM" &&
      c.architecture != "Qwen2ForCausalLM") {
    return FieldError(source, "architectures",
                      absl::StrCat("names unsupported architecture \"", c.architecture,
                                   "\" (supported: LlamaForCausalLM, MistralForCausalLM, "
                                   "Qwen2ForCausalLM)"));
  }
  c.model_type = j.value("model_type", std::string());
  ASSIGN_OR_RETURN(c.hidden_size, RequiredInt(j, source, "hidden_size"));
  ASSIGN_OR_RETURN(c.intermediate_size, RequiredInt(j, source, "intermediate_size"));
  ASSIGN_OR_RETURN(c.num_layers, RequiredInt(j, source, "num_hidden_layers"));
  ASSIGN_OR_RETURN(c.num_heads, RequiredInt(j, source, "num_attention_heads"));
  c.num_kv_heads = c.num_heads;
  if (j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()) {
    ASSIGN_OR_RETURN(c.num_kv_heads, RequiredInt(j, source, "num_key_value_heads"));
  }
  ASSIGN_OR_RETURN(c.vocab_size, RequiredInt(j, source, "vocab_size"));
  ASSIGN_OR_RETURN(c.max_position_embeddings, RequiredInt(j, source, "max_position_embeddings"));
  if (c.num_heads % c.num_kv_heads != 0) {
    return FieldError(
        source, "num_key_value_heads",
        absl::StrCat("(", c.num_kv_heads, ") must divide num_attention_heads (", c.num_heads, ")"));
  }
  if (j.contains("head_dim") && !j["head_dim"].is_null()) {
    ASSIGN_OR_RETURN(c.head_dim, RequiredInt(j, source, "head_dim"));
  } else {
    if (c.hidden_size % c.num_heads != 0) {
      return FieldError(source, "hidden_size", "is not a multiple of num_attention_heads");
    }
    c.head_dim = c.hidden_size / c.num_heads;
  }
  if (c.head_dim % 16 != 0 || c.head_dim > 256) {
    return FieldError(source, "head_dim",
                      absl::StrCat("must be a multiple of 16 and at most 256, got ", c.head_dim));
  }
  ASSIGN_OR_RETURN(c.rms_norm_eps, OptionalNumber(j, source, "rms_norm_eps", 1e-6));
  ASSIGN_OR_RETURN(c.rope_theta, OptionalNumber(j, source, "rope_theta", 10000.0));
  if (c.rope_theta <= 0) return FieldError(source, "rope_theta", "must be > 0");
  ASSIGN_OR_RETURN(c.rope_scaling, ParseRopeScaling(j, source));
  c.tie_word_embeddings = j.value("tie_word_embeddings", false);
  c.qkv_bias = c.architecture == "Qwen2ForCausalLM" || j.value("attention_bias", false);
  if (j.value("mlp_bias", false)) return FieldError(source, "mlp_bias", "true is not supported");
  if (j.contains("hidden_act") && j["hidden_act"] != "silu") {
    return FieldError(source, "hidden_act", "must be \"silu\"");
  }
  if (j.contains("torch_dtype") && j["torch_dtype"].is_string()) {
    auto dtype = ParseDType(j["torch_dtype"].get<std::string>());
    if (!dtype) return FieldError(source, "torch_dtype", "must be float32, float16 or bfloat16");
    c.dtype = *dtype;
  }
  if (j.contains("bos_token_id")) {
    auto ids = TokenIdList(j["bos_token_id"]);
    if (!ids.empty()) c.bos_token_id = ids[0];
  }
  if (j.contains("eos_token_id")) c.eos_token_ids = TokenIdList(j["eos_token_id"]);
  if (j.contains("sliding_window") && j["sliding_window"].is_number_integer() &&
      j.value("use_sliding_window", true)) {
    c.sliding_window = j["sliding_window"].get<int64_t>();
  }
  return c;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir) {
  const std::string path = model_dir + "/config.json";
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) return text.status();
  return ParseModelConfig(*text, path);
}

std::string ModelConfigToJson(const ModelConfig& c) {
  json j;
  j["architectures"] = {c.architecture};
  j["model_type"] = c.model_type;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["torch_dtype"] = c.dtype == DType::kBF16  ? "bfloat16"
                     : c.dtype == DType::kF16 ? "float16"
                                              : "float32";
  if (c.architecture != "Qwen2ForCausalLM") j["attention_bias"] = c.qkv_bias;
  switch (c.rope_scaling.type) {
    case RopeScaling::Type::kNone:
      j["rope_scaling"] = nullptr;
      break;
    case RopeScaling::Type::kLinear:
      j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", c.rope_scaling.factor}};
      break;
    case RopeScaling::Type::kLlama3:
      j["rope_scaling"] = {
          {"rope_type", "llama3"},
          {"factor", c.rope_scaling.factor},
          {"low_freq_factor", c.rope_scaling.low_freq_factor},
          {"high_freq_factor", c.rope_scaling.high_freq_factor},
          {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
      break;
  }
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_ids.size() == 1) {
    j["eos_token_id"] = c.eos_token_ids[0];
  } else if (!c.eos_token_ids.empty()) {
    j["eos_token_id"] = c.eos_token_ids;
  }
  return j.dump(2) + "\n";
}

std::vector<double> RopeInverseFrequencies(const ModelConfig& c) {
  const int half = static_cast<int>(c.head_dim / 2);
  std::vector<double> inv_freq(half);
  for (int i = 0; i < half; ++i) {
    inv_freq[i] = std::pow(c.rope_theta, -2.0 * i / static_cast<double>(c.head_dim));
  }
  const RopeScaling& s = c.rope_scaling;
  if (s.type == RopeScaling::Type::kLinear) {
    for (double& f : inv_freq) f /= s.factor;
  } else if (s.type == RopeScaling::Type::kLlama3) {
    // Frequencies whose wavelength is short relative to the original context are kept,
    // long ones are divided by `factor`, and the band between is interpolated.
    const double original = static_cast<double>(s.original_max_position_embeddings);
    const double low_freq_wavelen = original / s.low_freq_factor;
    const double high_freq_wavelen = original / s.high_freq_factor;
    for (double& f : inv_freq) {
      const double wavelen = 2.0 * M_PI / f;
      if (wavelen < high_freq_wavelen) continue;
      if (wavelen > low_freq_wavelen) {
        f /= s.factor;
        continue;
      }
      const double smooth =
          (original / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      f = (1.0 - smooth) * f / s.factor + smooth * f;
    }
  }
  return inv_freq;
}

}  // namespace strata
