#include "common/model/model_config.h"

#include "gtest/gtest.h"

namespace strata {
namespace {

constexpr char kLlama3[] = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
  "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
  "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]})";

TEST(ModelConfig, ParsesLlama3) {
  auto c = ParseModelConfig(kLlama3, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->num_kv_heads, 8);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
  EXPECT_FALSE(c->qkv_bias);
  // Llama 3 8B has 8.03B parameters.
  EXPECT_NEAR(static_cast<double>(c->NumParameters()), 8.03e9, 0.01e9);
}

TEST(ModelConfig, QwenHasBiasAndDefaultsKvHeads) {
  auto c = ParseModelConfig(R"({"architectures": ["Qwen2ForCausalLM"], "hidden_size": 896,
      "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
      "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 32768,
      "tie_word_embeddings": true, "rope_theta": 1000000.0})",
                            "qwen/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->head_dim, 64);
  // Qwen2.5-0.5B: 494M parameters.
  EXPECT_NEAR(static_cast<double>(c->NumParameters()), 494e6, 1e6);
}

TEST(ModelConfig, RejectsWithFieldNames) {
  auto expect_error = [](const std::string& text, const std::string& needle) {
    auto c = ParseModelConfig(text, "m/config.json");
    ASSERT_FALSE(c.ok());
    EXPECT_NE(c.status().message().find(needle), std::string::npos) << c.status();
    EXPECT_NE(c.status().message().find("m/config.json"), std::string::npos) << c.status();
  };
  expect_error("{not json", "not valid JSON");
  expect_error(R"({"architectures": ["GPT2LMHeadModel"]})", "unsupported architecture");
  expect_error(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64})",
               "intermediate_size");
  expect_error(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
      "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4,
      "num_key_value_heads": 3, "vocab_size": 10, "max_position_embeddings": 16})",
               "num_key_value_heads");
  expect_error(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
      "intermediate_size": 128, "num_hidden_layers": "two", "num_attention_heads": 4,
      "vocab_size": 10, "max_position_embeddings": 16})",
               "num_hidden_layers");
  expect_error(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 256,
      "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4,
      "vocab_size": 10, "max_position_embeddings": 16,
      "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})",
               "yarn");
}

TEST(ModelConfig, JsonRoundTrip) {
  auto c = ParseModelConfig(kLlama3, "config.json");
  ASSERT_TRUE(c.ok());
  auto again = ParseModelConfig(ModelConfigToJson(*c), "round-trip");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->NumParameters(), c->NumParameters());
  EXPECT_EQ(again->rope_scaling.factor, 8.0);
  EXPECT_EQ(again->eos_token_ids, c->eos_token_ids);
}

}  // namespace
}  // namespace strata
