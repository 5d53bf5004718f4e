// The memory node's gRPC service (proto/control.proto, service MemoryNode): configuration
// by the scheduler, the disk tier's moves, health, and shutdown.
#ifndef STRATA_MEMORY_NODE_SERVICE_H_
#define STRATA_MEMORY_NODE_SERVICE_H_

#include <memory>

#include "common/control/cluster_auth.h"
#include "memory_node/memory_server.h"
#include "proto/control.grpc.pb.h"

namespace strata {

class MemoryNodeService final : public control::MemoryNode::Service {
 public:
  // `server` must outlive the service; `info` is what Health reports. Every call must carry
  // the deployment's credentials (`auth`), Shutdown and Health included.
  MemoryNodeService(MemoryServer* server, control::NodeInfo info,
                    std::shared_ptr<const ClusterAuth> auth)
      : server_(server), info_(std::move(info)), auth_(std::move(auth)) {}

  grpc::Status Configure(grpc::ServerContext* context, const control::MemoryConfig* request,
                         control::MemoryConfigAck* response) override;
  grpc::Status MoveKv(grpc::ServerContext* context, const control::KvMoves* request,
                      control::KvMoveReport* response) override;
  grpc::Status Health(grpc::ServerContext* context, const control::HealthRequest* request,
                      control::HealthResponse* response) override;
  grpc::Status Shutdown(grpc::ServerContext* context, const control::ShutdownRequest* request,
                        control::ShutdownResponse* response) override;

 private:
  MemoryServer* server_;
  control::NodeInfo info_;
  std::shared_ptr<const ClusterAuth> auth_;
};

}  // namespace strata

#endif  // STRATA_MEMORY_NODE_SERVICE_H_
