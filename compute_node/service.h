// The compute node's gRPC service (proto/control.proto, service ComputeNode): the
// scheduler's entry point to a ComputeNode. Step plans come over the step channel
// (step_channel.h) by default; RunSteps carries them where the scheduler uses gRPC.
#ifndef STRATA_COMPUTE_NODE_SERVICE_H_
#define STRATA_COMPUTE_NODE_SERVICE_H_

#include <omp.h>

#include <functional>
#include <memory>

#include "common/control/cluster_auth.h"
#include "compute_node/compute_node.h"
#include "proto/control.grpc.pb.h"

namespace strata {

class ComputeNodeService final : public control::ComputeNode::Service {
 public:
  // `node` must outlive the service; `info` is what Health reports. Every call must carry
  // the deployment's credentials (`auth`), Shutdown and Health included.
  ComputeNodeService(ComputeNode* node, control::NodeInfo info,
                     std::shared_ptr<const ClusterAuth> auth)
      : node_(node), info_(std::move(info)), auth_(std::move(auth)) {}
  // Called, on the step thread, with the seconds the node sat with no plan to run between
  // steps of the same stream: its idle time between steps (near zero when the scheduler
  // sent the next plan ahead). Set before serving.
  void SetPlanWaitObserver(std::function<void(double)> observer) {
    plan_wait_observer_ = std::move(observer);
  }

  grpc::Status Configure(grpc::ServerContext* context, const control::ComputeConfig* request,
                         control::ComputeConfigAck* response) override;
  // Co-located mode: moves between the node's own KV cache and its disk tier.
  grpc::Status MoveKv(grpc::ServerContext* context, const control::KvMoves* request,
                      control::KvMoveReport* response) override;
  grpc::Status RunSteps(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<control::StepResult, control::StepPlan>* stream) override;
  grpc::Status Health(grpc::ServerContext* context, const control::HealthRequest* request,
                      control::HealthResponse* response) override;
  grpc::Status Shutdown(grpc::ServerContext* context, const control::ShutdownRequest* request,
                        control::ShutdownResponse* response) override;

 private:
  ComputeNode* node_;
  control::NodeInfo info_;
  std::shared_ptr<const ClusterAuth> auth_;
  std::function<void(double)> plan_wait_observer_;
  // The service is made on the main thread after --threads/--cpus: the steps' team takes
  // this size (gRPC's handler threads have libgomp's default).
  const int threads_ = omp_get_max_threads();
};

}  // namespace strata

#endif  // STRATA_COMPUTE_NODE_SERVICE_H_
