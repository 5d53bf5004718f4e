#include "server/api/params.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace strata::api {

using json = nlohmann::json;

std::variant<std::optional<int64_t>, ApiError> GetInt(const json& body, const std::string& name,
                                                      int64_t lo, int64_t hi) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return std::optional<int64_t>();
  int64_t value;
  if (it->is_number_integer()) {
    if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return BadRequest(absl::StrCat("'", name, "' is out of range"), name);
    }
    value = it->get<int64_t>();
  } else if (it->is_number_float() && std::isfinite(it->get<double>()) &&
             it->get<double>() == std::floor(it->get<double>()) &&
             std::abs(it->get<double>()) < 9e15) {
    value = static_cast<int64_t>(it->get<double>());
  } else {
    return BadRequest(absl::StrCat("'", name, "' must be an integer"), name);
  }
  if (value < lo || value > hi) {
    return BadRequest(
        absl::StrCat("'", name, "' must be between ", lo, " and ", hi, ", got ", value), name);
  }
  return std::optional<int64_t>(value);
}

std::variant<std::optional<double>, ApiError> GetNumber(const json& body, const std::string& name,
                                                        double lo, double hi) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return std::optional<double>();
  if (!it->is_number()) return BadRequest(absl::StrCat("'", name, "' must be a number"), name);
  const double value = it->get<double>();
  if (!std::isfinite(value) || value < lo || value > hi) {
    return BadRequest(absl::StrCat("'", name, "' must be between ", lo, " and ", hi), name);
  }
  return std::optional<double>(value);
}

std::variant<std::optional<bool>, ApiError> GetBool(const json& body, const std::string& name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return std::optional<bool>();
  if (!it->is_boolean()) return BadRequest(absl::StrCat("'", name, "' must be a boolean"), name);
  return std::optional<bool>(it->get<bool>());
}

namespace {

// Unwraps a typed read or returns its error from the enclosing function.
#define STRATA_PARAM(var, expr)                              \
  auto var##_or = (expr);                                    \
  if (auto* e = std::get_if<ApiError>(&var##_or)) return *e; \
  auto var = std::get<0>(var##_or)

}  // namespace

std::variant<ParsedParams, ApiError> ParseParams(const json& body, Endpoint endpoint,
                                                 const ApiLimits& limits) {
  ParsedParams p;
  GenerateRequest& r = p.request;
  SamplingParams& s = r.sampling;

  STRATA_PARAM(max_tokens, GetInt(body, "max_tokens", 1, limits.max_model_len));
  STRATA_PARAM(max_completion_tokens,
               GetInt(body, "max_completion_tokens", 1, limits.max_model_len));
  if (max_completion_tokens) {
    p.max_tokens = static_cast<int>(*max_completion_tokens);
  } else if (max_tokens) {
    p.max_tokens = static_cast<int>(*max_tokens);
  }
  STRATA_PARAM(temperature, GetNumber(body, "temperature", 0.0, 2.0));
  s.temperature = temperature ? static_cast<float>(*temperature) : 1.0f;
  STRATA_PARAM(top_p, GetNumber(body, "top_p", 1e-9, 1.0));
  s.top_p = top_p ? static_cast<float>(*top_p) : 1.0f;
  STRATA_PARAM(top_k, GetInt(body, "top_k", -1, 1 << 30));
  s.top_k = top_k ? static_cast<int32_t>(*top_k) : 0;
  if (s.top_k < 0) s.top_k = 0;
  STRATA_PARAM(min_p, GetNumber(body, "min_p", 0.0, 1.0));
  s.min_p = min_p ? static_cast<float>(*min_p) : 0.0f;
  STRATA_PARAM(presence, GetNumber(body, "presence_penalty", -2.0, 2.0));
  s.presence_penalty = presence ? static_cast<float>(*presence) : 0.0f;
  STRATA_PARAM(frequency, GetNumber(body, "frequency_penalty", -2.0, 2.0));
  s.frequency_penalty = frequency ? static_cast<float>(*frequency) : 0.0f;
  STRATA_PARAM(repetition, GetNumber(body, "repetition_penalty", 1e-3, 10.0));
  s.repetition_penalty = repetition ? static_cast<float>(*repetition) : 1.0f;
  STRATA_PARAM(seed, GetInt(body, "seed", INT64_MIN, INT64_MAX));
  if (seed) {
    s.seed = static_cast<uint64_t>(*seed);
    r.has_seed = true;
  }
  STRATA_PARAM(n, GetInt(body, "n", 1, limits.max_n));
  r.n = n ? static_cast<int>(*n) : 1;
  if (body.contains("best_of") && !body["best_of"].is_null()) {
    STRATA_PARAM(best_of, GetInt(body, "best_of", 1, limits.max_n));
    if (best_of && *best_of != r.n) {
      return BadRequest("best_of different from n is not supported", "best_of");
    }
  }

  // logit_bias: {"token id": bias}, at most one entry per token of the vocabulary.
  if (body.contains("logit_bias") && !body["logit_bias"].is_null()) {
    const json& bias = body["logit_bias"];
    if (!bias.is_object()) return BadRequest("'logit_bias' must be an object", "logit_bias");
    if (bias.size() > static_cast<size_t>(std::max(limits.vocab_size, 0))) {
      return BadRequest(absl::StrCat("'logit_bias' has ", bias.size(), " entries; at most ",
                                     limits.vocab_size, " (the vocabulary size) are allowed"),
                        "logit_bias");
    }
    s.logit_bias.reserve(bias.size());
    for (const auto& [key, value] : bias.items()) {
      int64_t token;
      if (!absl::SimpleAtoi(key, &token) || token < 0 || token >= limits.vocab_size) {
        return BadRequest(absl::StrCat("logit_bias key '", key.substr(0, 32),
                                       "' is not a token id (0 to ", limits.vocab_size - 1, ")"),
                          "logit_bias");
      }
      if (!value.is_number() || !std::isfinite(value.get<double>()) ||
          std::abs(value.get<double>()) > 100.0) {
        return BadRequest("logit_bias values must be numbers in [-100, 100]", "logit_bias");
      }
      s.logit_bias.emplace_back(static_cast<int32_t>(token), value.get<float>());
    }
    std::sort(s.logit_bias.begin(), s.logit_bias.end());
    for (size_t i = 1; i < s.logit_bias.size(); ++i) {
      if (s.logit_bias[i].first == s.logit_bias[i - 1].first) {
        return BadRequest(
            absl::StrCat("logit_bias gives token ", s.logit_bias[i].first, " more than once"),
            "logit_bias");
      }
    }
  }

  // Logprobs: completions take an integer; chat a boolean plus top_logprobs.
  if (endpoint == Endpoint::kCompletions) {
    STRATA_PARAM(logprobs, GetInt(body, "logprobs", 0, limits.max_logprobs));
    if (logprobs) {
      p.logprobs = true;
      p.top_logprobs = static_cast<int>(*logprobs);
    }
    STRATA_PARAM(echo, GetBool(body, "echo"));
    p.echo = echo.value_or(false);
  } else {
    STRATA_PARAM(logprobs, GetBool(body, "logprobs"));
    p.logprobs = logprobs.value_or(false);
    STRATA_PARAM(top_logprobs, GetInt(body, "top_logprobs", 0, limits.max_logprobs));
    if (top_logprobs) {
      if (!p.logprobs) return BadRequest("'top_logprobs' needs 'logprobs': true", "top_logprobs");
      p.top_logprobs = static_cast<int>(*top_logprobs);
    }
  }
  s.num_logprobs = p.logprobs ? p.top_logprobs : -1;

  // stop: a string or a list of strings.
  if (body.contains("stop") && !body["stop"].is_null()) {
    const json& stop = body["stop"];
    if (stop.is_string()) {
      if (!stop.get<std::string>().empty()) r.stop.push_back(stop.get<std::string>());
    } else if (stop.is_array()) {
      if (static_cast<int>(stop.size()) > limits.max_stop_sequences) {
        return BadRequest(absl::StrCat("at most ", limits.max_stop_sequences, " stop sequences"),
                          "stop");
      }
      for (const json& s_item : stop) {
        if (!s_item.is_string()) return BadRequest("'stop' must hold strings", "stop");
        if (!s_item.get<std::string>().empty()) r.stop.push_back(s_item.get<std::string>());
      }
    } else {
      return BadRequest("'stop' must be a string or a list of strings", "stop");
    }
  }
  if (body.contains("stop_token_ids") && !body["stop_token_ids"].is_null()) {
    const json& ids = body["stop_token_ids"];
    if (!ids.is_array()) return BadRequest("'stop_token_ids' must be a list", "stop_token_ids");
    for (const json& id : ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
          id.get<int64_t>() >= limits.vocab_size) {
        return BadRequest("'stop_token_ids' must hold token ids", "stop_token_ids");
      }
      r.stop_token_ids.push_back(id.get<int32_t>());
    }
  }
  STRATA_PARAM(ignore_eos, GetBool(body, "ignore_eos"));
  r.ignore_eos = ignore_eos.value_or(false);
  STRATA_PARAM(min_tokens, GetInt(body, "min_tokens", 0, limits.max_model_len));
  r.min_tokens = min_tokens ? static_cast<int>(*min_tokens) : 0;
  STRATA_PARAM(priority, GetInt(body, "priority", -(1 << 30), 1 << 30));
  r.priority = priority ? static_cast<int>(*priority) : 0;
  STRATA_PARAM(skip_special, GetBool(body, "skip_special_tokens"));
  r.skip_special_tokens = skip_special.value_or(true);
  STRATA_PARAM(include_stop, GetBool(body, "include_stop_str_in_output"));
  r.include_stop_str_in_output = include_stop.value_or(false);
  STRATA_PARAM(token_ids, GetBool(body, "return_tokens_as_token_ids"));
  p.return_tokens_as_token_ids = token_ids.value_or(false);
  STRATA_PARAM(stream, GetBool(body, "stream"));
  p.stream = stream.value_or(false);
  if (body.contains("stream_options") && !body["stream_options"].is_null()) {
    const json& options = body["stream_options"];
    if (!options.is_object())
      return BadRequest("'stream_options' must be an object", "stream_options");
    if (!p.stream) return BadRequest("'stream_options' needs 'stream': true", "stream_options");
    STRATA_PARAM(include_usage, GetBool(options, "include_usage"));
    p.include_usage = include_usage.value_or(false);
  }
  if (body.contains("user") && !body["user"].is_null()) {
    if (!body["user"].is_string()) return BadRequest("'user' must be a string", "user");
    p.user = body["user"].get<std::string>();
  }
  if (r.min_tokens > 0 && p.max_tokens && r.min_tokens > *p.max_tokens) {
    return BadRequest("'min_tokens' must not exceed 'max_tokens'", "min_tokens");
  }
  return p;
}

std::optional<ApiError> CheckModel(const std::string& requested, const std::string& served) {
  if (requested.empty()) return BadRequest("'model' is required", "model");
  if (requested != served) return UnknownModel(requested);
  return std::nullopt;
}

int DefaultChatMaxTokens(const ApiLimits& limits, size_t prompt_tokens) {
  return std::max<int>(
      1, static_cast<int>(limits.max_model_len - static_cast<int64_t>(prompt_tokens)));
}

}  // namespace strata::api
