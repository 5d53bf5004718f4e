#include "server/grpc_executor.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/logging.h"
#include "common/base/thread_name.h"
#include "common/control/grpc_status.h"
#include "common/protocol/step_proto.h"

namespace strata {

std::shared_ptr<grpc::Channel> ComputeNodeChannel(const std::string& address,
                                                  const ClusterAuth& auth) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  args.SetMaxSendMessageSize(256 << 20);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 2000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 2000);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return auth.CreateChannel(address, args);
}

GrpcExecutor::GrpcExecutor(std::string name, std::shared_ptr<grpc::Channel> channel,
                           absl::Duration step_deadline, std::shared_ptr<const ClusterAuth> auth)
    : name_(std::move(name)),
      auth_(std::move(auth)),
      channel_(std::move(channel)),
      step_deadline_(step_deadline) {
  stub_ = control::ComputeNode::NewStub(channel_);
  writer_ = std::thread([this] {
    SetCurrentThreadName("exec-write");
    WriteLoop();
  });
  reader_ = std::thread([this] {
    SetCurrentThreadName("exec-read");
    ReadLoop();
  });
  watchdog_ = std::thread([this] {
    SetCurrentThreadName("exec-watchdog");
    Watchdog();
  });
}

GrpcExecutor::~GrpcExecutor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    if (context_) context_->TryCancel();
  }
  writer_cv_.notify_all();
  reader_cv_.notify_all();
  watchdog_cv_.notify_all();
  writer_.join();
  reader_.join();
  watchdog_.join();
  if (stream_) stream_->Finish();  // cancelled above: returns at once
  // Plans never written complete with an error: none is lost.
  std::deque<std::pair<std::shared_ptr<const StepPlan>, StepResultSink>> left;
  left.swap(queue_);
  for (auto& [plan, sink] : left) {
    sink(FailedStep(plan->step_id, absl::CancelledError("the executor is shutting down"),
                    /*node_unreachable=*/false));
  }
}

void GrpcExecutor::Submit(std::shared_ptr<const StepPlan> plan, StepResultSink sink) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.emplace_back(std::move(plan), std::move(sink));
  }
  writer_cv_.notify_one();
}

void GrpcExecutor::Watchdog() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    // Asleep until the oldest plan's deadline, or until one is set: a result that came
    // meanwhile moved it later, and the wait goes on to the new one.
    if (step_deadline_at_ == absl::InfiniteFuture()) {
      watchdog_cv_.wait(lock);
      continue;
    }
    if (const absl::Time now = absl::Now(); now <= step_deadline_at_) {
      watchdog_cv_.wait_for(lock, absl::ToChronoNanoseconds(step_deadline_at_ - now));
      continue;
    }
    if (context_ != nullptr) {
      LOG(ERROR) << "compute node " << name_ << " did not finish a step within "
                 << absl::FormatDuration(step_deadline_) << "; cancelling its stream";
      context_->TryCancel();
    }
    step_deadline_at_ = absl::InfiniteFuture();
  }
}

void GrpcExecutor::Abandon(const absl::Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (context_ == nullptr || sent_.empty()) return;
  abandoned_ = why;
  context_->TryCancel();
}

void GrpcExecutor::WriteLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    writer_cv_.wait(lock, [&] { return stop_ || (!queue_.empty() && !broken_); });
    if (stop_) return;
    if (stream_ == nullptr) {
      auto context = std::make_unique<grpc::ClientContext>();
      auth_->Attach(context.get());
      auto stream = stub_->RunSteps(context.get());
      context_ = std::move(context);
      stream_ = std::move(stream);
    }
    auto [plan, sink] = std::move(queue_.front());
    queue_.pop_front();
    if (sent_.empty()) {
      step_deadline_at_ = absl::Now() + step_deadline_;
      watchdog_cv_.notify_one();  // it slept with no deadline to watch
    }
    sent_.push_back({plan->step_id, std::move(sink)});
    writing_ = true;
    auto* stream = stream_.get();
    reader_cv_.notify_all();  // the reader has a result to wait for
    lock.unlock();
    control::StepPlan wire;
    ToProto(*plan, &wire);
    const bool ok = stream->Write(wire);
    lock.lock();
    writing_ = false;
    // A failed write breaks the stream: the reader's Read fails and it closes the stream.
    if (!ok && context_ != nullptr) context_->TryCancel();
    reader_cv_.notify_all();  // a reader closing the stream waits for the write to end
  }
}

void GrpcExecutor::ReadLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    reader_cv_.wait(lock, [&] { return !sent_.empty() || stop_; });
    if (sent_.empty()) return;  // stopping, and nothing unanswered
    auto* stream = stream_.get();
    lock.unlock();
    control::StepResult reply;
    const bool ok = stream->Read(&reply);
    lock.lock();
    if (!ok) {
      CloseBrokenStream(lock);
      continue;
    }
    Sent done = std::move(sent_.front());
    sent_.pop_front();
    step_deadline_at_ = sent_.empty() ? absl::InfiniteFuture() : absl::Now() + step_deadline_;
    lock.unlock();
    done.sink(FromProto(reply));
    lock.lock();
  }
}

void GrpcExecutor::CloseBrokenStream(std::unique_lock<std::mutex>& lock) {
  broken_ = true;
  // Finish must not race a Write; a write blocked on a dead peer ends when cancelled.
  if (writing_) context_->TryCancel();
  reader_cv_.wait(lock, [&] { return !writing_; });
  auto stream = std::move(stream_);
  auto context = std::move(context_);
  std::deque<Sent> failed;
  failed.swap(sent_);
  step_deadline_at_ = absl::InfiniteFuture();
  const absl::Status abandoned = std::exchange(abandoned_, absl::OkStatus());
  lock.unlock();
  // The stream's own code (Unavailable, DeadlineExceeded, ...) is the steps', unless the
  // stream was abandoned (Abandon).
  const grpc::Status status = stream->Finish();
  absl::Status error = abandoned;
  bool unreachable = true;
  if (error.ok() && status.ok()) {
    error = absl::UnavailableError(absl::StrCat("compute node ", name_, " failed: stream closed"));
  } else if (error.ok()) {
    error = absl::Status(FromGrpcStatus(status).code(),
                         absl::StrCat("compute node ", name_, " failed: ", status.error_message()));
    unreachable = status.error_code() == grpc::StatusCode::UNAVAILABLE;
  }
  for (Sent& s : failed) s.sink(FailedStep(s.step_id, error, unreachable));
  lock.lock();
  broken_ = false;
  writer_cv_.notify_all();
}

bool GrpcExecutor::Reachable() {
  return channel_->GetState(/*try_to_connect=*/true) == GRPC_CHANNEL_READY;
}

}  // namespace strata
