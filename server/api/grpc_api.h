// strata's gRPC API (proto/api.proto): Generate (server streaming), Tokenize, Detokenize,
// ListModels and Health, on gRPC's callback API (no thread per call).
//
// Sampling parameters become the typed request both APIs build (api::RequestParams) and go
// through the one validation (api::ValidateParams), so that both APIs accept, default and
// refuse exactly the same things; ApiErrors become gRPC
// status codes (400 INVALID_ARGUMENT, 401 UNAUTHENTICATED, 404 NOT_FOUND, 429
// RESOURCE_EXHAUSTED, 503 UNAVAILABLE, 504 DEADLINE_EXCEEDED, else INTERNAL). A call the
// client cancels cancels its request, which frees its KV.
//
// Thread-safety: RPC methods run on gRPC threads, scheduler updates on the scheduler
// thread; each Generate call's state is locked.
#ifndef STRATA_SERVER_API_GRPC_API_H_
#define STRATA_SERVER_API_GRPC_API_H_

#include <atomic>
#include <functional>

#include "common/tokenizer/tokenizer.h"
#include "proto/api.grpc.pb.h"
#include "server/api/api_error.h"
#include "server/api/openai_api.h"
#include "server/chat/chat_template.h"
#include "server/scheduler.h"

namespace strata::api {

grpc::Status ToGrpcStatus(const ApiError& error);

class GrpcApi final : public strata::api::v1::Inference::CallbackService {
 public:
  // `tokenizer` and `chat_template` may be null (token-id prompts only).
  GrpcApi(Scheduler* scheduler, const Tokenizer* tokenizer, const ChatTemplate* chat_template,
          ApiOptions options, std::function<bool()> healthy);

  void SetDraining(bool draining) { draining_ = draining; }
  int64_t active_calls() const { return active_calls_->load(); }

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const v1::TokenizeRequest* request,
                                     v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* context,
                                       const v1::DetokenizeRequest* request,
                                       v1::DetokenizeResponse* response) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const v1::ListModelsRequest* request,
                                       v1::ListModelsResponse* response) override;
  grpc::ServerUnaryReactor* Health(grpc::CallbackServerContext* context,
                                   const v1::HealthRequest* request,
                                   v1::HealthResponse* response) override;

 private:
  // The API key (when set) and the model name; nullopt when the call may go on.
  std::optional<ApiError> CheckCall(grpc::CallbackServerContext* context,
                                    const std::string& model) const;
  // Renders chat messages with the model's template.
  std::variant<std::string, ApiError> RenderChat(const v1::ChatMessages& messages) const;

  Scheduler* scheduler_;
  const Tokenizer* tokenizer_;
  const ChatTemplate* chat_template_;
  ApiOptions options_;
  std::function<bool()> healthy_;
  std::atomic<bool> draining_{false};
  // Shared with the calls, which may outlive a Shutdown that has stopped waiting.
  std::shared_ptr<std::atomic<int64_t>> active_calls_ = std::make_shared<std::atomic<int64_t>>(0);
  int64_t created_ = 0;
};

}  // namespace strata::api

#endif  // STRATA_SERVER_API_GRPC_API_H_
