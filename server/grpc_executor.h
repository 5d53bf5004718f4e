// A remote compute node as a StepExecutor: plans go out and results come back over one
// RunSteps bidirectional stream.
//
// Plans are written as soon as they are submitted, while earlier ones still run: the node
// reads the next plan the moment it has written a result, so several plans in flight
// (asynchronous scheduling) keep it busy without a round trip between steps. A writer
// thread sends, a reader thread receives; results come back in order.
//
// Each step has a deadline, counted from when it becomes the oldest unanswered one: a node
// that does not answer in time (hung, SIGSTOPped) gets its stream cancelled and the step
// completes with an error, so the scheduler never waits forever. A broken stream (the node
// died) completes every plan written to it with an error, in order; the next plan opens a
// new stream.
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

// A channel to the compute node at `address` ("host:port") carrying `auth`'s credentials,
// with room for the largest step plans and results, and quick reconnection.
std::shared_ptr<grpc::Channel> ComputeNodeChannel(const std::string& address,
                                                  const ClusterAuth& auth);

class GrpcExecutor : public StepExecutor {
 public:
  // Calls on `channel` (ComputeNodeChannel) carry `auth`'s credentials.
  GrpcExecutor(std::string name, std::shared_ptr<grpc::Channel> channel,
               absl::Duration step_deadline, std::shared_ptr<const ClusterAuth> auth);
  ~GrpcExecutor() override;

  std::string name() const override { return name_; }
  void Submit(std::shared_ptr<const StepPlan> plan, StepResultSink sink) override;
  bool Reachable() override;
  // Cancels the open stream: its plans fail with `why`.
  void Abandon(const absl::Status& why) override;

 private:
  void WriteLoop();
  void ReadLoop();
  void Watchdog();
  // The open stream failed: closes it and completes every plan written to it with the
  // failure, oldest first. Reader thread, with `lock` held on entry and exit.
  void CloseBrokenStream(std::unique_lock<std::mutex>& lock);

  std::string name_;
  std::shared_ptr<const ClusterAuth> auth_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<control::ComputeNode::Stub> stub_;
  absl::Duration step_deadline_;

  std::mutex mu_;
  // One per waiter, so that a step wakes only the thread it concerns: the writer (a plan
  // queued, the stream mended, stop), the reader (a plan written, a write over, stop) and
  // the watchdog (stop, or a deadline set where none was; otherwise it sleeps until the
  // deadline it watches).
  std::condition_variable writer_cv_, reader_cv_, watchdog_cv_;
  std::deque<std::pair<std::shared_ptr<const StepPlan>, StepResultSink>> queue_;  // not written
  struct Sent {
    uint64_t step_id;
    StepResultSink sink;
  };
  std::deque<Sent> sent_;  // written to the open stream, unanswered, oldest first
  bool stop_ = false;
  bool writing_ = false;  // the writer is inside stream_->Write
  bool broken_ = false;   // the reader is closing the open stream: the writer waits
  // The open stream: the writer opens it, the reader closes it, the watchdog may cancel it.
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::ClientReaderWriter<control::StepPlan, control::StepResult>> stream_;
  absl::Time step_deadline_at_ = absl::InfiniteFuture();
  absl::Status abandoned_;  // Abandon's reason, for the stream it cancelled
  std::thread writer_, reader_, watchdog_;
};

}  // namespace strata

#endif  // STRATA_SERVER_GRPC_EXECUTOR_H_
