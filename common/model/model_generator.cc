#include "common/model/model_generator.h"

#include <sys/stat.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/base/bfloat16.h"
#include "common/base/file.h"
#include "common/base/status_macros.h"
#include "common/model/safetensors.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

using json = nlohmann::json;

uint64_t Mix64(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t HashName(const std::string& name) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return h;
}

ModelConfig BaseConfig() {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.model_type = "llama";
  c.vocab_size = 32000;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.dtype = DType::kBF16;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  return c;
}

// Spread of the generated weights. Projections use 1/sqrt(fan_in) so activations keep
// unit scale; embeddings and head use 2/sqrt(hidden) so logits have a spread of about 2,
// like trained models, and greedy choices are mostly well separated.
struct Init {
  double std;
  double mean;
};

Init InitFor(const std::string& name, const ModelConfig& c, int64_t fan_in) {
  if (name.find("norm") != std::string::npos) return {0.1, 1.0};
  if (name.find("bias") != std::string::npos) return {0.1, 0.0};
  if (name.find("embed_tokens") != std::string::npos || name == "lm_head.weight") {
    return {2.0 / std::sqrt(static_cast<double>(c.hidden_size)), 0.0};
  }
  return {1.0 / std::sqrt(static_cast<double>(fan_in)), 0.0};
}

std::string MakeTensorBytes(const std::string& name, const std::vector<int64_t>& shape, DType dtype,
                            const ModelConfig& c, uint64_t seed) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const Init init = InitFor(name, c, shape.size() == 2 ? shape[1] : 1);
  const uint64_t stream = HashName(name);
  std::string bytes(n * DTypeSize(dtype), '\0');
  char* out = bytes.data();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float value = static_cast<float>(init.mean + init.std * GeneratorNormal(seed, stream, i));
    if (dtype == DType::kF32) {
      std::memcpy(out + 4 * i, &value, 4);
    } else {
      const uint16_t h = dtype == DType::kBF16 ? FloatToBf16(value) : FloatToF16(value);
      std::memcpy(out + 2 * i, &h, 2);
    }
  }
  return bytes;
}

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
};

std::vector<TensorSpec> TensorSpecs(const ModelConfig& c) {
  std::vector<TensorSpec> specs;
  specs.push_back({"model.embed_tokens.weight", {c.vocab_size, c.hidden_size}});
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    specs.push_back({p + "input_layernorm.weight", {c.hidden_size}});
    specs.push_back({p + "self_attn.q_proj.weight", {c.q_size(), c.hidden_size}});
    specs.push_back({p + "self_attn.k_proj.weight", {c.kv_size(), c.hidden_size}});
    specs.push_back({p + "self_attn.v_proj.weight", {c.kv_size(), c.hidden_size}});
    if (c.qkv_bias) {
      specs.push_back({p + "self_attn.q_proj.bias", {c.q_size()}});
      specs.push_back({p + "self_attn.k_proj.bias", {c.kv_size()}});
      specs.push_back({p + "self_attn.v_proj.bias", {c.kv_size()}});
    }
    specs.push_back({p + "self_attn.o_proj.weight", {c.hidden_size, c.q_size()}});
    specs.push_back({p + "post_attention_layernorm.weight", {c.hidden_size}});
    specs.push_back({p + "mlp.gate_proj.weight", {c.intermediate_size, c.hidden_size}});
    specs.push_back({p + "mlp.up_proj.weight", {c.intermediate_size, c.hidden_size}});
    specs.push_back({p + "mlp.down_proj.weight", {c.hidden_size, c.intermediate_size}});
  }
  specs.push_back({"model.norm.weight", {c.hidden_size}});
  if (!c.tie_word_embeddings) specs.push_back({"lm_head.weight", {c.vocab_size, c.hidden_size}});
  return specs;
}

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::ResourceExhaustedError(path + ": write failed");
  return absl::OkStatus();
}

// Reads vocabulary size and special ids from tokenizer.json / tokenizer_config.json.
absl::Status AdoptTokenizer(const std::string& dir, ModelConfig* c, std::string* config_text) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(dir + "/tokenizer.json"));
  json tok = json::parse(text, nullptr, false);
  if (tok.is_discarded() || !tok.contains("model") || !tok["model"].contains("vocab")) {
    return absl::InvalidArgumentError(dir + "/tokenizer.json: no model.vocab");
  }
  int64_t max_id = -1;
  std::map<std::string, int64_t> ids;
  for (auto& [token, id] : tok["model"]["vocab"].items()) {
    max_id = std::max<int64_t>(max_id, id.get<int64_t>());
  }
  for (const json& added : tok.value("added_tokens", json::array())) {
    const int64_t id = added["id"].get<int64_t>();
    max_id = std::max(max_id, id);
    ids[added["content"].get<std::string>()] = id;
  }
  // Round up to a multiple of 64, as real checkpoints pad their embedding tables.
  c->vocab_size = std::max(c->vocab_size, (max_id + 1 + 63) / 64 * 64);
  auto config_or = ReadFileToString(dir + "/tokenizer_config.json");
  if (config_or.ok()) {
    *config_text = *config_or;
    json cfg = json::parse(*config_or, nullptr, false);
    auto token_id = [&](const char* key) -> int64_t {
      if (cfg.is_discarded() || !cfg.contains(key)) return -1;
      const json& v = cfg[key];
      std::string content = v.is_string() ? v.get<std::string>()
                            : v.is_object() && v.contains("content")
                                ? v["content"].get<std::string>()
                                : "";
      auto it = ids.find(content);
      return it == ids.end() ? -1 : it->second;
    };
    c->bos_token_id = token_id("bos_token");
    const int64_t eos = token_id("eos_token");
    if (eos >= 0) c->eos_token_ids = {eos};
  }
  return absl::OkStatus();
}

}  // namespace

float GeneratorNormal(uint64_t seed, uint64_t stream, uint64_t index) {
  const uint64_t a = Mix64(seed ^ Mix64(stream ^ Mix64(index)));
  const uint64_t b = Mix64(a);
  // Two uniforms in (0, 1], Box-Muller.
  const double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1.0p-53;
  const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

std::vector<std::string> ModelShapeNames() {
  return {"tiny", "tiny-gqa", "tiny-qwen", "tiny-mistral", "demo", "demo-gqa"};
}

absl::StatusOr<ModelConfig> NamedModelShape(const std::string& name) {
  ModelConfig c = BaseConfig();
  if (name == "tiny") {
    c.hidden_size = 128;
    c.intermediate_size = 256;
    c.num_layers = 2;
    c.num_heads = 2;
    c.num_kv_heads = 2;
    c.head_dim = 64;
    c.max_position_embeddings = 2048;
  } else if (name == "tiny-gqa") {
    c.hidden_size = 256;
    c.intermediate_size = 512;
    c.num_layers = 2;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = 64;
    c.max_position_embeddings = 4096;
    c.rope_theta = 500000.0;
    c.rope_scaling = {RopeScaling::Type::kLlama3, 8.0, 1.0, 4.0, 256};
    c.tie_word_embeddings = true;
  } else if (name == "tiny-qwen") {
    c.architecture = "Qwen2ForCausalLM";
    c.model_type = "qwen2";
    c.hidden_size = 128;
    c.intermediate_size = 384;
    c.num_layers = 2;
    c.num_heads = 2;
    c.num_kv_heads = 1;
    c.head_dim = 64;
    c.max_position_embeddings = 4096;
    c.rope_theta = 1000000.0;
    c.rms_norm_eps = 1e-6;
    c.qkv_bias = true;
    c.tie_word_embeddings = true;
  } else if (name == "tiny-mistral") {
    c.architecture = "MistralForCausalLM";
    c.model_type = "mistral";
    c.hidden_size = 256;
    c.intermediate_size = 512;
    c.num_layers = 2;
    c.num_heads = 4;
    c.num_kv_heads = 1;
    c.head_dim = 128;
    c.max_position_embeddings = 4096;
    c.rope_scaling = {RopeScaling::Type::kLinear, 2.0};
  } else if (name == "demo") {
    c.hidden_size = 768;
    c.intermediate_size = 2048;
    c.num_layers = 12;
    c.num_heads = 12;
    c.num_kv_heads = 12;
    c.head_dim = 64;
    c.max_position_embeddings = 4096;
  } else if (name == "demo-gqa") {
    c.hidden_size = 1024;
    c.intermediate_size = 2816;
    c.num_layers = 16;
    c.num_heads = 16;
    c.num_kv_heads = 4;
    c.head_dim = 64;
    c.max_position_embeddings = 4096;
    c.rope_theta = 500000.0;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown model shape \"", name, "\"; known: ", absl::StrJoin(ModelShapeNames(), ", ")));
  }
  return c;
}

absl::Status GenerateModel(const ModelConfig& shape, const GenerateOptions& options,
                           const std::string& out_dir) {
  ModelConfig c = shape;
  if (options.dtype) c.dtype = *options.dtype;
  std::string tokenizer_config_text;
  if (!options.tokenizer_dir.empty()) {
    RETURN_IF_ERROR(AdoptTokenizer(options.tokenizer_dir, &c, &tokenizer_config_text));
  }
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return absl::PermissionDeniedError(out_dir + ": " + ec.message());

  const std::vector<TensorSpec> specs = TensorSpecs(c);
  const int num_shards = std::max(1, options.num_shards);
  json weight_map = json::object();
  size_t next = 0;
  for (int shard = 0; shard < num_shards; ++shard) {
    const size_t end = specs.size() * (shard + 1) / num_shards;
    const std::string file_name =
        num_shards == 1 ? "model.safetensors"
                        : absl::StrFormat("model-%05d-of-%05d.safetensors", shard + 1, num_shards);
    std::vector<TensorToWrite> tensors;
    for (; next < end; ++next) {
      const TensorSpec& s = specs[next];
      tensors.push_back(
          {s.name, c.dtype, s.shape, MakeTensorBytes(s.name, s.shape, c.dtype, c, options.seed)});
      weight_map[s.name] = file_name;
    }
    RETURN_IF_ERROR(WriteSafetensors(out_dir + "/" + file_name, tensors));
  }
  if (num_shards > 1) {
    json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}};
    RETURN_IF_ERROR(WriteFile(out_dir + "/model.safetensors.index.json", index.dump(2)));
  }
  if (!options.tokenizer_dir.empty()) {
    std::filesystem::copy_file(options.tokenizer_dir + "/tokenizer.json",
                               out_dir + "/tokenizer.json",
                               std::filesystem::copy_options::overwrite_existing, ec);
    if (ec) return absl::InternalError("copying tokenizer.json: " + ec.message());
    if (!tokenizer_config_text.empty()) {
      RETURN_IF_ERROR(WriteFile(out_dir + "/tokenizer_config.json", tokenizer_config_text));
    }
  }
  // config.json last: its presence marks a complete model.
  return WriteFile(out_dir + "/config.json", ModelConfigToJson(c));
}

}  // namespace strata
