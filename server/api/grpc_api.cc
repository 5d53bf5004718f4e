#include "server/api/grpc_api.h"

#include <deque>
#include <mutex>
#include <optional>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/logging.h"
#include "server/api/params.h"

namespace strata::api {
namespace {

using ojson = nlohmann::ordered_json;

std::string CallId() {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return absl::StrFormat("gen-%016x%08x", rng(), static_cast<uint32_t>(rng()));
}

// The typed request from the proto's sampling parameters; ValidateParams then decides as
// for the HTTP API. The gRPC API is completions-shaped: logprobs is a count.
RequestParams ParamsFromProto(const v1::SamplingParams& p) {
  RequestParams r;
#define STRATA_COPY(field) \
  if (p.has_##field()) r.field = p.field()
  STRATA_COPY(max_tokens);
  STRATA_COPY(temperature);
  STRATA_COPY(top_p);
  STRATA_COPY(top_k);
  STRATA_COPY(min_p);
  STRATA_COPY(seed);
  STRATA_COPY(n);
  STRATA_COPY(presence_penalty);
  STRATA_COPY(frequency_penalty);
  STRATA_COPY(repetition_penalty);
  STRATA_COPY(ignore_eos);
  STRATA_COPY(min_tokens);
  STRATA_COPY(priority);
  STRATA_COPY(include_stop_str_in_output);
  STRATA_COPY(skip_special_tokens);
#undef STRATA_COPY
  if (p.has_logprobs()) r.logprobs_count = p.logprobs();
  r.stop.assign(p.stop().begin(), p.stop().end());
  r.stop_token_ids.assign(p.stop_token_ids().begin(), p.stop_token_ids().end());
  for (const auto& [token, value] : p.logit_bias()) {
    r.logit_bias.emplace_back(std::to_string(token), value);
  }
  if (p.has_structured_output()) {
    const v1::StructuredOutput& so = p.structured_output();
    StructuredOutput out;
    out.param = "structured_output";
    switch (so.kind_case()) {
      case v1::StructuredOutput::kJsonObject:
        if (so.json_object()) r.structured = out;
        break;
      case v1::StructuredOutput::kJsonSchema:
        out.kind = StructuredOutput::Kind::kJsonSchema;
        out.text = so.json_schema();
        r.structured = out;
        break;
      case v1::StructuredOutput::kRegex:
        out.kind = StructuredOutput::Kind::kRegex;
        out.text = so.regex();
        r.structured = out;
        break;
      case v1::StructuredOutput::kChoice:
        out.kind = StructuredOutput::Kind::kChoice;
        out.choices.assign(so.choice().choices().begin(), so.choice().choices().end());
        r.structured = out;
        break;
      case v1::StructuredOutput::kGrammar:
        out.kind = StructuredOutput::Kind::kGrammar;
        out.text = so.grammar();
        r.structured = out;
        break;
      case v1::StructuredOutput::KIND_NOT_SET:
        break;
    }
  }
  return r;
}

grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* context, const grpc::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* context, const ApiError& error) {
  return Reply(context, ToGrpcStatus(error));
}

// One Generate call. Scheduler updates (scheduler thread) become queued messages; gRPC
// writes them one at a time (a write must finish before the next starts). The reactor
// deletes itself in OnDone; the scheduler's callback holds only the shared State.
class GenerateCall : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  struct State {
    std::mutex mu;
    GenerateCall* call = nullptr;  // null once the RPC is done
  };

  GenerateCall(Scheduler* scheduler, const Tokenizer* tokenizer, bool logprobs,
               std::shared_ptr<std::atomic<int64_t>> active_calls)
      : scheduler_(scheduler),
        tokenizer_(tokenizer),
        logprobs_(logprobs),
        active_calls_(std::move(active_calls)),
        state_(std::make_shared<State>()) {
    state_->call = this;
    active_calls_->fetch_add(1);
  }

  // Submits the request; on failure finishes the call with the error.
  void Start(GenerateRequest request) {
    std::shared_ptr<State> state = state_;
    std::lock_guard<std::mutex> lock(state->mu);
    id_ = CallId();
    request.external_id = id_;
    auto id = scheduler_->Submit(std::move(request), [state](const RequestUpdate& u) {
      std::lock_guard<std::mutex> lock(state->mu);
      if (state->call != nullptr) state->call->OnUpdateLocked(u);
    });
    if (!id.ok()) {
      FinishLocked(ToGrpcStatus(FromStatus(id.status())));
      return;
    }
    request_id_ = *id;
    submitted_ = true;
  }

  void FailNow(const ApiError& error) {
    std::lock_guard<std::mutex> lock(state_->mu);
    FinishLocked(ToGrpcStatus(error));
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(state_->mu);
    queue_.pop_front();
    writing_ = false;
    if (!ok) {
      // The stream broke (the client went away): stop generating.
      if (submitted_ && !request_done_) scheduler_->Cancel(request_id_);
      if (!final_) final_ = grpc::Status(grpc::StatusCode::CANCELLED, "the stream broke");
      queue_.clear();
    }
    PumpLocked();
  }

  void OnCancel() override {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (submitted_ && !request_done_) scheduler_->Cancel(request_id_);
    if (!final_) final_ = grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
    if (!writing_) queue_.clear();
    PumpLocked();
  }

  void OnDone() override {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->call = nullptr;
    }
    active_calls_->fetch_sub(1);
    delete this;
  }

 private:
  void OnUpdateLocked(const RequestUpdate& u) {
    if (final_) return;
    if (u.finished) request_done_ = true;
    if (!u.error.ok() && u.finished) {
      final_ = ToGrpcStatus(FromStatus(u.error));
      PumpLocked();
      return;
    }
    v1::GenerateResponse message;
    message.set_id(id_);
    for (const SequenceUpdate& s : u.sequences) {
      completion_tokens_ += static_cast<int64_t>(s.tokens.size());
      if (s.tokens.empty() && s.text.empty() && s.finish == FinishReason::kNone) continue;
      v1::SequenceDelta* d = message.add_sequences();
      d->set_index(s.index);
      d->mutable_token_ids()->Add(s.tokens.begin(), s.tokens.end());
      d->set_text(s.text);
      if (logprobs_) {
        for (const TokenLogprob& lp : s.logprobs) {
          v1::TokenLogprob* out = d->add_logprobs();
          out->set_token_id(lp.token);
          out->set_logprob(lp.logprob);
          out->set_token(TokenText(lp.token));
          for (const auto& [token, value] : lp.top) {
            v1::TopLogprob* top = out->add_top();
            top->set_token_id(token);
            top->set_logprob(value);
            top->set_token(TokenText(token));
          }
        }
      }
      if (s.finish != FinishReason::kNone) d->set_finish_reason(FinishReasonName(s.finish));
      d->set_stop_reason(s.stop_reason);
    }
    if (u.finished) {
      v1::Usage* usage = message.mutable_usage();
      usage->set_prompt_tokens(u.prompt_tokens);
      usage->set_completion_tokens(completion_tokens_);
      usage->set_total_tokens(u.prompt_tokens + completion_tokens_);
      usage->set_cached_prompt_tokens(u.cached_prompt_tokens);
      final_ = grpc::Status::OK;
    }
    if (message.sequences_size() > 0 || u.finished) queue_.push_back(std::move(message));
    PumpLocked();
  }

  // Starts the next write, or finishes once everything is written.
  void PumpLocked() {
    if (writing_ || finished_) return;
    if (!queue_.empty()) {
      writing_ = true;
      StartWrite(&queue_.front());
      return;
    }
    if (final_) FinishLocked(*final_);
  }

  void FinishLocked(const grpc::Status& status) {
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }

  std::string TokenText(int32_t token) const {
    if (tokenizer_ == nullptr) return absl::StrCat("token_id:", token);
    return tokenizer_->TokenText(token);
  }

  Scheduler* scheduler_;
  const Tokenizer* tokenizer_;
  const bool logprobs_;
  std::shared_ptr<std::atomic<int64_t>> active_calls_;
  std::shared_ptr<State> state_;
  std::string id_;
  uint64_t request_id_ = 0;
  bool submitted_ = false, request_done_ = false;
  std::deque<v1::GenerateResponse> queue_;
  bool writing_ = false, finished_ = false;
  std::optional<grpc::Status> final_;
  int64_t completion_tokens_ = 0;
};

}  // namespace

grpc::Status ToGrpcStatus(const ApiError& error) {
  grpc::StatusCode code = grpc::StatusCode::INTERNAL;
  switch (error.status) {
    case 400:
      code = grpc::StatusCode::INVALID_ARGUMENT;
      break;
    case 401:
      code = grpc::StatusCode::UNAUTHENTICATED;
      break;
    case 404:
      code = grpc::StatusCode::NOT_FOUND;
      break;
    case 413:
    case 429:
      code = grpc::StatusCode::RESOURCE_EXHAUSTED;
      break;
    case 499:
      code = grpc::StatusCode::CANCELLED;
      break;
    case 503:
      code = grpc::StatusCode::UNAVAILABLE;
      break;
    case 504:
      code = grpc::StatusCode::DEADLINE_EXCEEDED;
      break;
  }
  std::string message = error.message;
  if (!error.param.empty()) absl::StrAppend(&message, " (param: ", error.param, ")");
  return grpc::Status(code, message);
}

GrpcApi::GrpcApi(Scheduler* scheduler, const Tokenizer* tokenizer,
                 const ChatTemplate* chat_template, ApiOptions options,
                 std::function<bool()> healthy)
    : scheduler_(scheduler),
      tokenizer_(tokenizer),
      chat_template_(chat_template),
      options_(std::move(options)),
      healthy_(std::move(healthy)),
      created_(absl::ToUnixSeconds(absl::Now())) {}

std::optional<ApiError> GrpcApi::CheckCall(grpc::CallbackServerContext* context,
                                           const std::string& model) const {
  if (!options_.api_key.empty()) {
    const auto& metadata = context->client_metadata();
    auto it = metadata.find("authorization");
    if (it == metadata.end() ||
        std::string(it->second.data(), it->second.size()) != "Bearer " + options_.api_key) {
      return Unauthorized("missing or wrong API key (expected 'authorization: Bearer <key>')");
    }
  }
  return CheckModel(model, options_.served_model_name);
}

std::variant<std::string, ApiError> GrpcApi::RenderChat(const v1::ChatMessages& messages) const {
  if (tokenizer_ == nullptr || chat_template_ == nullptr) {
    return BadRequest("this model has no tokenizer, so no chat", "messages");
  }
  if (messages.messages_size() == 0) return BadRequest("'messages' is empty", "messages");
  ojson list = ojson::array();
  for (const v1::ChatMessage& m : messages.messages()) {
    list.push_back({{"role", m.role()}, {"content", m.content()}});
  }
  auto rendered = chat_template_->Render(
      list, !messages.has_add_generation_prompt() || messages.add_generation_prompt(), ojson(),
      ojson::object());
  if (!rendered.ok()) return BadRequest(std::string(rendered.status().message()), "messages");
  return *rendered;
}

grpc::ServerWriteReactor<v1::GenerateResponse>* GrpcApi::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  const bool logprobs = request->params().has_logprobs();
  auto* call = new GenerateCall(scheduler_, tokenizer_, logprobs, active_calls_);
  if (auto e = CheckCall(context, request->model())) {
    call->FailNow(*e);
    return call;
  }
  if (draining_) {
    call->FailNow(Overloaded("the server is shutting down"));
    return call;
  }
  if (!healthy_()) {
    call->FailNow(Overloaded("no compute node or KV pool is serving yet"));
    return call;
  }
  auto params_or =
      ValidateParams(ParamsFromProto(request->params()), Endpoint::kCompletions, options_.limits);
  if (auto* e = std::get_if<ApiError>(&params_or)) {
    call->FailNow(*e);
    return call;
  }
  ParsedParams params = std::get<ParsedParams>(std::move(params_or));
  GenerateRequest r = params.request;
  r.max_tokens = params.max_tokens.value_or(options_.default_completion_max_tokens);
  switch (request->prompt_case()) {
    case v1::GenerateRequest::kText:
      if (tokenizer_ == nullptr) {
        call->FailNow(BadRequest("this model has no tokenizer: send token ids", "text"));
        return call;
      }
      r.prompt_tokens = tokenizer_->Encode(request->text(), /*add_special_tokens=*/true);
      break;
    case v1::GenerateRequest::kTokenIds:
      for (int32_t t : request->token_ids().ids()) {
        if (t < 0 || t >= options_.limits.vocab_size) {
          call->FailNow(
              BadRequest(absl::StrCat("'token_ids' holds an invalid token id: ", t), "token_ids"));
          return call;
        }
      }
      r.prompt_tokens.assign(request->token_ids().ids().begin(), request->token_ids().ids().end());
      break;
    case v1::GenerateRequest::kMessages: {
      auto rendered = RenderChat(request->messages());
      if (auto* e = std::get_if<ApiError>(&rendered)) {
        call->FailNow(*e);
        return call;
      }
      // Templates write their own BOS, so no special tokens are added (as the HTTP chat).
      r.prompt_tokens =
          tokenizer_->Encode(std::get<std::string>(rendered), /*add_special_tokens=*/false);
      if (!params.max_tokens) {
        r.max_tokens = DefaultChatMaxTokens(options_.limits, r.prompt_tokens.size());
      }
      break;
    }
    case v1::GenerateRequest::PROMPT_NOT_SET:
      call->FailNow(BadRequest("a prompt is required: text, token_ids or messages", "prompt"));
      return call;
  }
  if (r.prompt_tokens.empty()) {
    call->FailNow(BadRequest("the prompt is empty", "prompt"));
    return call;
  }
  call->Start(std::move(r));
  return call;
}

grpc::ServerUnaryReactor* GrpcApi::Tokenize(grpc::CallbackServerContext* context,
                                            const v1::TokenizeRequest* request,
                                            v1::TokenizeResponse* response) {
  if (auto e = CheckCall(context, request->model())) return Reply(context, *e);
  if (tokenizer_ == nullptr) return Reply(context, BadRequest("this model has no tokenizer"));
  std::vector<int32_t> tokens;
  switch (request->input_case()) {
    case v1::TokenizeRequest::kText:
      tokens = tokenizer_->Encode(
          request->text(), !request->has_add_special_tokens() || request->add_special_tokens());
      break;
    case v1::TokenizeRequest::kMessages: {
      auto rendered = RenderChat(request->messages());
      if (auto* e = std::get_if<ApiError>(&rendered)) return Reply(context, *e);
      tokens =
          tokenizer_->Encode(std::get<std::string>(rendered),
                             request->has_add_special_tokens() && request->add_special_tokens());
      break;
    }
    case v1::TokenizeRequest::INPUT_NOT_SET:
      return Reply(context, BadRequest("'text' or 'messages' is required", "text"));
  }
  for (int32_t t : tokens) {
    response->add_token_ids(t);
    response->add_tokens(tokenizer_->IdToToken(t));
  }
  response->set_max_model_len(options_.limits.max_model_len);
  return Reply(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* GrpcApi::Detokenize(grpc::CallbackServerContext* context,
                                              const v1::DetokenizeRequest* request,
                                              v1::DetokenizeResponse* response) {
  if (auto e = CheckCall(context, request->model())) return Reply(context, *e);
  if (tokenizer_ == nullptr) return Reply(context, BadRequest("this model has no tokenizer"));
  for (int32_t t : request->token_ids()) {
    if (t < 0 || t >= options_.limits.vocab_size) {
      return Reply(context, BadRequest(absl::StrCat("'token_ids' holds an invalid token id: ", t),
                                       "token_ids"));
    }
  }
  const std::vector<int32_t> tokens(request->token_ids().begin(), request->token_ids().end());
  response->set_text(tokenizer_->Decode(tokens, /*skip_special_tokens=*/false, /*clean_up=*/true));
  return Reply(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* GrpcApi::ListModels(grpc::CallbackServerContext* context,
                                              const v1::ListModelsRequest*,
                                              v1::ListModelsResponse* response) {
  if (!options_.api_key.empty()) {
    // ListModels names no model; only the key is checked.
    if (auto e = CheckCall(context, options_.served_model_name)) return Reply(context, *e);
  }
  v1::Model* model = response->add_models();
  model->set_id(options_.served_model_name);
  model->set_max_model_len(options_.limits.max_model_len);
  model->set_created(created_);
  model->set_owned_by("strata");
  return Reply(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* GrpcApi::Health(grpc::CallbackServerContext* context,
                                          const v1::HealthRequest*, v1::HealthResponse* response) {
  response->set_status(draining_    ? v1::HealthResponse::DRAINING
                       : healthy_() ? v1::HealthResponse::SERVING
                                    : v1::HealthResponse::NOT_SERVING);
  return Reply(context, grpc::Status::OK);
}

}  // namespace strata::api
