#include "compute_node/service.h"

#include <optional>

#include "common/base/logging.h"
#include "common/base/shutdown.h"
#include "common/base/stopwatch.h"
#include "common/control/grpc_status.h"
#include "common/protocol/node_config_proto.h"
#include "common/protocol/step_proto.h"

namespace strata {
namespace {}  // namespace

grpc::Status ComputeNodeService::Configure(grpc::ServerContext* context,
                                           const control::ComputeConfig* request,
                                           control::ComputeConfigAck* response) {
  if (grpc::Status auth = auth_->Check(context); !auth.ok()) return auth;
  auto ack = node_->Configure(FromProto(*request));
  if (!ack.ok()) return ToGrpcStatus(ack.status());
  *response = ToProto(*ack);
  return grpc::Status::OK;
}

grpc::Status ComputeNodeService::RunSteps(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<control::StepResult, control::StepPlan>* stream) {
  if (grpc::Status auth = auth_->Check(context); !auth.ok()) return auth;
  control::StepPlan wire;
  std::optional<Stopwatch> since_result;  // from the last result written
  while (stream->Read(&wire)) {
    if (since_result && plan_wait_observer_) plan_wait_observer_(since_result->ElapsedSeconds());
    StepResult result;
    auto plan = FromProto(wire);
    if (!plan.ok()) {
      LOG(ERROR) << "rejected a malformed step plan: " << plan.status();
      result.step_id = wire.step_id();
      result.status = plan.status();
    } else {
      result = node_->Execute(*plan);
    }
    control::StepResult out;
    ToProto(result, &out);
    if (!stream->Write(out)) break;
    since_result.emplace();
    if (context->IsCancelled()) break;
  }
  return grpc::Status::OK;
}

grpc::Status ComputeNodeService::Health(grpc::ServerContext* context, const control::HealthRequest*,
                                        control::HealthResponse* response) {
  if (grpc::Status auth = auth_->Check(context); !auth.ok()) return auth;
  *response->mutable_node() = info_;
  *response->mutable_status() = ToProto(node_->Status());
  return grpc::Status::OK;
}

grpc::Status ComputeNodeService::Shutdown(grpc::ServerContext* context,
                                          const control::ShutdownRequest*,
                                          control::ShutdownResponse*) {
  if (grpc::Status auth = auth_->Check(context); !auth.ok()) return auth;
  LOG(INFO) << "shutdown requested by the scheduler";
  RequestShutdown();
  return grpc::Status::OK;
}

}  // namespace strata
