// The gRPC API (strata.api.v1.Inference) with a real gRPC client against a real
// deployment. The HTTP API serves as the independent reference: the same prompt and
// sampling parameters must give the same tokens and text over both APIs, and the same
// bad input must be refused (with the gRPC code that matches the HTTP status).
#include <grpcpp/grpcpp.h>

#include <regex>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "proto/api.grpc.pb.h"
#include "tests/common/deployment.h"
#include "tests/common/http_client.h"

namespace strata::testing {
namespace {

using json = nlohmann::json;
namespace v1 = ::strata::api::v1;

const std::string kPrompt = "The quick brown fox jumps over the lazy dog";

struct Generated {
  grpc::Status status;
  std::vector<v1::GenerateResponse> messages;
  // Per sample: tokens, text, finish reason, stop reason.
  std::map<uint32_t, std::vector<int32_t>> tokens;
  std::map<uint32_t, std::string> text, finish, stop_reason;
  std::map<uint32_t, std::vector<v1::TokenLogprob>> logprobs;
  v1::Usage usage;
};

class GrpcApiTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    DeploymentOptions options;
    options.server_args = {"--max_model_len=256"};
    auto d = Deployment::Start(options);
    ASSERT_TRUE(d.ok()) << d.status();
    deployment_ = d->release();
    ASSERT_GT(deployment_->grpc_port(), 0);
    auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", deployment_->grpc_port()),
                                       grpc::InsecureChannelCredentials());
    stub_ = v1::Inference::NewStub(channel).release();
    v1::ListModelsResponse models;
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->ListModels(&context, v1::ListModelsRequest(), &models).ok());
    ASSERT_EQ(models.models_size(), 1);
    model_ = models.models(0).id();
  }
  static void TearDownTestSuite() {
    delete stub_;
    if (deployment_ != nullptr) EXPECT_EQ(deployment_->Stop(), 0);
    delete deployment_;
  }

  static Generated Generate(const v1::GenerateRequest& request) {
    Generated g;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    auto reader = stub_->Generate(&context, request);
    v1::GenerateResponse message;
    while (reader->Read(&message)) {
      for (const v1::SequenceDelta& d : message.sequences()) {
        g.tokens[d.index()].insert(g.tokens[d.index()].end(), d.token_ids().begin(),
                                   d.token_ids().end());
        g.text[d.index()] += d.text();
        for (const auto& lp : d.logprobs()) g.logprobs[d.index()].push_back(lp);
        if (!d.finish_reason().empty()) {
          g.finish[d.index()] = d.finish_reason();
          g.stop_reason[d.index()] = d.stop_reason();
        }
      }
      if (message.has_usage()) g.usage = message.usage();
      g.messages.push_back(message);
    }
    g.status = reader->Finish();
    return g;
  }

  static v1::GenerateRequest TextRequest(const std::string& text, int max_tokens) {
    v1::GenerateRequest r;
    r.set_model(model_);
    r.set_text(text);
    r.mutable_params()->set_max_tokens(max_tokens);
    r.mutable_params()->set_temperature(0);
    return r;
  }

  static json HttpCompletion(json body) {
    body["model"] = model_;
    HttpResponse r = HttpRequest(deployment_->http_port(), "POST", "/v1/completions", body.dump());
    EXPECT_EQ(r.status, 200) << r.body;
    return json::parse(r.body, nullptr, false);
  }

  static Deployment* deployment_;
  static v1::Inference::Stub* stub_;
  static std::string model_;
};

Deployment* GrpcApiTest::deployment_ = nullptr;
v1::Inference::Stub* GrpcApiTest::stub_ = nullptr;
std::string GrpcApiTest::model_;

TEST_F(GrpcApiTest, HealthAndModels) {
  grpc::ClientContext context;
  v1::HealthResponse health;
  ASSERT_TRUE(stub_->Health(&context, v1::HealthRequest(), &health).ok());
  EXPECT_EQ(health.status(), v1::HealthResponse::SERVING);
  HttpResponse models = HttpRequest(deployment_->http_port(), "GET", "/v1/models");
  EXPECT_EQ(json::parse(models.body)["data"][0]["id"], model_);
}

TEST_F(GrpcApiTest, GreedyGenerationMatchesTheHttpApi) {
  Generated g = Generate(TextRequest(kPrompt, 12));
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  ASSERT_EQ(g.tokens.size(), 1u);
  EXPECT_EQ(g.tokens[0].size(), 12u);
  EXPECT_EQ(g.finish[0], "length");
  EXPECT_GT(g.messages.size(), 1u) << "tokens should stream, not come in one message";
  for (const auto& m : g.messages) EXPECT_EQ(m.id(), g.messages[0].id());

  json http = HttpCompletion({{"prompt", kPrompt},
                              {"max_tokens", 12},
                              {"temperature", 0},
                              {"return_tokens_as_token_ids", true},
                              {"logprobs", 0}});
  std::vector<int32_t> http_tokens;
  for (const auto& t : http["choices"][0]["logprobs"]["tokens"]) {
    http_tokens.push_back(std::stoi(t.get<std::string>().substr(9)));  // "token_id:N"
  }
  EXPECT_EQ(g.tokens[0], http_tokens);
  json text = HttpCompletion({{"prompt", kPrompt}, {"max_tokens", 12}, {"temperature", 0}});
  EXPECT_EQ(g.text[0], text["choices"][0]["text"].get<std::string>());
  EXPECT_EQ(g.usage.prompt_tokens(), http["usage"]["prompt_tokens"].get<int64_t>());
  EXPECT_EQ(g.usage.completion_tokens(), 12);
  EXPECT_EQ(g.usage.total_tokens(), g.usage.prompt_tokens() + 12);
}

TEST_F(GrpcApiTest, TokenIdPromptsAndSeededSamplesAreDeterministic) {
  grpc::ClientContext tokenize_context;
  v1::TokenizeRequest tokenize;
  tokenize.set_model(model_);
  tokenize.set_text(kPrompt);
  v1::TokenizeResponse tokens;
  ASSERT_TRUE(stub_->Tokenize(&tokenize_context, tokenize, &tokens).ok());

  v1::GenerateRequest r;
  r.set_model(model_);
  r.mutable_token_ids()->mutable_ids()->Add(tokens.token_ids().begin(), tokens.token_ids().end());
  r.mutable_params()->set_max_tokens(10);
  r.mutable_params()->set_temperature(0.9);
  r.mutable_params()->set_seed(1234);
  r.mutable_params()->set_n(3);
  r.mutable_params()->set_ignore_eos(true);
  Generated a = Generate(r), b = Generate(r);
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  ASSERT_TRUE(b.status.ok());
  ASSERT_EQ(a.tokens.size(), 3u);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.text, b.text);
  EXPECT_EQ(a.usage.completion_tokens(), 30);
  // Same seed over HTTP, same samples.
  json http = HttpCompletion(
      {{"prompt", std::vector<int32_t>(tokens.token_ids().begin(), tokens.token_ids().end())},
       {"max_tokens", 10},
       {"temperature", 0.9},
       {"seed", 1234},
       {"n", 3},
       {"ignore_eos", true}});
  for (const auto& choice : http["choices"]) {
    EXPECT_EQ(a.text[choice["index"].get<uint32_t>()], choice["text"].get<std::string>());
  }
}

TEST_F(GrpcApiTest, LogprobsComeWithTheirTopAlternatives) {
  v1::GenerateRequest r = TextRequest(kPrompt, 6);
  r.mutable_params()->set_logprobs(3);
  Generated g = Generate(r);
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  ASSERT_EQ(g.logprobs[0].size(), g.tokens[0].size());
  for (size_t i = 0; i < g.logprobs[0].size(); ++i) {
    const v1::TokenLogprob& lp = g.logprobs[0][i];
    EXPECT_EQ(lp.token_id(), g.tokens[0][i]);
    EXPECT_LE(lp.logprob(), 0.0f);
    ASSERT_EQ(lp.top_size(), 3);
    // Greedy: the chosen token is the most likely one.
    EXPECT_EQ(lp.top(0).token_id(), lp.token_id());
    EXPECT_FLOAT_EQ(lp.top(0).logprob(), lp.logprob());
    EXPECT_GE(lp.top(0).logprob(), lp.top(1).logprob());
  }
}

TEST_F(GrpcApiTest, StopStringsEndTheTextAndAreNotReturned) {
  Generated full = Generate(TextRequest(kPrompt, 24));
  ASSERT_TRUE(full.status.ok());
  const std::string text = full.text[0];
  ASSERT_GE(text.size(), 8u);
  // A stop string from the middle of the greedy text.
  const std::string stop = text.substr(text.size() / 2, 3);
  const std::string expected = text.substr(0, text.find(stop));
  v1::GenerateRequest r = TextRequest(kPrompt, 24);
  r.mutable_params()->add_stop(stop);
  Generated g = Generate(r);
  ASSERT_TRUE(g.status.ok());
  EXPECT_EQ(g.text[0], expected);
  EXPECT_EQ(g.finish[0], "stop");
  EXPECT_EQ(g.stop_reason[0], stop);
}

// Structured output over gRPC: the same compiler and checks as the HTTP API, and the same
// outputs for the same seeded request.
TEST_F(GrpcApiTest, StructuredOutputAsOverHttp) {
  v1::GenerateRequest r = TextRequest(kPrompt, 40);
  r.mutable_params()->set_temperature(1);
  r.mutable_params()->set_seed(77);
  r.mutable_params()->set_n(3);
  r.mutable_params()->mutable_structured_output()->set_regex("[a-f]{2,4}-[0-9]{3}");
  Generated g = Generate(r);
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  const json http = HttpCompletion({{"prompt", kPrompt},
                                    {"max_tokens", 40},
                                    {"temperature", 1},
                                    {"seed", 77},
                                    {"n", 3},
                                    {"guided_regex", "[a-f]{2,4}-[0-9]{3}"}});
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(std::regex_match(g.text[i], std::regex("[a-f]{2,4}-[0-9]{3}"))) << g.text[i];
    EXPECT_EQ(g.finish[i], "stop");
    EXPECT_EQ(g.text[i], http["choices"][i]["text"].get<std::string>());
  }
  r = TextRequest(kPrompt, 20);
  r.mutable_params()->mutable_structured_output()->mutable_choice()->add_choices("left");
  r.mutable_params()->mutable_structured_output()->mutable_choice()->add_choices("right");
  g = Generate(r);
  ASSERT_TRUE(g.status.ok());
  EXPECT_TRUE(g.text[0] == "left" || g.text[0] == "right") << g.text[0];
  r = TextRequest(kPrompt, 20);
  r.mutable_params()->mutable_structured_output()->set_json_schema(
      R"({"type": "object", "properties": {"x": {"type": "string", "format": "hostname"}}})");
  g = Generate(r);
  EXPECT_EQ(g.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(g.status.error_message().find("hostname"), std::string::npos)
      << g.status.error_message();
}

TEST_F(GrpcApiTest, BadRequestsGetMatchingStatusCodes) {
  auto code = [](const v1::GenerateRequest& r) { return Generate(r).status.error_code(); };
  v1::GenerateRequest r = TextRequest(kPrompt, 4);
  r.set_model("no-such-model");
  EXPECT_EQ(code(r), grpc::StatusCode::NOT_FOUND);
  r = TextRequest(kPrompt, 4);
  r.clear_model();  // one model is served: no name means it, as over HTTP
  EXPECT_EQ(code(r), grpc::StatusCode::OK);
  r = TextRequest(kPrompt, 4);
  r.mutable_params()->set_temperature(7);  // out of [0, 2], as over HTTP
  EXPECT_EQ(code(r), grpc::StatusCode::INVALID_ARGUMENT);
  r = TextRequest(kPrompt, 4);
  r.mutable_params()->set_n(1000);
  EXPECT_EQ(code(r), grpc::StatusCode::INVALID_ARGUMENT);
  r = TextRequest(kPrompt, 4);
  r.mutable_params()->mutable_logit_bias()->insert({-5, 1.0});
  EXPECT_EQ(code(r), grpc::StatusCode::INVALID_ARGUMENT);
  r = TextRequest(kPrompt, 4);
  r.clear_text();
  EXPECT_EQ(code(r), grpc::StatusCode::INVALID_ARGUMENT);  // no prompt
  r = TextRequest(kPrompt, 4);
  r.mutable_token_ids()->add_ids(1 << 30);
  EXPECT_EQ(code(r), grpc::StatusCode::INVALID_ARGUMENT);
  // Over the context (256 tokens).
  std::string long_prompt;
  for (int i = 0; i < 300; ++i) long_prompt += " fox";
  EXPECT_EQ(code(TextRequest(long_prompt, 4)), grpc::StatusCode::INVALID_ARGUMENT);
  r = TextRequest(kPrompt, 4);
  r.mutable_messages()->add_messages();  // a message without a role
  r.mutable_messages()->mutable_messages(0)->set_content("hi");
  EXPECT_NE(code(r), grpc::StatusCode::OK);

  grpc::ClientContext context;
  v1::DetokenizeRequest detokenize;
  detokenize.set_model(model_);
  detokenize.add_token_ids(-1);
  v1::DetokenizeResponse text;
  EXPECT_EQ(stub_->Detokenize(&context, detokenize, &text).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  // Still serving.
  EXPECT_TRUE(Generate(TextRequest(kPrompt, 2)).status.ok());
}

TEST_F(GrpcApiTest, TokenizeAndChatMatchTheHttpApi) {
  v1::TokenizeRequest tokenize;
  tokenize.set_model(model_);
  tokenize.mutable_messages()->add_messages()->set_role("user");
  tokenize.mutable_messages()->mutable_messages(0)->set_content("Hello there");
  v1::TokenizeResponse tokens;
  grpc::ClientContext c1;
  ASSERT_TRUE(stub_->Tokenize(&c1, tokenize, &tokens).ok());
  HttpResponse http = HttpRequest(
      deployment_->http_port(), "POST", "/tokenize",
      json({{"model", model_}, {"messages", {{{"role", "user"}, {"content", "Hello there"}}}}})
          .dump());
  ASSERT_EQ(http.status, 200) << http.body;
  EXPECT_EQ(std::vector<int32_t>(tokens.token_ids().begin(), tokens.token_ids().end()),
            json::parse(http.body)["tokens"].get<std::vector<int32_t>>());

  v1::DetokenizeRequest detokenize;
  detokenize.set_model(model_);
  v1::TokenizeRequest plain;
  plain.set_model(model_);
  plain.set_text("Hello there, world");
  plain.set_add_special_tokens(false);
  v1::TokenizeResponse plain_tokens;
  grpc::ClientContext c2, c3;
  ASSERT_TRUE(stub_->Tokenize(&c2, plain, &plain_tokens).ok());
  detokenize.mutable_token_ids()->Add(plain_tokens.token_ids().begin(),
                                      plain_tokens.token_ids().end());
  v1::DetokenizeResponse text;
  ASSERT_TRUE(stub_->Detokenize(&c3, detokenize, &text).ok());
  EXPECT_EQ(text.text(), "Hello there, world");

  // Chat over gRPC gives the HTTP chat endpoint's greedy answer.
  v1::GenerateRequest chat;
  chat.set_model(model_);
  *chat.mutable_messages() = tokenize.messages();
  chat.mutable_params()->set_max_tokens(8);
  chat.mutable_params()->set_temperature(0);
  Generated g = Generate(chat);
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  HttpResponse http_chat =
      HttpRequest(deployment_->http_port(), "POST", "/v1/chat/completions",
                  json({{"model", model_},
                        {"messages", {{{"role", "user"}, {"content", "Hello there"}}}},
                        {"max_tokens", 8},
                        {"temperature", 0}})
                      .dump());
  ASSERT_EQ(http_chat.status, 200);
  EXPECT_EQ(g.text[0],
            json::parse(http_chat.body)["choices"][0]["message"]["content"].get<std::string>());
  EXPECT_EQ(g.usage.prompt_tokens(), tokens.token_ids_size());
}

TEST_F(GrpcApiTest, ACancelledCallStopsItsRequest) {
  v1::GenerateRequest r = TextRequest(kPrompt, 200);
  r.mutable_params()->set_ignore_eos(true);
  grpc::ClientContext context;
  auto reader = stub_->Generate(&context, r);
  v1::GenerateResponse message;
  ASSERT_TRUE(reader->Read(&message));
  context.TryCancel();
  while (reader->Read(&message)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  // The request is gone from the scheduler: nothing runs, nothing waits.
  bool idle = false;
  for (int i = 0; i < 100 && !idle; ++i) {
    HttpResponse metrics = HttpRequest(deployment_->http_port(), "GET", "/metrics");
    idle = metrics.body.find("strata_num_requests_running{model_name=\"" + model_ + "\"} 0") !=
           std::string::npos;
    if (!idle) absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(idle) << "the cancelled request is still running";
  EXPECT_TRUE(Generate(TextRequest(kPrompt, 2)).status.ok());
}

TEST(GrpcApiKeyTest, CallsWithoutTheKeyAreRefused) {
  DeploymentOptions options;
  options.api_key = "sesame";
  auto d = Deployment::Start(options);
  ASSERT_TRUE(d.ok()) << d.status();
  auto stub = v1::Inference::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", (*d)->grpc_port()), grpc::InsecureChannelCredentials()));
  v1::ListModelsResponse models;
  grpc::ClientContext without;
  EXPECT_EQ(stub->ListModels(&without, {}, &models).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  grpc::ClientContext wrong;
  wrong.AddMetadata("authorization", "Bearer open");
  EXPECT_EQ(stub->ListModels(&wrong, {}, &models).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  grpc::ClientContext right;
  right.AddMetadata("authorization", "Bearer sesame");
  EXPECT_TRUE(stub->ListModels(&right, {}, &models).ok());
  // Health answers without a key (it is what probes call).
  grpc::ClientContext health;
  v1::HealthResponse h;
  EXPECT_TRUE(stub->Health(&health, {}, &h).ok());
  EXPECT_EQ((*d)->Stop(), 0);
}

}  // namespace
}  // namespace strata::testing
