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
#include "server/api/generation_job.h"
#include "server/api/json_body.h"
#include "server/api/tool_calls.h"

namespace strata::api {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;
using generation::Dump;
using generation::GenerationJob;
using generation::kJson;
using generation::NowSeconds;
using generation::RandomId;

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
  // The stream stops counting in on_done, which runs once whatever ends it (a client that
  // went away included: its requests are cancelled here and end with 499).
  responder->OnClose([this, weak] {
    auto j = weak.lock();
    if (!j) return;
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
