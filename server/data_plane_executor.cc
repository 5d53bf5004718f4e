#include "server/data_plane_executor.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/protocol/step_frame.h"
#include "common/protocol/step_proto.h"
#include "common/transport/frame.h"
#include "proto/control.pb.h"

namespace strata {

using transport::FrameKind;
using transport::PeerId;

DataPlaneExecutor::DataPlaneExecutor(DataPlaneExecutorOptions options)
    : options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<DataPlaneExecutor>> DataPlaneExecutor::Create(
    DataPlaneExecutorOptions options) {
  auto executor = std::unique_ptr<DataPlaneExecutor>(new DataPlaneExecutor(std::move(options)));
  DataPlaneExecutor* self = executor.get();
  // Results are held by the transport (Place places nothing): no larger claim is taken.
  self->options_.transport.max_held_bytes =
      std::min<uint64_t>(self->options_.transport.max_held_bytes, kMaxStepFrameBytes);
  ASSIGN_OR_RETURN(executor->transport_, transport::Transport::Create(self->options_.transport));
  executor->transport_->SetHandler(transport::kFrameTag, self);
  executor->transport_->SetPeerHandler(
      [self](PeerId peer, transport::PeerEvent event, const absl::Status& why) {
        if (event != transport::PeerEvent::kDisconnected) return;
        self->Break(peer,
                    absl::UnavailableError(absl::StrCat("compute node ", self->options_.name,
                                                        " failed: ", why.message())),
                    /*unreachable=*/true);
      });
  executor->connector_.Start();
  return executor;
}

DataPlaneExecutor::~DataPlaneExecutor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  connector_.Stop();  // drops a deadline's look not yet due
  // Closing the connection reports it broken: what was sent on it fails, in order.
  transport_.reset();
  // A sink may submit again meanwhile (stop_ keeps it in waiting_): until nothing is left.
  std::lock_guard<std::mutex> complete(complete_mu_);
  const absl::Status error = absl::CancelledError("the executor is shutting down");
  while (true) {
    std::deque<Waiting> waiting;
    std::deque<Sent> sent;
    {
      std::lock_guard<std::mutex> lock(mu_);
      waiting.swap(waiting_);
      sent.swap(sent_);
    }
    if (waiting.empty() && sent.empty()) break;
    for (Sent& s : sent) s.sink(FailedStep(s.step_id, error, false));
    for (Waiting& w : waiting) w.sink(FailedStep(w.plan->step_id, error, false));
  }
}

absl::Status DataPlaneExecutor::Probe() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (peer_ || connecting_) return absl::OkStatus();
    connecting_ = true;
  }
  Connect();
  std::lock_guard<std::mutex> lock(mu_);
  return peer_ ? absl::OkStatus() : last_connect_;
}

DataPlaneExecutorStats DataPlaneExecutor::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

bool DataPlaneExecutor::Reachable() {
  if (options_.control != nullptr &&
      options_.control->GetState(/*try_to_connect=*/true) != GRPC_CHANNEL_READY) {
    return false;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (peer_.has_value() || !lost_) return true;
  // The step channel's connection died, or connecting failed, since it last worked: a node
  // that just died may still look alive on the control channel for a moment. Unreachable
  // until a connection, tried now in the background, is back.
  ConnectSoonLocked();
  return false;
}

void DataPlaneExecutor::ConnectSoonLocked() {
  if (connecting_ || stop_) return;
  connecting_ = true;
  connector_.Post([this] { Connect(); });
}

void DataPlaneExecutor::Submit(std::shared_ptr<const StepPlan> plan, StepResultSink sink) {
  std::lock_guard<std::mutex> send(send_mu_);
  PeerId peer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ || !peer_ || !waiting_.empty()) {
      // Not connected (or plans before this one wait for the connection): in line. The
      // destructor fails what still waits when it stops.
      waiting_.push_back({std::move(plan), std::move(sink)});
      ConnectSoonLocked();
      return;
    }
    peer = *peer_;
  }
  SendLocked(peer, std::move(plan), std::move(sink));
}

void DataPlaneExecutor::SendLocked(PeerId peer, std::shared_ptr<const StepPlan> plan,
                                   StepResultSink sink) {
  const uint64_t step_id = plan->step_id;
  control::StepPlan wire;
  std::shared_ptr<FrameSeal> seal;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ || peer_ != peer) {
      // The connection broke since the caller looked: the plan waits for the next one.
      waiting_.push_back({std::move(plan), std::move(sink)});
      ConnectSoonLocked();
      return;
    }
    if (sent_.empty()) {
      deadline_at_ = absl::Now() + options_.step_deadline;
      WatchDeadlineLocked();
    }
    sent_.push_back({step_id, std::move(sink)});
    ++stats_.sent;
    seal = seal_;
  }
  ToProto(*plan, &wire);
  // The send's completion may run inside Send, with send_mu_ held: a failure is handled on
  // the connector thread, which takes the locks in their order.
  SendMessageFrame(
      *transport_, peer, FrameKind::kPlan, step_id, wire,
      [this, peer](absl::Status status) {
        if (status.ok()) return;
        connector_.Post([this, peer, status] {
          Break(peer,
                absl::UnavailableError(
                    absl::StrCat("compute node ", options_.name, " failed: ", status.message())),
                /*unreachable=*/true);
        });
      },
      seal.get());
}

void DataPlaneExecutor::Connect() {
  auto peer = transport_->Connect(options_.address);
  const std::string secret = peer.ok() ? transport_->PeerSecret(*peer) : std::string();
  std::unique_lock<std::mutex> send(send_mu_);
  std::deque<Waiting> waiting;
  bool connected = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    connecting_ = false;
    last_connect_ = peer.status();
    waiting.swap(waiting_);
    if (peer.ok() && !stop_) {
      peer_ = *peer;
      seal_ = std::make_shared<FrameSeal>(options_.transport.auth_key, secret);
      connected = true;
      lost_ = false;
      ++stats_.connects;
    } else if (!peer.ok()) {
      lost_ = true;
    }
  }
  if (connected) {
    for (Waiting& w : waiting) SendLocked(*peer, std::move(w.plan), std::move(w.sink));
    return;
  }
  send.unlock();
  if (peer.ok()) transport_->Disconnect(*peer);  // stopping meanwhile
  const absl::Status error =
      peer.ok() ? absl::CancelledError("the executor is shutting down")
                : absl::UnavailableError(absl::StrCat("compute node ", options_.name,
                                                      " cannot be reached at ", options_.address,
                                                      ": ", peer.status().message()));
  if (!peer.ok()) LOG(WARNING) << error.message();
  std::lock_guard<std::mutex> complete(complete_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.failed += waiting.size();
  }
  for (Waiting& w : waiting) w.sink(FailedStep(w.plan->step_id, error, /*unreachable=*/!peer.ok()));
}

void DataPlaneExecutor::Break(PeerId peer, const absl::Status& error, bool unreachable,
                              std::optional<absl::Time> if_deadline) {
  std::deque<Sent> failed;
  {
    std::lock_guard<std::mutex> complete(complete_mu_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!peer_ || *peer_ != peer) return;
      if (if_deadline && deadline_at_ != *if_deadline) return;  // answered meanwhile
      peer_.reset();
      if (unreachable) lost_ = true;
      failed.swap(sent_);
      deadline_at_ = absl::InfiniteFuture();
      stats_.failed += failed.size();
    }
    LOG(ERROR) << "step channel to " << options_.name << " broken (" << failed.size()
               << " step(s) unanswered): " << error;
    for (Sent& s : failed) s.sink(FailedStep(s.step_id, error, unreachable));
  }
  // The transport may still hold the endpoint (a bad result, a missed deadline).
  connector_.Post([this, peer] { transport_->Disconnect(peer); });
}

void DataPlaneExecutor::Abandon(const absl::Status& why) {
  std::optional<PeerId> peer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    peer = peer_;
  }
  if (peer) Break(*peer, why, /*unreachable=*/true);
}

void DataPlaneExecutor::WatchDeadlineLocked() {
  if (stop_ || deadline_at_ == absl::InfiniteFuture() || check_at_ <= deadline_at_) return;
  check_at_ = deadline_at_;
  connector_.RunAt(deadline_at_, [this] { CheckDeadline(); });
}

void DataPlaneExecutor::CheckDeadline() {
  std::unique_lock<std::mutex> lock(mu_);
  check_at_ = absl::InfiniteFuture();
  if (stop_ || !peer_) return;
  if (absl::Now() <= deadline_at_) {  // answered meanwhile, or nothing in flight
    WatchDeadlineLocked();
    return;
  }
  const PeerId peer = *peer_;
  const absl::Time missed = deadline_at_;
  lock.unlock();
  Break(peer,
        absl::DeadlineExceededError(absl::StrCat("compute node ", options_.name,
                                                 " did not finish a step within ",
                                                 absl::FormatDuration(options_.step_deadline))),
        /*unreachable=*/false, missed);
}

std::span<uint8_t> DataPlaneExecutor::Place(PeerId, std::span<const uint8_t>, size_t) {
  return {};  // results are small: the transport keeps them until Deliver
}

void DataPlaneExecutor::Deliver(PeerId from, std::span<const uint8_t> header,
                                std::span<const uint8_t> payload, absl::Status status) {
  std::shared_ptr<FrameSeal> seal;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!peer_ || *peer_ != from) return;  // a connection already given up
    seal = seal_;
  }
  auto result = [&]() -> absl::StatusOr<StepResult> {
    control::StepResult wire;
    uint64_t step_id = 0;
    RETURN_IF_ERROR(
        ReadMessageFrame(header, payload, status, FrameKind::kResult, &wire, &step_id, seal.get()));
    if (wire.step_id() != step_id) {
      return absl::DataLossError(absl::StrCat("the result of step ", wire.step_id(),
                                              " came in a frame of step ", step_id));
    }
    return FromProto(wire);
  }();
  if (result.ok()) {
    std::lock_guard<std::mutex> complete(complete_mu_);
    Sent done;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!peer_ || *peer_ != from) return;  // a connection already given up
      if (!sent_.empty() && sent_.front().step_id == result->step_id) {
        done = std::move(sent_.front());
        sent_.pop_front();
        deadline_at_ =
            sent_.empty() ? absl::InfiniteFuture() : absl::Now() + options_.step_deadline;
        WatchDeadlineLocked();
        ++stats_.answered;
      } else {
        result = absl::DataLossError(absl::StrCat(
            "compute node ", options_.name, " answered step ", result->step_id, " where step ",
            sent_.empty() ? std::string("none") : absl::StrCat(sent_.front().step_id), " was due"));
      }
    }
    if (result.ok()) {
      done.sink(std::move(*result));
      return;
    }
  }
  Break(from,
        absl::DataLossError(absl::StrCat("compute node ", options_.name,
                                         " sent a bad result: ", result.status().message())),
        /*unreachable=*/false);
}

}  // namespace strata
