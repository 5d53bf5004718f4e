// One API call's generation in the OpenAI shapes (server/api/openai_api.cc): the scheduler
// updates of its prompts and samples gathered into one JSON response or one SSE stream,
// with logprobs, stop reasons and tool calls. Internal to the HTTP API.
#ifndef STRATA_SERVER_API_GENERATION_JOB_H_
#define STRATA_SERVER_API_GENERATION_JOB_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "server/api/api_error.h"
#include "server/api/tool_calls.h"
#include "server/http/http_server.h"
#include "server/request.h"
#include "server/scheduler.h"

namespace strata::api::generation {

using json = nlohmann::json;

inline constexpr char kJson[] = "application/json";

inline std::string Dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

inline std::string RandomId(const std::string& prefix) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return absl::StrFormat("%s%016x%08x", prefix, rng(), static_cast<uint32_t>(rng()));
}

inline int64_t NowSeconds() { return absl::ToUnixSeconds(absl::Now()); }

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

}  // namespace strata::api::generation

#endif  // STRATA_SERVER_API_GENERATION_JOB_H_
