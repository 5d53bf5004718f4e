#include "memory_node/service.h"

#include "common/base/logging.h"
#include "common/base/shutdown.h"

namespace strata {

grpc::Status MemoryNodeService::Configure(grpc::ServerContext*,
                                          const control::MemoryConfig* request,
                                          control::MemoryConfigAck* response) {
  auto ack = server_->Configure(*request);
  if (!ack.ok()) {
    LOG(ERROR) << "configuration refused: " << ack.status();
    return grpc::Status(static_cast<grpc::StatusCode>(ack.status().code()),
                        std::string(ack.status().message()));
  }
  *response = *ack;
  return grpc::Status::OK;
}

grpc::Status MemoryNodeService::Health(grpc::ServerContext*, const control::HealthRequest*,
                                       control::HealthResponse* response) {
  *response->mutable_node() = info_;
  *response->mutable_status() = server_->Status();
  return grpc::Status::OK;
}

grpc::Status MemoryNodeService::Shutdown(grpc::ServerContext*, const control::ShutdownRequest*,
                                         control::ShutdownResponse*) {
  LOG(INFO) << "shutdown requested by the scheduler";
  RequestShutdown();
  return grpc::Status::OK;
}

}  // namespace strata
