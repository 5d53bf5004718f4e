// A remote compute node as a StepExecutor: plans go out and results come back over one
// RunSteps bidirectional stream.
//
// Each step has a deadline: a node that does not answer in time (hung, SIGSTOPped) gets its
// stream cancelled and the step completes with an error, so the scheduler never waits
// forever. A broken stream (the node died) completes the step with an error too; the next
// step opens a new stream.
#ifndef STRATA_SERVER_GRPC_EXECUTOR_H_
#define STRATA_SERVER_GRPC_EXECUTOR_H_

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/time/time.h"
#include "common/control/cluster_auth.h"
#include "proto/control.grpc.pb.h"
#include "server/step_executor.h"

namespace strata {

class GrpcExecutor : public StepExecutor {
 public:
  // Calls carry `auth`'s credentials.
  GrpcExecutor(std::string name, const std::string& address, absl::Duration step_deadline,
               std::shared_ptr<const ClusterAuth> auth);
  ~GrpcExecutor() override;

  std::string name() const override { return name_; }
  void Submit(StepPlan plan, StepResultSink sink) override;
  bool Reachable() override;

  std::shared_ptr<grpc::Channel> channel() const { return channel_; }

 private:
  void Run();
  void Watchdog();
  StepResult RunOne(const StepPlan& plan);

  std::string name_;
  std::shared_ptr<const ClusterAuth> auth_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<control::ComputeNode::Stub> stub_;
  absl::Duration step_deadline_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<StepPlan, StepResultSink>> queue_;
  bool stop_ = false;
  // The open stream; the worker owns it, the watchdog may cancel its context.
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::ClientReaderWriter<control::StepPlan, control::StepResult>> stream_;
  absl::Time step_deadline_at_ = absl::InfiniteFuture();
  std::thread worker_, watchdog_;
};

}  // namespace strata

#endif  // STRATA_SERVER_GRPC_EXECUTOR_H_
