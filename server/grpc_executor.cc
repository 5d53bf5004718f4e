#include "server/grpc_executor.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/logging.h"
#include "common/control/grpc_status.h"
#include "common/protocol/step_proto.h"

namespace strata {

GrpcExecutor::GrpcExecutor(std::string name, const std::string& address,
                           absl::Duration step_deadline, std::shared_ptr<const ClusterAuth> auth)
    : name_(std::move(name)), auth_(std::move(auth)), step_deadline_(step_deadline) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  args.SetMaxSendMessageSize(256 << 20);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 2000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 2000);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  channel_ = auth_->CreateChannel(address, args);
  stub_ = control::ComputeNode::NewStub(channel_);
  worker_ = std::thread([this] { Run(); });
  watchdog_ = std::thread([this] { Watchdog(); });
}

GrpcExecutor::~GrpcExecutor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    if (context_) context_->TryCancel();
  }
  cv_.notify_all();
  worker_.join();
  watchdog_.join();
}

void GrpcExecutor::Submit(StepPlan plan, StepResultSink sink) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.emplace_back(std::move(plan), std::move(sink));
  }
  cv_.notify_all();
}

void GrpcExecutor::Watchdog() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, absl::ToChronoNanoseconds(absl::Milliseconds(100)));
    if (context_ != nullptr && absl::Now() > step_deadline_at_) {
      LOG(ERROR) << "compute node " << name_ << " did not finish a step within "
                 << absl::FormatDuration(step_deadline_) << "; cancelling its stream";
      context_->TryCancel();
      step_deadline_at_ = absl::InfiniteFuture();
    }
  }
}

StepResult GrpcExecutor::RunOne(const StepPlan& plan) {
  StepResult failure;
  failure.step_id = plan.step_id;
  if (stream_ == nullptr) {
    auto context = std::make_unique<grpc::ClientContext>();
    auth_->Attach(context.get());
    auto stream = stub_->RunSteps(context.get());
    std::lock_guard<std::mutex> lock(mu_);
    context_ = std::move(context);
    stream_ = std::move(stream);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    step_deadline_at_ = absl::Now() + step_deadline_;
  }
  control::StepPlan wire;
  ToProto(plan, &wire);
  control::StepResult reply;
  const bool ok = stream_->Write(wire) && stream_->Read(&reply);
  {
    std::lock_guard<std::mutex> lock(mu_);
    step_deadline_at_ = absl::InfiniteFuture();
  }
  if (ok) return FromProto(reply);
  // The stream is broken: the node died, hung past the deadline, or went away.
  const grpc::Status status = stream_->Finish();
  // The stream's own code (Unavailable, DeadlineExceeded, ...) is the step's.
  failure.status =
      status.ok()
          ? absl::UnavailableError(absl::StrCat("compute node ", name_, " failed: stream closed"))
          : absl::Status(FromGrpcStatus(status).code(),
                         absl::StrCat("compute node ", name_, " failed: ", status.error_message()));
  failure.node_unreachable = status.ok() || status.error_code() == grpc::StatusCode::UNAVAILABLE;
  std::lock_guard<std::mutex> lock(mu_);
  stream_.reset();
  context_.reset();
  return failure;
}

bool GrpcExecutor::Reachable() {
  return channel_->GetState(/*try_to_connect=*/true) == GRPC_CHANNEL_READY;
}

void GrpcExecutor::Run() {
  while (true) {
    std::pair<StepPlan, StepResultSink> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) break;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    job.second(RunOne(job.first));
  }
  // Plans still queued complete with an error: none is lost.
  std::deque<std::pair<StepPlan, StepResultSink>> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    left.swap(queue_);
  }
  for (auto& [plan, sink] : left) {
    StepResult r;
    r.step_id = plan.step_id;
    r.status = absl::CancelledError("the executor is shutting down");
    sink(std::move(r));
  }
  if (stream_) {
    stream_->WritesDone();
    stream_->Finish();
  }
}

}  // namespace strata
