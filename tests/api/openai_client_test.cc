// Runs openai_client_test.mjs (the official `openai` npm client, 6.x) against a real
// deployment, one gtest case per JavaScript test so that the summary counts each.
// The server runs with an API key, a 256 KiB body limit, and a small queue (--max_waiting=2,
// --max_num_seqs=4) so that 401, 413 and 429 can be provoked.
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/common/deployment.h"

namespace strata::testing {
namespace {

constexpr char kApiKey[] = "strata-test-key";

// A deployment per suite, started once from Suite::Options() and stopped at the end.
template <typename Suite>
class DeployedSuite : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    ASSERT_TRUE(std::filesystem::exists(NpmDir() + "/node_modules/openai"))
        << "the openai npm package is missing: run deploy/setup.sh";
    auto d = Deployment::Start(Suite::Options());
    ASSERT_TRUE(d.ok()) << d.status();
    deployment_ = d->release();
  }
  static void TearDownTestSuite() {
    if (deployment_ != nullptr) EXPECT_EQ(deployment_->Stop(), 0);
    delete deployment_;
    deployment_ = nullptr;
  }
  static inline Deployment* deployment_ = nullptr;
};

class OpenAiClientTest : public DeployedSuite<OpenAiClientTest> {
 public:
  static DeploymentOptions Options() {
    DeploymentOptions options;
    options.api_key = kApiKey;
    options.server_args = {"--max_body_bytes=262144", "--max_waiting=2", "--max_num_seqs=4"};
    return options;
  }
};

// Runs the JavaScript test named `name` of `script` against the server on `port`.
void RunNodeTest(const std::string& script, int port, const std::string& name) {
  // Test names are plain text; anchor them as a regex.
  std::string pattern;
  for (char c : name) {
    if (std::string("\\^$.|?*+()[]{}").find(c) != std::string::npos) pattern += '\\';
    pattern += c;
  }
  const std::string command = absl::StrCat(
      "STRATA_NPM_DIR='", NpmDir(), "' STRATA_PORT=", port, " STRATA_API_KEY=", kApiKey,
      " node --test --test-reporter=spec ", "--test-name-pattern='^", pattern, "$' '",
      RunfilesRoot(), "/tests/api/", script, "' 2>&1");
  FILE* p = popen(command.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  EXPECT_EQ(WEXITSTATUS(status), 0) << out;
  // node --test passes when a pattern matches nothing; make sure this test ran.
  EXPECT_NE(out.find("pass 1"), std::string::npos) << out;
}

std::string TestName(const ::testing::TestParamInfo<std::string>& info) {
  std::string name;
  for (char c : info.param) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return name;
}

TEST_P(OpenAiClientTest, Passes) {
  ASSERT_NE(deployment_, nullptr);
  RunNodeTest("openai_client_test.mjs", deployment_->http_port(), GetParam());
}

INSTANTIATE_TEST_SUITE_P(
    Api, OpenAiClientTest,
    ::testing::Values(
        "models.list", "completion with usage", "streamed completion equals the whole one",
        "chat, whole and streamed", "n samples with a seed are deterministic",
        "stop strings end the text and are never streamed",
        "logprobs in the completions and chat shapes", "max_tokens bounds the output",
        "errors: 400 bad parameters and over-long prompts", "errors: 404 unknown model",
        "errors: 401 wrong key", "errors: 413 body over the limit",
        "errors: 429 when the queue is full, and the rest completes",
        "structured output: JSON Schema outputs validate",
        "structured output: parse, json_object, completions, regex, choice and grammar",
        "structured output: min_tokens, logit_bias, stop strings and max_tokens",
        "structured output: bad schemas are 400s naming the problem",
        "tools: required, named, none, streamed and round-tripped"),
    TestName);

// Tool calling on a model whose chat template is Qwen 2.5's (a generated tiny model with
// Qwen 2.5's tokenizer and template): tools rendered by a real template, calls in its
// format, and a conversation with calls and answers rendered back.
class QwenToolsTest : public DeployedSuite<QwenToolsTest> {
 public:
  static DeploymentOptions Options() {
    DeploymentOptions options;
    options.api_key = kApiKey;
    options.tokenizer = "tokenizer-qwen2_5";
    return options;
  }
};

TEST_P(QwenToolsTest, Passes) {
  ASSERT_NE(deployment_, nullptr);
  RunNodeTest("qwen_tools_test.mjs", deployment_->http_port(), GetParam());
}

INSTANTIATE_TEST_SUITE_P(Api, QwenToolsTest,
                         ::testing::Values("qwen template: required and named calls, round trip"),
                         TestName);

}  // namespace
}  // namespace strata::testing
