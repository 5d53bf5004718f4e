// strata's OpenAI-compatible HTTP API (plus vLLM's /tokenize, /detokenize and extras).
//
// Routes: GET /health, GET /ready, GET /v1/models, GET /v1/models/{id}, POST /v1/completions,
// POST /v1/chat/completions, POST /tokenize, POST /detokenize, GET /metrics.
// Requests are validated here (JSON, types, ranges, the model name, the API key) and
// submitted to the Scheduler; its updates become one JSON response or a stream of
// Server-Sent Events ending with "data: [DONE]". A client that disconnects has its
// requests cancelled, which frees their KV.
//
// Thread-safety: Handle runs on an HTTP event-loop thread and answers the cheap routes
// there; the routes that parse a body run on the HTTP server's worker threads
// (Responder::Offload). Scheduler updates arrive on the scheduler thread; per-request
// state is locked.
#ifndef STRATA_SERVER_API_OPENAI_API_H_
#define STRATA_SERVER_API_OPENAI_API_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "common/tokenizer/tokenizer.h"
#include "server/api/api_error.h"
#include "server/api/params.h"
#include "server/api/tool_calls.h"
#include "server/chat/chat_template.h"
#include "server/http/http_server.h"
#include "server/scheduler.h"

namespace strata::api {

struct ApiOptions {
  std::string served_model_name = "strata";
  std::string model_path;
  std::string api_key;  // empty: no authentication
  ApiLimits limits;
  int default_completion_max_tokens = 16;  // OpenAI's default for /v1/completions
  // How the model writes tool calls (tool_calls.h): hermes, llama3 or mistral; empty: from
  // the chat template.
  std::string tool_call_parser;
};

// Called when a request finishes: route, HTTP status, seconds.
using RequestObserver = std::function<void(const std::string& route, int status, double seconds)>;

class OpenAiApi {
 public:
  // `tokenizer` and `chat_template` may be null (no text prompts / no chat).
  OpenAiApi(Scheduler* scheduler, const Tokenizer* tokenizer, const ChatTemplate* chat_template,
            ApiOptions options, std::function<bool()> healthy);

  void Handle(const http::Request& request, std::shared_ptr<http::Responder> responder);

  // While draining, /ready answers 503 and new generation requests are refused.
  void SetDraining(bool draining) { draining_ = draining; }
  void SetMetricsText(std::function<std::string()> metrics) { metrics_ = std::move(metrics); }
  // What /health's 503 says is missing (e.g. "compute nodes (0 of 1 ready)").
  void SetHealthDetail(std::function<std::string()> missing) { missing_ = std::move(missing); }
  void SetRequestObserver(RequestObserver observer) { observer_ = std::move(observer); }
  int64_t active_streams() const { return active_streams_.load(); }

 private:
  void Completions(const http::Request& request, std::shared_ptr<http::Responder> responder);
  void ChatCompletions(const http::Request& request, std::shared_ptr<http::Responder> responder);
  void Tokenize(const http::Request& request, std::shared_ptr<http::Responder> responder);
  void Detokenize(const http::Request& request, std::shared_ptr<http::Responder> responder);
  void Models(std::shared_ptr<http::Responder> responder);
  nlohmann::json ModelJson() const;
  void SendError(const std::shared_ptr<http::Responder>& responder, const ApiError& error);
  void SendJson(const std::shared_ptr<http::Responder>& responder, int status,
                const std::string& body);

  Scheduler* scheduler_;
  const Tokenizer* tokenizer_;
  const ChatTemplate* chat_template_;
  ToolCallFormat tool_format_ = ToolCallFormat::kHermes;
  ApiOptions options_;
  std::function<bool()> healthy_;
  std::function<std::string()> missing_;
  std::function<std::string()> metrics_;
  RequestObserver observer_;
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> active_streams_{0};
  int64_t created_ = 0;
};

}  // namespace strata::api

#endif  // STRATA_SERVER_API_OPENAI_API_H_
