// Context overflow through real processes (server, compute node, memory node), over HTTP.
// With --context_overflow=truncate, a conversation's next turn that no longer fits in a
// 256-token context is answered: its middle block is dropped, the rest of its history's KV
// moves from the earlier turn (usage reports it cached), and the server counts what was
// dropped and moved. Without the flag, the same request gets the 400 it always got.

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/deployment.h"
#include "tests/common/http_client.h"

namespace strata::testing {
namespace {

using json = nlohmann::json;

HttpResponse Complete(int http_port, const std::vector<int>& prompt, int max_tokens) {
  const json body = {{"model", "tiny"},
                     {"prompt", prompt},
                     {"max_tokens", max_tokens},
                     {"temperature", 0},
                     {"ignore_eos", true},
                     {"logprobs", 0},
                     {"return_tokens_as_token_ids", true}};
  return HttpRequest(http_port, "POST", "/v1/completions", body.dump());
}

std::vector<int> OutputTokens(const json& j) {
  std::vector<int> out;
  for (const auto& t : j["choices"][0]["logprobs"]["tokens"]) {
    out.push_back(std::stoi(t.get<std::string>().substr(std::string("token_id:").size())));
  }
  return out;
}

TEST(Truncation, AnOverflowingTurnIsTruncatedWithTheFlagAndRefusedWithout) {
  std::vector<int> conversation = RandomPromptTokens(200, 1);
  {
    DeploymentOptions options;
    options.memory_nodes = 1;
    options.server_args = {"--served_model_name=tiny", "--context_overflow=truncate"};
    options.launcher_args = {"--max_model_len=256"};
    auto d = Deployment::Start(options);
    ASSERT_TRUE(d.ok()) << d.status();
    const int http = (*d)->http_port();
    const HttpResponse first = Complete(http, conversation, 8);
    ASSERT_EQ(first.status, 200) << first.body;
    const std::vector<int> answer = OutputTokens(json::parse(first.body));
    ASSERT_EQ(answer.size(), 8u);
    conversation.insert(conversation.end(), answer.begin(), answer.end());
    const std::vector<int> question = RandomPromptTokens(40, 2);
    conversation.insert(conversation.end(), question.begin(), question.end());
    // 248 + 16 > 256: one block dropped after the first; turn 1's blocks 2..11 move.
    const HttpResponse second = Complete(http, conversation, 16);
    ASSERT_EQ(second.status, 200) << second.body;
    const json j = json::parse(second.body);
    EXPECT_EQ(OutputTokens(j).size(), 16u);
    EXPECT_EQ(j["usage"]["prompt_tokens"].get<int>(), 248 - 16);
    EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 16 + 160);
    const int server = (*d)->MetricsPort("server");
    const std::string model = "model_name=\"tiny\"";
    EXPECT_EQ(MetricSum(server, "strata_context_truncations_total", model), 1);
    EXPECT_EQ(
        MetricSum(server, "strata_context_truncation_tokens_total", "event=\"dropped\"," + model),
        16);
    EXPECT_EQ(
        MetricSum(server, "strata_context_truncation_tokens_total", "event=\"moved\"," + model),
        160);
    EXPECT_EQ((*d)->Stop(), 0);
  }
  DeploymentOptions plain;
  plain.memory_nodes = 1;
  plain.server_args = {"--served_model_name=tiny"};
  plain.launcher_args = {"--max_model_len=256"};
  auto d = Deployment::Start(plain);
  ASSERT_TRUE(d.ok()) << d.status();
  const HttpResponse refused = Complete((*d)->http_port(), conversation, 16);
  EXPECT_EQ(refused.status, 400) << refused.body;
  EXPECT_NE(refused.body.find("maximum context length is 256"), std::string::npos) << refused.body;
  // The server goes on serving.
  EXPECT_EQ(Complete((*d)->http_port(), RandomPromptTokens(50, 3), 4).status, 200);
}

}  // namespace
}  // namespace strata::testing
