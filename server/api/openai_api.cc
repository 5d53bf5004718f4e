#include "server/api/openai_api.h"

#include <cstring>
#include <mutex>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/logging.h"
#include "common/base/stopwatch.h"
#include "common/grammar/grammar.h"
#include "common/tokenizer/utf8.h"
#include "server/api/json_body.h"
#include "server/api/tool_calls.h"

namespace strata::api {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

constexpr char kJson[] = "application/json";

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string RandomId(const std::string& prefix) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return absl::StrFormat("%s%016x%08x", prefix, rng(), static_cast<uint32_t>(rng()));
}

int64_t NowSeconds() { return absl::ToUnixSeconds(absl::Now()); }

// One API call's generation: several prompts, n samples each, aggregated into one JSON
// response or one SSE stream. Scheduler updates arrive on the scheduler thread.
class GenerationJob : public std::enable_shared_from_this<GenerationJob> {
 public:
  enum class Kind { kCompletion, kChat };

  struct Choice {
    std::string text;
    std::vector<int32_t> tokens;
    json logprobs_tokens = json::array();  // completions shape, parallel arrays
    json logprobs_values = json::array();
    json logprobs_top = json::array();
    json logprobs_offsets = json::array();
    json chat_logprobs = json::array();  // chat shape
    std::string finish_reason;
    json stop_reason = nullptr;
    bool sent_role = false;
    // Tool calls, parsed as the text streams (parse_tools).
    std::shared_ptr<ToolCallStream> tool_stream;
    int tool_calls_sent = 0;
  };

  Kind kind;
  std::string id, model;
  int64_t created = 0;
  bool stream = false, include_usage = false, echo = false, logprobs = false;
  bool token_ids_as_strings = false;
  bool parse_tools = false;
  ToolCallFormat tool_format = ToolCallFormat::kHermes;
  int n = 1;
  std::vector<std::string> echo_texts;  // per prompt
  std::vector<Choice> choices;
  std::vector<uint64_t> request_ids;
  int pending = 0;
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  std::shared_ptr<http::Responder> responder;
  const Tokenizer* tokenizer = nullptr;
  Scheduler* scheduler = nullptr;
  std::function<void(int)> on_done;  // HTTP status, for metrics
  std::mutex mu;
  bool failed = false;

  std::string TokenText(int32_t token) const {
    if (token_ids_as_strings || tokenizer == nullptr) return absl::StrCat("token_id:", token);
    return tokenizer->TokenText(token);
  }

  json ChatTokenLogprob(int32_t token, float lp) const {
    const std::string t = TokenText(token);
    json bytes = json::array();
    for (unsigned char c : t) bytes.push_back(c);
    return {{"token", t}, {"logprob", lp}, {"bytes", bytes}};
  }

  json Usage() const {
    return {{"prompt_tokens", prompt_tokens},
            {"completion_tokens", completion_tokens},
            {"total_tokens", prompt_tokens + completion_tokens},
            {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
  }

  // A call in the chat shape (with its index, for stream deltas).
  static json ToolCallJson(const ToolCall& call, int index) {
    return {{"index", index},
            {"id", RandomId("call_")},
            {"type", "function"},
            {"function", {{"name", call.name}, {"arguments", call.arguments}}}};
  }

  json ChunkHeader() const {
    return {{"id", id},
            {"object", kind == Kind::kChat ? "chat.completion.chunk" : "text_completion"},
            {"created", created},
            {"model", model}};
  }

  void WriteEvent(const json& j) { responder->Write("data: " + Dump(j) + "\n\n"); }

  // Applies one scheduler update for prompt `p`. Called under `mu`.
  void Apply(size_t p, const RequestUpdate& u, json* stream_choices) {
    for (const SequenceUpdate& s : u.sequences) {
      const size_t index = p * n + s.index;
      Choice& c = choices[index];
      json chunk_logprobs = nullptr;
      if (logprobs && !s.logprobs.empty()) {
        json tokens = json::array(), values = json::array(), tops = json::array(),
             offsets = json::array();
        json chat_content = json::array();
        size_t offset = c.text.size();
        for (const TokenLogprob& lp : s.logprobs) {
          const std::string text = TokenText(lp.token);
          if (kind == Kind::kCompletion) {
            json top = json::object();
            for (const auto& [t, v] : lp.top) top[TokenText(t)] = v;
            tokens.push_back(text);
            values.push_back(lp.logprob);
            tops.push_back(top);
            offsets.push_back(offset);
            offset += text.size();
          } else {
            json entry = ChatTokenLogprob(lp.token, lp.logprob);
            json top = json::array();
            for (const auto& [t, v] : lp.top) top.push_back(ChatTokenLogprob(t, v));
            entry["top_logprobs"] = top;
            chat_content.push_back(entry);
          }
        }
        if (kind == Kind::kCompletion) {
          for (auto& x : tokens) c.logprobs_tokens.push_back(x);
          for (auto& x : values) c.logprobs_values.push_back(x);
          for (auto& x : tops) c.logprobs_top.push_back(x);
          for (auto& x : offsets) c.logprobs_offsets.push_back(x);
          chunk_logprobs = {{"tokens", tokens},
                            {"token_logprobs", values},
                            {"top_logprobs", tops},
                            {"text_offset", offsets}};
        } else {
          for (auto& x : chat_content) c.chat_logprobs.push_back(x);
          chunk_logprobs = {{"content", chat_content}};
        }
      }
      c.text += s.text;
      c.tokens.insert(c.tokens.end(), s.tokens.begin(), s.tokens.end());
      completion_tokens += static_cast<int64_t>(s.tokens.size());
      if (s.finish != FinishReason::kNone) {
        c.finish_reason = FinishReasonName(s.finish);
        if (!s.stop_reason.empty()) {
          // A stop string is reported as a string, a stop token as its id (EOS as null).
          const bool numeric = s.stop_reason.size() < 10 &&
                               std::all_of(s.stop_reason.begin(), s.stop_reason.end(), ::isdigit);
          c.stop_reason = numeric && !stop_strings_contains(s.stop_reason)
                              ? json(std::stoll(s.stop_reason))
                              : json(s.stop_reason);
        }
      }
      if (!stream) continue;
      json choice = {
          {"index", index},
          {"logprobs", chunk_logprobs},
          {"finish_reason", c.finish_reason.empty() ? json(nullptr) : json(c.finish_reason)}};
      if (kind == Kind::kCompletion) {
        choice["text"] = s.text;
        if (!c.finish_reason.empty()) choice["stop_reason"] = c.stop_reason;
      } else {
        std::string content = s.text;
        json calls = json::array();
        if (parse_tools) {
          std::vector<ToolCallDelta> found;
          content = c.tool_stream->Push(s.text, &found);
          if (!c.finish_reason.empty()) content += c.tool_stream->Finish(&found);
          for (const ToolCallDelta& d : found) {
            if (!d.name.empty()) {
              calls.push_back(ToolCallJson({d.name, d.arguments}, d.index));
            } else {
              calls.push_back({{"index", d.index}, {"function", {{"arguments", d.arguments}}}});
            }
            c.tool_calls_sent = std::max(c.tool_calls_sent, d.index + 1);
          }
          if (c.finish_reason == "stop" && c.tool_calls_sent > 0) {
            c.finish_reason = "tool_calls";
            choice["finish_reason"] = c.finish_reason;
          }
        }
        json delta = json::object();
        if (!content.empty() || (calls.empty() && c.finish_reason.empty()))
          delta["content"] = content;
        if (!calls.empty()) delta["tool_calls"] = calls;
        choice["delta"] = delta;
      }
      if (s.text.empty() && s.tokens.empty() && c.finish_reason.empty()) continue;
      stream_choices->push_back(choice);
    }
  }

  std::vector<std::string> stop_strings;
  bool stop_strings_contains(const std::string& s) const {
    return std::find(stop_strings.begin(), stop_strings.end(), s) != stop_strings.end();
  }

  void OnUpdate(size_t p, const RequestUpdate& u) {
    std::lock_guard<std::mutex> lock(mu);
    if (failed) return;
    if (!u.error.ok() && u.finished) {
      // The request failed (or was cancelled): the whole call fails.
      failed = true;
      for (size_t i = 0; i < request_ids.size(); ++i) {
        if (i != p) scheduler->Cancel(request_ids[i]);
      }
      if (u.error.code() == absl::StatusCode::kCancelled) {
        if (on_done) on_done(499);
        return;  // the client went away; nobody to tell
      }
      const ApiError error = FromStatus(u.error);
      if (stream) {
        WriteEvent(json::parse(error.ToJson()));
        responder->Write("data: [DONE]\n\n");
        responder->End();
      } else {
        responder->Send(error.status, kJson, error.ToJson());
      }
      if (on_done) on_done(error.status);
      return;
    }
    json stream_choices = json::array();
    Apply(p, u, &stream_choices);
    if (u.finished) {
      prompt_tokens += u.prompt_tokens;
      cached_tokens += u.cached_prompt_tokens;
      --pending;
    }
    if (stream && !stream_choices.empty()) {
      json chunk = ChunkHeader();
      chunk["choices"] = stream_choices;
      WriteEvent(chunk);
    }
    if (pending > 0) return;
    if (stream) {
      if (include_usage) {
        json chunk = ChunkHeader();
        chunk["choices"] = json::array();
        chunk["usage"] = Usage();
        WriteEvent(chunk);
      }
      responder->Write("data: [DONE]\n\n");
      responder->End();
    } else {
      responder->Send(200, kJson, Dump(FinalResponse()));
    }
    if (on_done) on_done(200);
  }

  json FinalResponse() const {
    json out = {{"id", id},
                {"object", kind == Kind::kChat ? "chat.completion" : "text_completion"},
                {"created", created},
                {"model", model}};
    json list = json::array();
    for (size_t i = 0; i < choices.size(); ++i) {
      const Choice& c = choices[i];
      json choice = {
          {"index", i},
          {"finish_reason", c.finish_reason.empty() ? json(nullptr) : json(c.finish_reason)}};
      if (kind == Kind::kCompletion) {
        choice["text"] = (echo ? echo_texts[i / n] : "") + c.text;
        choice["logprobs"] = logprobs ? json({{"tokens", c.logprobs_tokens},
                                              {"token_logprobs", c.logprobs_values},
                                              {"top_logprobs", c.logprobs_top},
                                              {"text_offset", c.logprobs_offsets}})
                                      : json(nullptr);
        choice["stop_reason"] = c.stop_reason;
      } else {
        choice["message"] = {{"role", "assistant"}, {"content", c.text}};
        if (parse_tools) {
          const ParsedOutput parsed = ParseToolCalls(tool_format, c.text);
          if (!parsed.calls.empty()) {
            json calls = json::array();
            for (size_t k = 0; k < parsed.calls.size(); ++k) {
              json call = ToolCallJson(parsed.calls[k], static_cast<int>(k));
              call.erase("index");
              calls.push_back(call);
            }
            choice["message"]["content"] =
                parsed.content.empty() ? json(nullptr) : json(parsed.content);
            choice["message"]["tool_calls"] = calls;
            if (c.finish_reason == "stop") choice["finish_reason"] = "tool_calls";
          }
        }
        choice["logprobs"] = logprobs ? json({{"content", c.chat_logprobs}}) : json(nullptr);
        choice["stop_reason"] = c.stop_reason;
      }
      list.push_back(choice);
    }
    out["choices"] = list;
    out["usage"] = Usage();
    return out;
  }
};

}  // namespace

OpenAiApi::OpenAiApi(Scheduler* scheduler, const Tokenizer* tokenizer,
                     const ChatTemplate* chat_template, ApiOptions options,
                     std::function<bool()> healthy)
    : scheduler_(scheduler),
      tokenizer_(tokenizer),
      chat_template_(chat_template),
      options_(std::move(options)),
      healthy_(std::move(healthy)),
      created_(NowSeconds()) {
  if (!options_.tool_call_parser.empty()) {
    if (!ParseToolCallFormat(options_.tool_call_parser, &tool_format_)) {
      LOG(WARNING) << "unknown tool call parser '" << options_.tool_call_parser
                   << "' (hermes, llama3 or mistral); using hermes";
    }
  } else if (chat_template_ != nullptr) {
    tool_format_ = ToolCallFormatOfTemplate(chat_template_->source());
  }
}

void OpenAiApi::SendJson(const std::shared_ptr<http::Responder>& responder, int status,
                         const std::string& body) {
  responder->Send(status, kJson, body);
}

void OpenAiApi::SendError(const std::shared_ptr<http::Responder>& responder,
                          const ApiError& error) {
  responder->Send(error.status, kJson, error.ToJson());
}

void OpenAiApi::Handle(const http::Request& request, std::shared_ptr<http::Responder> responder) {
  const Stopwatch watch;
  const std::string& path = request.path;
  auto finish = [this, path, watch](int status) {
    if (observer_) observer_(path, status, watch.ElapsedSeconds());
  };
  auto reply = [&](int status, const std::string& body, const char* type = kJson) {
    responder->Send(status, type, body);
    finish(status);
  };
  auto error = [&](const ApiError& e) { reply(e.status, e.ToJson()); };

  if (path == "/health") {
    if (healthy_()) return reply(200, R"({"status":"ok"})");
    const std::string missing = missing_ ? missing_() : "a compute node and a KV pool";
    return reply(503,
                 Dump(json({{"status", "unavailable"}, {"message", "waiting for " + missing}})));
  }
  if (path == "/ready") {
    if (healthy_() && !draining_) return reply(200, R"({"ready":true})");
    return reply(503, draining_ ? R"({"ready":false,"reason":"draining"})"
                                : R"({"ready":false,"reason":"starting"})");
  }
  if (path == "/metrics") {
    if (!metrics_) return error(NotFound("metrics are not enabled"));
    return reply(200, metrics_(), "text/plain; version=0.0.4; charset=utf-8");
  }
  const bool is_v1 = path.rfind("/v1/", 0) == 0;
  if (is_v1 && !options_.api_key.empty() &&
      request.Header("authorization") != "Bearer " + options_.api_key) {
    return error(Unauthorized("missing or wrong API key (expected 'Authorization: Bearer <key>')"));
  }
  struct Route {
    const char* path;
    const char* method;
  };
  static const Route kRoutes[] = {{"/v1/models", "GET"},
                                  {"/v1/completions", "POST"},
                                  {"/v1/chat/completions", "POST"},
                                  {"/tokenize", "POST"},
                                  {"/detokenize", "POST"}};
  // GET /v1/models/{id}: one model (what client.models.retrieve calls).
  if (path.rfind("/v1/models/", 0) == 0 && request.method == "GET") {
    const std::string id = path.substr(std::strlen("/v1/models/"));
    if (id != options_.served_model_name) {
      return error(UnknownModel(id));
    }
    return reply(200, Dump(ModelJson()));
  }
  for (const Route& r : kRoutes) {
    if (path != r.path) continue;
    if (request.method != r.method) {
      return error({405, "invalid_request_error",
                    absl::StrCat(request.method, " is not allowed on ", path), ""});
    }
    if (path == "/v1/models") {
      Models(responder);
      return finish(200);
    }
    if ((path == "/v1/completions" || path == "/v1/chat/completions") && draining_) {
      return error(Overloaded("the server is draining and accepts no new requests"));
    }
    if ((path == "/v1/completions" || path == "/v1/chat/completions") && !healthy_()) {
      return error(Overloaded(
          "no compute node or KV pool is available right now (starting, or a node is down); "
          "retry later"));
    }
    // These parse a body: JSON, validation, chat template, tokenizer, in time that grows
    // with its size. That runs on a worker thread, so that the event loop goes on serving
    // other connections (/health among them) meanwhile.
    void (OpenAiApi::*route)(const http::Request&, std::shared_ptr<http::Responder>) =
        path == "/v1/completions"        ? &OpenAiApi::Completions
        : path == "/v1/chat/completions" ? &OpenAiApi::ChatCompletions
        : path == "/tokenize"            ? &OpenAiApi::Tokenize
                                         : &OpenAiApi::Detokenize;
    responder->Offload([this, route, request, responder] { (this->*route)(request, responder); });
    return;
  }
  error(NotFound(absl::StrCat("no route ", request.method, " ", path)));
}

nlohmann::json OpenAiApi::ModelJson() const {
  return {{"id", options_.served_model_name},
          {"object", "model"},
          {"created", created_},
          {"owned_by", "strata"},
          {"root", options_.served_model_name},
          {"max_model_len", options_.limits.max_model_len}};
}

void OpenAiApi::Models(std::shared_ptr<http::Responder> responder) {
  SendJson(responder, 200, Dump(json({{"object", "list"}, {"data", json::array({ModelJson()})}})));
}

namespace {

// Checks the body's "model": absent or null means the served model; anything else must be
// its name.
std::optional<ApiError> CheckBodyModel(const ojson& body, const std::string& served) {
  auto it = body.find("model");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) return BadRequest("'model' must be a string", "model");
  return CheckModel(it->get<std::string>(), served);
}

std::variant<std::vector<int32_t>, ApiError> TokenList(const ojson& j, int32_t vocab,
                                                       const std::string& param) {
  std::vector<int32_t> out;
  for (const ojson& t : j) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab) {
      return BadRequest(absl::StrCat("'", param, "' holds an invalid token id: ", t.dump()), param);
    }
    out.push_back(t.get<int32_t>());
  }
  return out;
}

}  // namespace

void OpenAiApi::Completions(const http::Request& request,
                            std::shared_ptr<http::Responder> responder) {
  const Stopwatch watch;
  auto finish = [this, watch](int status) {
    if (observer_) observer_("/v1/completions", status, watch.ElapsedSeconds());
  };
  auto fail = [&](const ApiError& e) {
    SendError(responder, e);
    finish(e.status);
  };
  auto body_or = ParseJsonBody(request.body);
  if (auto* e = std::get_if<ApiError>(&body_or)) return fail(*e);
  const ojson& body = std::get<ojson>(body_or);
  if (auto e = CheckBodyModel(body, options_.served_model_name)) return fail(*e);
  auto params_or = ParseParams(body, Endpoint::kCompletions, options_.limits);
  if (auto* e = std::get_if<ApiError>(&params_or)) return fail(*e);
  ParsedParams params = std::get<ParsedParams>(std::move(params_or));
  if (params.echo && params.logprobs) {
    return fail(BadRequest("'echo' together with 'logprobs' is not supported (no prompt logprobs)",
                           "echo"));
  }

  // prompt: a string, a list of strings, a list of token ids, or a list of such lists.
  if (!body.contains("prompt")) return fail(BadRequest("'prompt' is required", "prompt"));
  const ojson& prompt = body["prompt"];
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> prompt_texts;
  const int32_t vocab = options_.limits.vocab_size;
  auto add_text = [&](const std::string& text) -> std::optional<ApiError> {
    if (tokenizer_ == nullptr)
      return BadRequest("this model has no tokenizer: send token ids", "prompt");
    prompts.push_back(tokenizer_->Encode(text, /*add_special_tokens=*/true));
    prompt_texts.push_back(text);
    return std::nullopt;
  };
  auto add_ids = [&](const ojson& ids) -> std::optional<ApiError> {
    auto tokens = TokenList(ids, vocab, "prompt");
    if (auto* e = std::get_if<ApiError>(&tokens)) return *e;
    prompts.push_back(std::get<std::vector<int32_t>>(tokens));
    prompt_texts.push_back(tokenizer_ ? tokenizer_->Decode(prompts.back(), false) : "");
    return std::nullopt;
  };
  if (prompt.is_string()) {
    if (auto e = add_text(prompt.get<std::string>())) return fail(*e);
  } else if (prompt.is_array() && !prompt.empty() && prompt[0].is_number_integer()) {
    if (auto e = add_ids(prompt)) return fail(*e);
  } else if (prompt.is_array() && !prompt.empty()) {
    for (const ojson& p : prompt) {
      std::optional<ApiError> e;
      if (p.is_string()) {
        e = add_text(p.get<std::string>());
      } else if (p.is_array() && !p.empty()) {
        e = add_ids(p);
      } else {
        e = BadRequest("'prompt' list items must be strings or non-empty token-id lists", "prompt");
      }
      if (e) return fail(*e);
    }
  } else {
    return fail(
        BadRequest("'prompt' must be a string, a list of strings, a list of token ids, or a list "
                   "of token-id lists",
                   "prompt"));
  }
  if (prompts.size() > 64) return fail(BadRequest("at most 64 prompts per request", "prompt"));

  auto job = std::make_shared<GenerationJob>();
  job->kind = GenerationJob::Kind::kCompletion;
  job->id = RandomId("cmpl-");
  job->model = options_.served_model_name;
  job->created = NowSeconds();
  job->stream = params.stream;
  job->include_usage = params.include_usage;
  job->echo = params.echo;
  job->logprobs = params.logprobs;
  job->token_ids_as_strings = params.return_tokens_as_token_ids;
  job->n = params.request.n;
  job->echo_texts = prompt_texts;
  job->stop_strings = params.request.stop;
  job->choices.resize(prompts.size() * params.request.n);
  job->pending = static_cast<int>(prompts.size());
  job->responder = responder;
  job->tokenizer = tokenizer_;
  job->scheduler = scheduler_;
  job->on_done = finish;

  std::vector<GenerateRequest> requests;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateRequest r = params.request;
    r.external_id = prompts.size() > 1 ? absl::StrCat(job->id, "-", i) : job->id;
    r.prompt_tokens = prompts[i];
    r.max_tokens = params.max_tokens.value_or(options_.default_completion_max_tokens);
    requests.push_back(std::move(r));
  }
  // Headers go out before the first token, so that the client sees the stream open.
  std::lock_guard<std::mutex> lock(job->mu);
  for (size_t i = 0; i < requests.size(); ++i) {
    auto id = scheduler_->Submit(std::move(requests[i]),
                                 [job, i](const RequestUpdate& u) { job->OnUpdate(i, u); });
    if (!id.ok()) {
      for (uint64_t submitted : job->request_ids) scheduler_->Cancel(submitted);
      job->failed = true;
      return fail(FromStatus(id.status()));
    }
    job->request_ids.push_back(*id);
  }
  if (job->stream) {
    responder->StartStream(200, "text/event-stream", {{"Cache-Control", "no-cache"}});
    if (job->echo) {
      json chunk = job->ChunkHeader();
      json choices = json::array();
      for (size_t i = 0; i < job->choices.size(); ++i) {
        choices.push_back({{"index", i},
                           {"text", prompt_texts[i / job->n]},
                           {"logprobs", nullptr},
                           {"finish_reason", nullptr}});
      }
      chunk["choices"] = choices;
      job->WriteEvent(chunk);
    }
    active_streams_.fetch_add(1);
  }
  std::weak_ptr<GenerationJob> weak = job;
  responder->OnClose([this, weak] {
    auto j = weak.lock();
    if (!j) return;
    if (j->stream) active_streams_.fetch_sub(1);
    for (uint64_t id : j->request_ids) scheduler_->Cancel(id);
  });
  if (job->stream) {
    auto original = job->on_done;
    job->on_done = [this, original](int status) {
      active_streams_.fetch_sub(1);
      original(status);
    };
  }
}

void OpenAiApi::ChatCompletions(const http::Request& request,
                                std::shared_ptr<http::Responder> responder) {
  const Stopwatch watch;
  auto finish = [this, watch](int status) {
    if (observer_) observer_("/v1/chat/completions", status, watch.ElapsedSeconds());
  };
  auto fail = [&](const ApiError& e) {
    SendError(responder, e);
    finish(e.status);
  };
  if (chat_template_ == nullptr || tokenizer_ == nullptr) {
    return fail(BadRequest("this model has no tokenizer, so chat is unavailable"));
  }
  auto body_or = ParseJsonBody(request.body);
  if (auto* e = std::get_if<ApiError>(&body_or)) return fail(*e);
  const ojson& body = std::get<ojson>(body_or);
  if (auto e = CheckBodyModel(body, options_.served_model_name)) return fail(*e);
  auto params_or = ParseParams(body, Endpoint::kChat, options_.limits);
  if (auto* e = std::get_if<ApiError>(&params_or)) return fail(*e);
  ParsedParams params = std::get<ParsedParams>(std::move(params_or));
  if (!body.contains("messages")) return fail(BadRequest("'messages' is required", "messages"));
  // Tools: rendered into the template unless tool_choice is "none"; "auto" parses the
  // calls the model writes; "required" and a named function make a call certain with a
  // grammar.
  ojson tools = body.contains("tools") && !body["tools"].is_null() ? body["tools"] : ojson();
  if (!tools.is_null()) {
    if (auto s = CheckTools(tools); !s.ok())
      return fail(BadRequest(std::string(s.message()), "tools"));
    if (tools.empty()) tools = ojson();
  }
  std::string tool_choice = tools.is_null() ? "none" : "auto";
  std::optional<std::string> forced;
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
    const ojson& tc = body["tool_choice"];
    if (tc.is_string()) {
      tool_choice = tc.get<std::string>();
      if (tool_choice != "none" && tool_choice != "auto" && tool_choice != "required") {
        return fail(
            BadRequest("'tool_choice' must be none, auto, required or a function", "tool_choice"));
      }
    } else if (tc.is_object() && tc.value("type", "") == "function" && tc.contains("function") &&
               tc["function"].is_object() && tc["function"].contains("name") &&
               tc["function"]["name"].is_string()) {
      tool_choice = "function";
      forced = tc["function"]["name"].get<std::string>();
    } else {
      return fail(
          BadRequest("'tool_choice' must be none, auto, required or "
                     "{\"type\": \"function\", \"function\": {\"name\": ...}}",
                     "tool_choice"));
    }
    if (tool_choice != "none" && tools.is_null()) {
      return fail(BadRequest("'tool_choice' needs 'tools'", "tool_choice"));
    }
  }
  bool parallel = true;
  if (body.contains("parallel_tool_calls") && !body["parallel_tool_calls"].is_null()) {
    if (!body["parallel_tool_calls"].is_boolean()) {
      return fail(BadRequest("'parallel_tool_calls' must be a boolean", "parallel_tool_calls"));
    }
    parallel = body["parallel_tool_calls"].get<bool>();
  }
  if (tool_choice == "required" || forced) {
    if (!params.request.grammar.empty()) {
      return fail(
          BadRequest("a required tool call and structured output do not combine", "tool_choice"));
    }
    auto gbnf = ToolCallGrammar(tool_format_, tools, forced, parallel);
    if (gbnf.ok()) {
      if (auto g = grammar::Grammar::Parse(*gbnf); !g.ok()) gbnf = g.status();
    }
    if (!gbnf.ok()) return fail(BadRequest(std::string(gbnf.status().message()), "tools"));
    params.request.grammar = *gbnf;
  }
  if (tool_choice == "none") tools = ojson();
  const bool add_generation_prompt = body.value("add_generation_prompt", true);
  const ojson extra =
      body.contains("chat_template_kwargs") && body["chat_template_kwargs"].is_object()
          ? body["chat_template_kwargs"]
          : ojson::object();
  auto rendered = chat_template_->Render(body["messages"], add_generation_prompt, tools, extra);
  if (!rendered.ok()) return fail(BadRequest(std::string(rendered.status().message()), "messages"));
  // Templates write their own BOS, so no special tokens are added (as vLLM).
  std::vector<int32_t> prompt = tokenizer_->Encode(*rendered, /*add_special_tokens=*/false);

  auto job = std::make_shared<GenerationJob>();
  job->kind = GenerationJob::Kind::kChat;
  job->id = RandomId("chatcmpl-");
  job->model = options_.served_model_name;
  job->created = NowSeconds();
  job->stream = params.stream;
  job->include_usage = params.include_usage;
  job->logprobs = params.logprobs;
  job->token_ids_as_strings = params.return_tokens_as_token_ids;
  job->n = params.request.n;
  job->stop_strings = params.request.stop;
  job->choices.resize(params.request.n);
  job->parse_tools = !tools.is_null();
  job->tool_format = tool_format_;
  if (job->parse_tools) {
    for (auto& c : job->choices) c.tool_stream = std::make_shared<ToolCallStream>(tool_format_);
    // Mistral marks its calls with a special token, which must stay in the text.
    if (tool_format_ == ToolCallFormat::kMistral) params.request.skip_special_tokens = false;
  }
  job->pending = 1;
  job->responder = responder;
  job->tokenizer = tokenizer_;
  job->scheduler = scheduler_;
  job->on_done = finish;

  GenerateRequest r = params.request;
  r.external_id = job->id;
  r.max_tokens = params.max_tokens.value_or(DefaultChatMaxTokens(options_.limits, prompt.size()));
  r.prompt_tokens = std::move(prompt);

  std::lock_guard<std::mutex> lock(job->mu);
  auto id =
      scheduler_->Submit(std::move(r), [job](const RequestUpdate& u) { job->OnUpdate(0, u); });
  if (!id.ok()) {
    job->failed = true;
    return fail(FromStatus(id.status()));
  }
  job->request_ids.push_back(*id);
  if (job->stream) {
    responder->StartStream(200, "text/event-stream", {{"Cache-Control", "no-cache"}});
    // The first chunk of every choice carries the role.
    json chunk = job->ChunkHeader();
    json choices = json::array();
    for (int i = 0; i < job->n; ++i) {
      choices.push_back({{"index", i},
                         {"delta", {{"role", "assistant"}, {"content", ""}}},
                         {"logprobs", nullptr},
                         {"finish_reason", nullptr}});
      job->choices[i].sent_role = true;
    }
    chunk["choices"] = choices;
    job->WriteEvent(chunk);
    active_streams_.fetch_add(1);
    auto original = job->on_done;
    job->on_done = [this, original](int status) {
      active_streams_.fetch_sub(1);
      original(status);
    };
  }
  std::weak_ptr<GenerationJob> weak = job;
  responder->OnClose([this, weak] {
    auto j = weak.lock();
    if (!j) return;
    for (uint64_t id : j->request_ids) scheduler_->Cancel(id);
  });
}

void OpenAiApi::Tokenize(const http::Request& request, std::shared_ptr<http::Responder> responder) {
  auto fail = [&](const ApiError& e) { SendError(responder, e); };
  if (tokenizer_ == nullptr) return fail(BadRequest("this model has no tokenizer"));
  auto body_or = ParseJsonBody(request.body);
  if (auto* e = std::get_if<ApiError>(&body_or)) return fail(*e);
  const ojson& body = std::get<ojson>(body_or);
  std::vector<int32_t> tokens;
  if (body.contains("messages")) {
    if (chat_template_ == nullptr) return fail(BadRequest("this model has no chat template"));
    auto rendered =
        chat_template_->Render(body["messages"], body.value("add_generation_prompt", true),
                               body.contains("tools") ? body["tools"] : ojson(),
                               body.value("chat_template_kwargs", ojson::object()));
    if (!rendered.ok())
      return fail(BadRequest(std::string(rendered.status().message()), "messages"));
    tokens = tokenizer_->Encode(*rendered, body.value("add_special_tokens", false));
  } else if (body.contains("prompt") && body["prompt"].is_string()) {
    const ojson& add =
        body.contains("add_special_tokens") ? body["add_special_tokens"] : ojson(true);
    if (!add.is_boolean())
      return fail(BadRequest("'add_special_tokens' must be a boolean", "add_special_tokens"));
    tokens = tokenizer_->Encode(body["prompt"].get<std::string>(), add.get<bool>());
  } else {
    return fail(BadRequest("'prompt' (a string) or 'messages' is required", "prompt"));
  }
  json out = {{"count", tokens.size()},
              {"max_model_len", options_.limits.max_model_len},
              {"tokens", tokens}};
  if (body.value("return_token_strs", false)) {
    json strs = json::array();
    for (int32_t t : tokens) strs.push_back(tokenizer_->IdToToken(t));
    out["token_strs"] = strs;
  }
  SendJson(responder, 200, Dump(out));
  if (observer_) observer_("/tokenize", 200, 0.0);
}

void OpenAiApi::Detokenize(const http::Request& request,
                           std::shared_ptr<http::Responder> responder) {
  auto fail = [&](const ApiError& e) { SendError(responder, e); };
  if (tokenizer_ == nullptr) return fail(BadRequest("this model has no tokenizer"));
  auto body_or = ParseJsonBody(request.body);
  if (auto* e = std::get_if<ApiError>(&body_or)) return fail(*e);
  const ojson& body = std::get<ojson>(body_or);
  if (!body.contains("tokens") || !body["tokens"].is_array()) {
    return fail(BadRequest("'tokens' (a list of token ids) is required", "tokens"));
  }
  auto tokens = TokenList(body["tokens"], options_.limits.vocab_size, "tokens");
  if (auto* e = std::get_if<ApiError>(&tokens)) return fail(*e);
  const std::string text = tokenizer_->Decode(std::get<std::vector<int32_t>>(tokens),
                                              /*skip_special_tokens=*/false, /*clean_up=*/true);
  SendJson(responder, 200, Dump(json({{"prompt", text}})));
  if (observer_) observer_("/detokenize", 200, 0.0);
}

}  // namespace strata::api
