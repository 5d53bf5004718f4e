#include "memory_node/service.h"

#include "common/base/logging.h"
#include "common/base/shutdown.h"
#include "common/control/grpc_status.h"
#include "common/protocol/node_config_proto.h"
#include "common/protocol/step_proto.h"

namespace strata {

grpc::Status MemoryNodeService::Configure(grpc::ServerContext* context,
                                          const control::MemoryConfig* request,
                                          control::MemoryConfigAck* response) {
  if (grpc::Status auth = auth_->Check(context); !auth.ok()) return auth;
  auto ack = server_->Configure(FromProto(*request));
  if (!ack.ok()) {
    LOG(ERROR) << "configuration refused: " << ack.status();
    return ToGrpcStatus(ack.status());
  }
  *response = ToProto(*ack);
  return grpc::Status::OK;
}

grpc::Status MemoryNodeService::MoveKv(grpc::ServerContext* context,
                                       const control::KvMoves* request,
                                       control::KvMoveReport* response) {
  if (grpc::Status auth = auth_->Check(context); !auth.ok()) return auth;
  auto moves = MovesFromProto(*request);
  if (!moves.ok()) return ToGrpcStatus(moves.status());
  auto done = server_->MoveKv(request->epoch(), request->tier(), *moves,
                              absl::FromChrono(context->deadline()));
  if (!done.ok()) return ToGrpcStatus(done.status());
  for (const absl::Status& s : *done) ToProto(s, response->add_status());
  return grpc::Status::OK;
}

grpc::Status MemoryNodeService::Health(grpc::ServerContext* context, const control::HealthRequest*,
                                       control::HealthResponse* response) {
  if (grpc::Status auth = auth_->Check(context); !auth.ok()) return auth;
  *response->mutable_node() = info_;
  *response->mutable_status() = ToProto(server_->Status());
  return grpc::Status::OK;
}

grpc::Status MemoryNodeService::Shutdown(grpc::ServerContext* context,
                                         const control::ShutdownRequest*,
                                         control::ShutdownResponse*) {
  if (grpc::Status auth = auth_->Check(context); !auth.ok()) return auth;
  LOG(INFO) << "shutdown requested by the scheduler";
  RequestShutdown();
  return grpc::Status::OK;
}

}  // namespace strata
