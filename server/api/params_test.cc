// The one validation of generation parameters, through both of its doors: a JSON body (the
// HTTP API) and a typed request built directly (as the gRPC API builds it from its proto).
// Expected values come from OpenAI's and vLLM's documented defaults and ranges.
#include "server/api/params.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace strata::api {
namespace {

using json = nlohmann::json;

ApiLimits Limits() {
  ApiLimits limits;
  limits.max_n = 4;
  limits.max_logprobs = 5;
  limits.max_stop_sequences = 2;
  limits.max_model_len = 128;
  limits.vocab_size = 100;
  return limits;
}

std::variant<ParsedParams, ApiError> Json(const json& body,
                                          Endpoint endpoint = Endpoint::kCompletions) {
  return ParseParams(body, endpoint, Limits());
}

std::variant<ParsedParams, ApiError> Typed(const RequestParams& in,
                                           Endpoint endpoint = Endpoint::kCompletions) {
  return ValidateParams(in, endpoint, Limits());
}

// The parameter an error names, or "" when the request was accepted.
std::string Refused(const std::variant<ParsedParams, ApiError>& result) {
  const ApiError* e = std::get_if<ApiError>(&result);
  if (e == nullptr) return "";
  EXPECT_EQ(e->status, 400) << e->message;
  EXPECT_FALSE(e->message.empty());
  return e->param.empty() ? "<none>" : e->param;
}

TEST(Params, DefaultsAreOpenAIs) {
  for (const auto& result : {Json(json::object()), Typed(RequestParams())}) {
    ASSERT_EQ(Refused(result), "");
    const ParsedParams& p = std::get<ParsedParams>(result);
    EXPECT_FALSE(p.max_tokens.has_value());
    EXPECT_EQ(p.request.sampling.temperature, 1.0f);
    EXPECT_EQ(p.request.sampling.top_p, 1.0f);
    EXPECT_EQ(p.request.sampling.top_k, 0);
    EXPECT_EQ(p.request.sampling.repetition_penalty, 1.0f);
    EXPECT_EQ(p.request.sampling.num_logprobs, -1);
    EXPECT_EQ(p.request.n, 1);
    EXPECT_FALSE(p.request.has_seed);
    EXPECT_TRUE(p.request.skip_special_tokens);
    EXPECT_FALSE(p.stream);
  }
}

TEST(Params, EveryRangeIsCheckedForBothDoors) {
  struct Case {
    const char* name;
    double bad;
    void (*set)(RequestParams&, double);
  };
  const Case cases[] = {
      {"max_tokens", 129, [](RequestParams& r, double v) { r.max_tokens = v; }},
      {"max_completion_tokens", 0, [](RequestParams& r, double v) { r.max_completion_tokens = v; }},
      {"temperature", 2.5, [](RequestParams& r, double v) { r.temperature = v; }},
      {"top_p", 0, [](RequestParams& r, double v) { r.top_p = v; }},
      {"top_k", -2, [](RequestParams& r, double v) { r.top_k = v; }},
      {"min_p", 1.5, [](RequestParams& r, double v) { r.min_p = v; }},
      {"presence_penalty", -3, [](RequestParams& r, double v) { r.presence_penalty = v; }},
      {"frequency_penalty", 3, [](RequestParams& r, double v) { r.frequency_penalty = v; }},
      {"repetition_penalty", 0, [](RequestParams& r, double v) { r.repetition_penalty = v; }},
      {"n", 5, [](RequestParams& r, double v) { r.n = v; }},
      {"logprobs", 6, [](RequestParams& r, double v) { r.logprobs_count = v; }},
      {"min_tokens", 129, [](RequestParams& r, double v) { r.min_tokens = v; }},
      {"priority", 2e9, [](RequestParams& r, double v) { r.priority = v; }},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(Refused(Json({{c.name, c.bad}})), c.name);
    RequestParams typed;
    c.set(typed, c.bad);
    EXPECT_EQ(Refused(Typed(typed)), c.name);
  }
}

TEST(Params, TypesAreCheckedOnlyWhereTheyCanBeWrong) {
  EXPECT_EQ(Refused(Json({{"temperature", "hot"}})), "temperature");
  EXPECT_EQ(Refused(Json({{"n", 1.5}})), "n");
  EXPECT_EQ(Refused(Json({{"stream", 1}})), "stream");
  EXPECT_EQ(Refused(Json({{"stop", {1, 2}}})), "stop");
  EXPECT_EQ(Refused(Json({{"logit_bias", {{"5", "x"}}}})), "logit_bias");
  EXPECT_EQ(Refused(Json({{"seed", 18446744073709551615ull}})), "seed");
  // An integral float is an integer, as in Python clients.
  EXPECT_EQ(Refused(Json({{"n", 2.0}})), "");
  // Values JSON cannot carry but a proto can are refused too.
  RequestParams nan;
  nan.temperature = std::nan("");
  EXPECT_EQ(Refused(Typed(nan)), "temperature");
  RequestParams inf;
  inf.logit_bias = {{"3", std::numeric_limits<double>::infinity()}};
  EXPECT_EQ(Refused(Typed(inf)), "logit_bias");
}

TEST(Params, LogitBiasKeysAreTokenIdsGivenOnce) {
  auto ok = Json({{"logit_bias", {{"7", -1.5}, {"3", 2}}}});
  ASSERT_EQ(Refused(ok), "");
  const auto& bias = std::get<ParsedParams>(ok).request.sampling.logit_bias;
  ASSERT_EQ(bias.size(), 2u);
  EXPECT_EQ(bias[0], std::make_pair(3, 2.0f));
  EXPECT_EQ(bias[1], std::make_pair(7, -1.5f));
  EXPECT_EQ(Refused(Json({{"logit_bias", {{"100", 1}}}})), "logit_bias");  // vocab is 100
  EXPECT_EQ(Refused(Json({{"logit_bias", {{"x", 1}}}})), "logit_bias");
  EXPECT_EQ(Refused(Json({{"logit_bias", {{"5", 101}}}})), "logit_bias");
  RequestParams twice;
  twice.logit_bias = {{"5", 1}, {"05", 2}};
  EXPECT_EQ(Refused(Typed(twice)), "logit_bias");
}

TEST(Params, CombinationsAreChecked) {
  EXPECT_EQ(Refused(Json({{"min_tokens", 10}, {"max_tokens", 5}})), "min_tokens");
  EXPECT_EQ(Refused(Json({{"stream_options", {{"include_usage", true}}}})), "stream_options");
  EXPECT_EQ(Refused(Json({{"best_of", 2}, {"n", 1}})), "best_of");
  EXPECT_EQ(Refused(Json({{"stop", {"a", "b", "c"}}})), "stop");
  EXPECT_EQ(Refused(Json({{"stop_token_ids", {100}}})), "stop_token_ids");
  EXPECT_EQ(Refused(Json({{"top_logprobs", 2}}, Endpoint::kChat)), "top_logprobs");
  auto chat = Json({{"logprobs", true}, {"top_logprobs", 2}}, Endpoint::kChat);
  ASSERT_EQ(Refused(chat), "");
  EXPECT_EQ(std::get<ParsedParams>(chat).request.sampling.num_logprobs, 2);
  // max_completion_tokens wins over max_tokens; empty stop strings are dropped.
  auto both = Json({{"max_tokens", 9}, {"max_completion_tokens", 4}, {"stop", {"", "x"}}});
  ASSERT_EQ(Refused(both), "");
  EXPECT_EQ(std::get<ParsedParams>(both).max_tokens, 4);
  EXPECT_EQ(std::get<ParsedParams>(both).request.stop, std::vector<std::string>{"x"});
}

// A chat request without max_tokens gets the rest of the context; with truncation on, at
// least a quarter of it (its prompt then loses its middle).
TEST(Params, DefaultChatMaxTokens) {
  ApiLimits limits = Limits();
  EXPECT_EQ(DefaultChatMaxTokens(limits, 100), 28);
  EXPECT_EQ(DefaultChatMaxTokens(limits, 128), 1);
  EXPECT_EQ(DefaultChatMaxTokens(limits, 500), 1);
  limits.truncate_context = true;
  EXPECT_EQ(DefaultChatMaxTokens(limits, 100), 32);
  EXPECT_EQ(DefaultChatMaxTokens(limits, 500), 32);
  EXPECT_EQ(DefaultChatMaxTokens(limits, 10), 118);
}

}  // namespace
}  // namespace strata::api
