// The generation parameters shared by /v1/completions, /v1/chat/completions and the gRPC
// API: OpenAI's, plus the extras vLLM accepts. Both APIs build one typed request,
// RequestParams: the HTTP API from its JSON body (ReadParamsJson: type errors), the gRPC
// API from its proto (types fixed by the proto). ValidateParams then checks ranges and
// combinations and applies defaults, in one place for both. Errors name the parameter.
#ifndef STRATA_SERVER_API_PARAMS_H_
#define STRATA_SERVER_API_PARAMS_H_

#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

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
  // --context_overflow=truncate: a prompt that does not fit loses its middle
  // (server/truncation.h) rather than being refused.
  bool truncate_context = false;
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

// Structured output as the client asked for it: OpenAI's response_format, vLLM's
// structured_outputs, or vLLM's older guided_* fields (one of them per request).
struct StructuredOutput {
  enum class Kind { kJsonObject, kJsonSchema, kRegex, kChoice, kGrammar };
  Kind kind = Kind::kJsonObject;
  std::string text;  // the schema's JSON, the regex or the GBNF
  std::vector<std::string> choices;
  std::string param;  // the field that asked, for errors
};

// What a client asked for, typed but not yet checked against ranges or each other. Absent
// fields are nullopt (or empty).
struct RequestParams {
  std::optional<int64_t> max_tokens;
  std::optional<int64_t> max_completion_tokens;
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<int64_t> top_k;
  std::optional<double> min_p;
  std::optional<double> presence_penalty;
  std::optional<double> frequency_penalty;
  std::optional<double> repetition_penalty;
  std::optional<int64_t> seed;
  std::optional<int64_t> n;
  std::optional<int64_t> best_of;
  // Keys as the client wrote them (JSON object keys are strings); checked to be token ids.
  std::vector<std::pair<std::string, double>> logit_bias;
  // Completions: logprobs is a count; chat: a flag, with top_logprobs as the count.
  std::optional<int64_t> logprobs_count;
  std::optional<bool> logprobs;
  std::optional<int64_t> top_logprobs;
  std::optional<bool> echo;
  std::vector<std::string> stop;
  std::vector<int64_t> stop_token_ids;
  std::optional<bool> ignore_eos;
  std::optional<int64_t> min_tokens;
  std::optional<int64_t> priority;
  std::optional<bool> skip_special_tokens;
  std::optional<bool> include_stop_str_in_output;
  std::optional<bool> return_tokens_as_token_ids;
  std::optional<bool> stream;
  bool has_stream_options = false;
  std::optional<bool> include_usage;  // stream_options.include_usage
  std::string user;
  std::optional<StructuredOutput> structured;
};

// The typed request from a JSON body (already an object); a field of the wrong type is an
// error naming it.
std::variant<RequestParams, ApiError> ReadParamsJson(const nlohmann::ordered_json& body,
                                                     Endpoint endpoint);

// Ranges, combinations and defaults: the one validation both APIs use. Structured output
// is compiled here (common/grammar, cached by content), so that a bad schema is a 400.
std::variant<ParsedParams, ApiError> ValidateParams(const RequestParams& in, Endpoint endpoint,
                                                    const ApiLimits& limits);

// ReadParamsJson, then ValidateParams.
std::variant<ParsedParams, ApiError> ParseParams(const nlohmann::ordered_json& body,
                                                 Endpoint endpoint, const ApiLimits& limits);

// The model a request names: empty (not named) means the one served, another name than
// the served one is a 404; nullopt when the request may go on.
std::optional<ApiError> CheckModel(const std::string& requested, const std::string& served);

// max_tokens when a chat request gives none: the rest of the context (at least 1). With
// truncation, at least a quarter of the context (the prompt then loses its middle).
int DefaultChatMaxTokens(const ApiLimits& limits, size_t prompt_tokens);

}  // namespace strata::api

#endif  // STRATA_SERVER_API_PARAMS_H_
