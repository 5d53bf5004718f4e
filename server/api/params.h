// Parsing and validation of the generation parameters shared by /v1/completions,
// /v1/chat/completions and the gRPC API: OpenAI's, plus the extras vLLM accepts.
// Type and range errors name the parameter.
#ifndef STRATA_SERVER_API_PARAMS_H_
#define STRATA_SERVER_API_PARAMS_H_

#include <optional>
#include <string>
#include <variant>

#include "nlohmann/json.hpp"
#include "server/api/api_error.h"
#include "server/request.h"

namespace strata::api {

struct ApiLimits {
  int max_n = 16;
  int max_logprobs = 20;
  int max_stop_sequences = 16;
  int64_t max_model_len = 4096;
  int32_t vocab_size = 0;  // also the most logit_bias entries a request may give
};

// What the request asked for beyond GenerateRequest.
struct ParsedParams {
  GenerateRequest request;        // everything but the prompt tokens
  std::optional<int> max_tokens;  // absent: the endpoint's default
  bool stream = false;
  bool include_usage = false;
  bool return_tokens_as_token_ids = false;
  bool echo = false;
  int top_logprobs = 0;  // chat: top_logprobs; completions: logprobs
  bool logprobs = false;
  std::string user;
};

enum class Endpoint { kCompletions, kChat };

// Parses the common parameters of `body` (already a JSON object).
std::variant<ParsedParams, ApiError> ParseParams(const nlohmann::json& body, Endpoint endpoint,
                                                 const ApiLimits& limits);

// The model a request names: empty is a 400 ('model' is required), another name than the
// served one a 404; nullopt when it is the served model.
std::optional<ApiError> CheckModel(const std::string& requested, const std::string& served);

// max_tokens when a chat request gives none: the rest of the context (at least 1).
int DefaultChatMaxTokens(const ApiLimits& limits, size_t prompt_tokens);

// Typed field readers: absent or null gives nullopt; a wrong type or range is an ApiError.
std::variant<std::optional<int64_t>, ApiError> GetInt(const nlohmann::json& body,
                                                      const std::string& name, int64_t lo,
                                                      int64_t hi);
std::variant<std::optional<double>, ApiError> GetNumber(const nlohmann::json& body,
                                                        const std::string& name, double lo,
                                                        double hi);
std::variant<std::optional<bool>, ApiError> GetBool(const nlohmann::json& body,
                                                    const std::string& name);

}  // namespace strata::api

#endif  // STRATA_SERVER_API_PARAMS_H_
