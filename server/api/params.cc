#include "server/api/params.h"

#include <algorithm>
#include <cmath>
#include <list>
#include <mutex>
#include <unordered_map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/grammar/grammar.h"
#include "common/grammar/json_schema.h"

namespace strata::api {

using json = nlohmann::ordered_json;  // keeps a schema's property order

namespace {

// Unwraps a typed read or returns its error from the enclosing function.
#define STRATA_READ(field, expr)                               \
  {                                                            \
    auto value_or = (expr);                                    \
    if (auto* e = std::get_if<ApiError>(&value_or)) return *e; \
    field = std::get<0>(value_or);                             \
  }

// JSON readers: absent or null gives nullopt; a wrong type is an error naming the field.
std::variant<std::optional<int64_t>, ApiError> ReadInt(const json& body, const std::string& name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return std::optional<int64_t>();
  if (it->is_number_integer()) {
    if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return BadRequest(absl::StrCat("'", name, "' is out of range"), name);
    }
    return std::optional<int64_t>(it->get<int64_t>());
  }
  if (it->is_number_float() && std::isfinite(it->get<double>()) &&
      it->get<double>() == std::floor(it->get<double>()) && std::abs(it->get<double>()) < 9e15) {
    return std::optional<int64_t>(static_cast<int64_t>(it->get<double>()));
  }
  return BadRequest(absl::StrCat("'", name, "' must be an integer"), name);
}

std::variant<std::optional<double>, ApiError> ReadNumber(const json& body,
                                                         const std::string& name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return std::optional<double>();
  if (!it->is_number()) return BadRequest(absl::StrCat("'", name, "' must be a number"), name);
  return std::optional<double>(it->get<double>());
}

std::variant<std::optional<bool>, ApiError> ReadBool(const json& body, const std::string& name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return std::optional<bool>();
  if (!it->is_boolean()) return BadRequest(absl::StrCat("'", name, "' must be a boolean"), name);
  return std::optional<bool>(it->get<bool>());
}

bool Given(const json& body, const char* name) {
  return body.contains(name) && !body[name].is_null();
}

// A schema given as an object, or as its JSON text (vLLM accepts both).
std::variant<std::string, ApiError> SchemaText(const json& value, const std::string& param) {
  if (value.is_object() || value.is_boolean()) return value.dump();
  if (value.is_string()) return value.get<std::string>();
  return BadRequest(absl::StrCat("'", param, "' must be a JSON Schema (an object)"), param);
}

std::variant<std::optional<StructuredOutput>, ApiError> ReadStructured(const json& body) {
  std::vector<StructuredOutput> asked;
  auto string_field = [&](const json& obj, const char* key, const std::string& param,
                          StructuredOutput::Kind kind) -> std::optional<ApiError> {
    if (!Given(obj, key)) return std::nullopt;
    if (!obj[key].is_string())
      return BadRequest(absl::StrCat("'", param, "' must be a string"), param);
    asked.push_back({kind, obj[key].get<std::string>(), {}, param});
    return std::nullopt;
  };
  auto choice_field = [&](const json& obj, const char* key,
                          const std::string& param) -> std::optional<ApiError> {
    if (!Given(obj, key)) return std::nullopt;
    const json& list = obj[key];
    if (!list.is_array() || list.empty()) {
      return BadRequest(absl::StrCat("'", param, "' must be a non-empty list of strings"), param);
    }
    if (list.size() > 10000)
      return BadRequest(absl::StrCat("'", param, "' has more than 10000 choices"), param);
    StructuredOutput out{StructuredOutput::Kind::kChoice, "", {}, param};
    for (const json& c : list) {
      if (!c.is_string()) return BadRequest(absl::StrCat("'", param, "' must hold strings"), param);
      out.choices.push_back(c.get<std::string>());
    }
    asked.push_back(std::move(out));
    return std::nullopt;
  };
  auto schema_field = [&](const json& obj, const char* key,
                          const std::string& param) -> std::optional<ApiError> {
    if (!Given(obj, key)) return std::nullopt;
    auto text = SchemaText(obj[key], param);
    if (auto* e = std::get_if<ApiError>(&text)) return *e;
    asked.push_back({StructuredOutput::Kind::kJsonSchema, std::get<std::string>(text), {}, param});
    return std::nullopt;
  };
  if (Given(body, "response_format")) {
    const json& rf = body["response_format"];
    if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string()) {
      return BadRequest("'response_format' must be an object with a 'type'", "response_format");
    }
    const std::string type = rf["type"].get<std::string>();
    if (type == "json_object") {
      asked.push_back({StructuredOutput::Kind::kJsonObject, "", {}, "response_format"});
    } else if (type == "json_schema") {
      if (!rf.contains("json_schema") || !rf["json_schema"].is_object() ||
          !rf["json_schema"].contains("schema")) {
        return BadRequest(
            "'response_format' of type json_schema needs 'json_schema': {'name', 'schema'}",
            "response_format.json_schema");
      }
      const json& js = rf["json_schema"];
      if (js.contains("strict") && !js["strict"].is_boolean() && !js["strict"].is_null()) {
        return BadRequest("'strict' must be a boolean", "response_format.json_schema.strict");
      }
      // strict or not, the output follows the schema.
      if (auto e = schema_field(js, "schema", "response_format.json_schema.schema")) return *e;
    } else if (type != "text") {
      return BadRequest("'response_format' type must be text, json_object or json_schema",
                        "response_format");
    }
  }
  if (auto e = schema_field(body, "guided_json", "guided_json")) return *e;
  if (auto e = string_field(body, "guided_regex", "guided_regex", StructuredOutput::Kind::kRegex))
    return *e;
  if (auto e = choice_field(body, "guided_choice", "guided_choice")) return *e;
  if (auto e = string_field(body, "guided_grammar", "guided_grammar",
                            StructuredOutput::Kind::kGrammar)) {
    return *e;
  }
  if (Given(body, "structured_outputs")) {
    const json& so = body["structured_outputs"];
    if (!so.is_object())
      return BadRequest("'structured_outputs' must be an object", "structured_outputs");
    if (auto e = schema_field(so, "json", "structured_outputs.json")) return *e;
    if (auto e =
            string_field(so, "regex", "structured_outputs.regex", StructuredOutput::Kind::kRegex)) {
      return *e;
    }
    if (auto e = choice_field(so, "choice", "structured_outputs.choice")) return *e;
    if (auto e = string_field(so, "grammar", "structured_outputs.grammar",
                              StructuredOutput::Kind::kGrammar)) {
      return *e;
    }
    if (Given(so, "json_object")) {
      if (!so["json_object"].is_boolean()) {
        return BadRequest("'structured_outputs.json_object' must be a boolean",
                          "structured_outputs.json_object");
      }
      if (so["json_object"].get<bool>()) {
        asked.push_back(
            {StructuredOutput::Kind::kJsonObject, "", {}, "structured_outputs.json_object"});
      }
    }
  }
  if (asked.size() > 1) {
    return BadRequest(absl::StrCat("give one kind of structured output, not '", asked[0].param,
                                   "' and '", asked[1].param, "'"),
                      asked[1].param);
  }
  if (asked.empty()) return std::optional<StructuredOutput>();
  return std::optional<StructuredOutput>(std::move(asked[0]));
}

// Compiled grammars (GBNF text) by request, the most recent kCompiledCapacity kept: a schema
// is compiled once however many requests use it.
constexpr size_t kCompiledCapacity = 512;
std::mutex compiled_mu;
std::list<std::string> compiled_order;
std::unordered_map<std::string, std::pair<std::string, std::list<std::string>::iterator>> compiled;

std::variant<std::string, ApiError> CompileStructured(const StructuredOutput& so) {
  // Each choice with its length, so that no choice can pass for several.
  std::string key = absl::StrCat(static_cast<int>(so.kind), ":", so.text);
  for (const std::string& c : so.choices) absl::StrAppend(&key, ":", c.size(), ":", c);

  {
    std::lock_guard<std::mutex> lock(compiled_mu);
    auto it = compiled.find(key);
    if (it != compiled.end()) {
      compiled_order.splice(compiled_order.begin(), compiled_order, it->second.second);
      return it->second.first;
    }
  }
  if (so.kind == StructuredOutput::Kind::kChoice && so.choices.empty()) {
    return BadRequest("the choice list is empty", so.param);
  }
  absl::StatusOr<std::string> gbnf;
  switch (so.kind) {
    case StructuredOutput::Kind::kJsonObject:
      gbnf = grammar::JsonObjectGrammar();
      break;
    case StructuredOutput::Kind::kJsonSchema:
      gbnf = grammar::JsonSchemaGrammar(so.text);
      break;
    case StructuredOutput::Kind::kRegex:
      gbnf = grammar::RegexGrammar(so.text);
      break;
    case StructuredOutput::Kind::kChoice:
      gbnf = grammar::ChoiceGrammar(so.choices);
      break;
    case StructuredOutput::Kind::kGrammar:
      if (so.text.size() > (1 << 20)) {
        gbnf = absl::InvalidArgumentError("the grammar is larger than 1 MiB");
      } else {
        gbnf = so.text;
      }
      break;
  }
  if (gbnf.ok()) {
    // The compute node compiles it again; checking here makes a bad one a 400.
    if (auto g = grammar::Grammar::Parse(*gbnf); !g.ok()) gbnf = g.status();
  }
  if (!gbnf.ok()) return BadRequest(std::string(gbnf.status().message()), so.param);
  std::lock_guard<std::mutex> lock(compiled_mu);
  if (!compiled.count(key)) {
    compiled_order.push_front(key);
    compiled[key] = {*gbnf, compiled_order.begin()};
    while (compiled.size() > kCompiledCapacity) {
      compiled.erase(compiled_order.back());
      compiled_order.pop_back();
    }
  }
  return *gbnf;
}

// Range checks of the validator.
std::optional<ApiError> CheckInt(const std::optional<int64_t>& value, const std::string& name,
                                 int64_t lo, int64_t hi) {
  if (!value || (*value >= lo && *value <= hi)) return std::nullopt;
  return BadRequest(
      absl::StrCat("'", name, "' must be between ", lo, " and ", hi, ", got ", *value), name);
}

std::optional<ApiError> CheckNumber(const std::optional<double>& value, const std::string& name,
                                    double lo, double hi) {
  if (!value || (std::isfinite(*value) && *value >= lo && *value <= hi)) return std::nullopt;
  return BadRequest(absl::StrCat("'", name, "' must be between ", lo, " and ", hi), name);
}

}  // namespace

std::variant<RequestParams, ApiError> ReadParamsJson(const json& body, Endpoint endpoint) {
  RequestParams p;
  STRATA_READ(p.max_tokens, ReadInt(body, "max_tokens"));
  STRATA_READ(p.max_completion_tokens, ReadInt(body, "max_completion_tokens"));
  STRATA_READ(p.temperature, ReadNumber(body, "temperature"));
  STRATA_READ(p.top_p, ReadNumber(body, "top_p"));
  STRATA_READ(p.top_k, ReadInt(body, "top_k"));
  STRATA_READ(p.min_p, ReadNumber(body, "min_p"));
  STRATA_READ(p.presence_penalty, ReadNumber(body, "presence_penalty"));
  STRATA_READ(p.frequency_penalty, ReadNumber(body, "frequency_penalty"));
  STRATA_READ(p.repetition_penalty, ReadNumber(body, "repetition_penalty"));
  STRATA_READ(p.seed, ReadInt(body, "seed"));
  STRATA_READ(p.n, ReadInt(body, "n"));
  STRATA_READ(p.best_of, ReadInt(body, "best_of"));

  // logit_bias: {"token id": bias}.
  if (Given(body, "logit_bias")) {
    const json& bias = body["logit_bias"];
    if (!bias.is_object()) return BadRequest("'logit_bias' must be an object", "logit_bias");
    p.logit_bias.reserve(bias.size());
    for (const auto& [key, value] : bias.items()) {
      if (!value.is_number()) {
        return BadRequest("logit_bias values must be numbers in [-100, 100]", "logit_bias");
      }
      p.logit_bias.emplace_back(key, value.get<double>());
    }
  }

  // Logprobs: completions take an integer; chat a boolean plus top_logprobs.
  if (endpoint == Endpoint::kCompletions) {
    STRATA_READ(p.logprobs_count, ReadInt(body, "logprobs"));
    STRATA_READ(p.echo, ReadBool(body, "echo"));
  } else {
    STRATA_READ(p.logprobs, ReadBool(body, "logprobs"));
    STRATA_READ(p.top_logprobs, ReadInt(body, "top_logprobs"));
  }

  // stop: a string or a list of strings.
  if (Given(body, "stop")) {
    const json& stop = body["stop"];
    if (stop.is_string()) {
      p.stop.push_back(stop.get<std::string>());
    } else if (stop.is_array()) {
      for (const json& item : stop) {
        if (!item.is_string()) return BadRequest("'stop' must hold strings", "stop");
        p.stop.push_back(item.get<std::string>());
      }
    } else {
      return BadRequest("'stop' must be a string or a list of strings", "stop");
    }
  }
  if (Given(body, "stop_token_ids")) {
    const json& ids = body["stop_token_ids"];
    if (!ids.is_array()) return BadRequest("'stop_token_ids' must be a list", "stop_token_ids");
    for (const json& id : ids) {
      if (!id.is_number_integer() ||
          (id.is_number_unsigned() && id.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))) {
        return BadRequest("'stop_token_ids' must hold token ids", "stop_token_ids");
      }
      p.stop_token_ids.push_back(id.get<int64_t>());
    }
  }
  STRATA_READ(p.ignore_eos, ReadBool(body, "ignore_eos"));
  STRATA_READ(p.min_tokens, ReadInt(body, "min_tokens"));
  STRATA_READ(p.priority, ReadInt(body, "priority"));
  STRATA_READ(p.skip_special_tokens, ReadBool(body, "skip_special_tokens"));
  STRATA_READ(p.include_stop_str_in_output, ReadBool(body, "include_stop_str_in_output"));
  STRATA_READ(p.return_tokens_as_token_ids, ReadBool(body, "return_tokens_as_token_ids"));
  STRATA_READ(p.stream, ReadBool(body, "stream"));
  if (Given(body, "stream_options")) {
    const json& options = body["stream_options"];
    if (!options.is_object()) {
      return BadRequest("'stream_options' must be an object", "stream_options");
    }
    p.has_stream_options = true;
    STRATA_READ(p.include_usage, ReadBool(options, "include_usage"));
  }
  if (Given(body, "user")) {
    if (!body["user"].is_string()) return BadRequest("'user' must be a string", "user");
    p.user = body["user"].get<std::string>();
  }
  STRATA_READ(p.structured, ReadStructured(body));
  return p;
}

#undef STRATA_READ

// Returns the check's error from the enclosing function.
#define STRATA_CHECK(expr) \
  if (auto e = (expr)) return *e

std::variant<ParsedParams, ApiError> ValidateParams(const RequestParams& in, Endpoint endpoint,
                                                    const ApiLimits& limits) {
  ParsedParams p;
  GenerateRequest& r = p.request;
  SamplingParams& s = r.sampling;

  STRATA_CHECK(CheckInt(in.max_tokens, "max_tokens", 1, limits.max_model_len));
  STRATA_CHECK(
      CheckInt(in.max_completion_tokens, "max_completion_tokens", 1, limits.max_model_len));
  if (in.max_completion_tokens) {
    p.max_tokens = static_cast<int>(*in.max_completion_tokens);
  } else if (in.max_tokens) {
    p.max_tokens = static_cast<int>(*in.max_tokens);
  }
  STRATA_CHECK(CheckNumber(in.temperature, "temperature", 0.0, 2.0));
  s.temperature = static_cast<float>(in.temperature.value_or(1.0));
  STRATA_CHECK(CheckNumber(in.top_p, "top_p", 1e-9, 1.0));
  s.top_p = static_cast<float>(in.top_p.value_or(1.0));
  STRATA_CHECK(CheckInt(in.top_k, "top_k", -1, 1 << 30));
  s.top_k = std::max<int32_t>(0, static_cast<int32_t>(in.top_k.value_or(0)));
  STRATA_CHECK(CheckNumber(in.min_p, "min_p", 0.0, 1.0));
  s.min_p = static_cast<float>(in.min_p.value_or(0.0));
  STRATA_CHECK(CheckNumber(in.presence_penalty, "presence_penalty", -2.0, 2.0));
  s.presence_penalty = static_cast<float>(in.presence_penalty.value_or(0.0));
  STRATA_CHECK(CheckNumber(in.frequency_penalty, "frequency_penalty", -2.0, 2.0));
  s.frequency_penalty = static_cast<float>(in.frequency_penalty.value_or(0.0));
  STRATA_CHECK(CheckNumber(in.repetition_penalty, "repetition_penalty", 1e-3, 10.0));
  s.repetition_penalty = static_cast<float>(in.repetition_penalty.value_or(1.0));
  if (in.seed) {
    s.seed = static_cast<uint64_t>(*in.seed);
    r.has_seed = true;
  }
  STRATA_CHECK(CheckInt(in.n, "n", 1, limits.max_n));
  r.n = static_cast<int>(in.n.value_or(1));
  STRATA_CHECK(CheckInt(in.best_of, "best_of", 1, limits.max_n));
  if (in.best_of && *in.best_of != r.n) {
    return BadRequest("best_of different from n is not supported", "best_of");
  }

  // logit_bias: at most one entry per token of the vocabulary.
  if (in.logit_bias.size() > static_cast<size_t>(std::max(limits.vocab_size, 0))) {
    return BadRequest(absl::StrCat("'logit_bias' has ", in.logit_bias.size(), " entries; at most ",
                                   limits.vocab_size, " (the vocabulary size) are allowed"),
                      "logit_bias");
  }
  s.logit_bias.reserve(in.logit_bias.size());
  for (const auto& [key, value] : in.logit_bias) {
    int64_t token;
    if (!absl::SimpleAtoi(key, &token) || token < 0 || token >= limits.vocab_size) {
      return BadRequest(absl::StrCat("logit_bias key '", key.substr(0, 32),
                                     "' is not a token id (0 to ", limits.vocab_size - 1, ")"),
                        "logit_bias");
    }
    if (!std::isfinite(value) || std::abs(value) > 100.0) {
      return BadRequest("logit_bias values must be numbers in [-100, 100]", "logit_bias");
    }
    s.logit_bias.emplace_back(static_cast<int32_t>(token), static_cast<float>(value));
  }
  std::sort(s.logit_bias.begin(), s.logit_bias.end());
  for (size_t i = 1; i < s.logit_bias.size(); ++i) {
    if (s.logit_bias[i].first == s.logit_bias[i - 1].first) {
      return BadRequest(
          absl::StrCat("logit_bias gives token ", s.logit_bias[i].first, " more than once"),
          "logit_bias");
    }
  }

  if (endpoint == Endpoint::kCompletions) {
    STRATA_CHECK(CheckInt(in.logprobs_count, "logprobs", 0, limits.max_logprobs));
    if (in.logprobs_count) {
      p.logprobs = true;
      p.top_logprobs = static_cast<int>(*in.logprobs_count);
    }
    p.echo = in.echo.value_or(false);
  } else {
    p.logprobs = in.logprobs.value_or(false);
    STRATA_CHECK(CheckInt(in.top_logprobs, "top_logprobs", 0, limits.max_logprobs));
    if (in.top_logprobs) {
      if (!p.logprobs) return BadRequest("'top_logprobs' needs 'logprobs': true", "top_logprobs");
      p.top_logprobs = static_cast<int>(*in.top_logprobs);
    }
  }
  s.num_logprobs = p.logprobs ? p.top_logprobs : -1;

  if (static_cast<int>(in.stop.size()) > limits.max_stop_sequences) {
    return BadRequest(absl::StrCat("at most ", limits.max_stop_sequences, " stop sequences"),
                      "stop");
  }
  for (const std::string& stop : in.stop) {
    if (!stop.empty()) r.stop.push_back(stop);
  }
  for (int64_t id : in.stop_token_ids) {
    if (id < 0 || id >= limits.vocab_size) {
      return BadRequest("'stop_token_ids' must hold token ids", "stop_token_ids");
    }
    r.stop_token_ids.push_back(static_cast<int32_t>(id));
  }
  r.ignore_eos = in.ignore_eos.value_or(false);
  STRATA_CHECK(CheckInt(in.min_tokens, "min_tokens", 0, limits.max_model_len));
  r.min_tokens = static_cast<int>(in.min_tokens.value_or(0));
  STRATA_CHECK(CheckInt(in.priority, "priority", -(1 << 30), 1 << 30));
  r.priority = static_cast<int>(in.priority.value_or(0));
  r.skip_special_tokens = in.skip_special_tokens.value_or(true);
  r.include_stop_str_in_output = in.include_stop_str_in_output.value_or(false);
  p.return_tokens_as_token_ids = in.return_tokens_as_token_ids.value_or(false);
  p.stream = in.stream.value_or(false);
  if (in.has_stream_options) {
    if (!p.stream) return BadRequest("'stream_options' needs 'stream': true", "stream_options");
    p.include_usage = in.include_usage.value_or(false);
  }
  p.user = in.user;
  if (r.min_tokens > 0 && p.max_tokens && r.min_tokens > *p.max_tokens) {
    return BadRequest("'min_tokens' must not exceed 'max_tokens'", "min_tokens");
  }
  if (in.structured) {
    auto gbnf = CompileStructured(*in.structured);
    if (auto* e = std::get_if<ApiError>(&gbnf)) return *e;
    r.grammar = std::get<std::string>(std::move(gbnf));
  }
  return p;
}

#undef STRATA_CHECK

std::variant<ParsedParams, ApiError> ParseParams(const json& body, Endpoint endpoint,
                                                 const ApiLimits& limits) {
  auto typed = ReadParamsJson(body, endpoint);
  if (auto* e = std::get_if<ApiError>(&typed)) return *e;
  return ValidateParams(std::get<RequestParams>(typed), endpoint, limits);
}

std::optional<ApiError> CheckModel(const std::string& requested, const std::string& served) {
  // One model is served: a request that names none means it (as vLLM allows).
  if (requested.empty()) return std::nullopt;
  if (requested != served) return UnknownModel(requested);
  return std::nullopt;
}

int DefaultChatMaxTokens(const ApiLimits& limits, size_t prompt_tokens) {
  const int64_t rest = limits.max_model_len - static_cast<int64_t>(prompt_tokens);
  const int64_t floor = limits.truncate_context ? limits.max_model_len / 4 : 1;
  return static_cast<int>(std::max<int64_t>({rest, floor, 1}));
}

}  // namespace strata::api
