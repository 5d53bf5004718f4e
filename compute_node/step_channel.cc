#include "compute_node/step_channel.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/base/thread_name.h"
#include "common/base/wait_policy.h"
#include "common/protocol/step_frame.h"
#include "common/protocol/step_proto.h"
#include "common/transport/frame.h"
#include "proto/control.pb.h"

namespace strata {

using transport::FrameKind;
using transport::PeerId;

absl::StatusOr<std::unique_ptr<StepChannel>> StepChannel::Create(StepChannelOptions options) {
  if (!options.run) return absl::InvalidArgumentError("a step channel needs a plan runner");
  auto channel = std::unique_ptr<StepChannel>(new StepChannel(std::move(options)));
  // Plans are held by the transport (Place places nothing): no larger claim is taken.
  channel->options_.transport.max_held_bytes =
      std::min<uint64_t>(channel->options_.transport.max_held_bytes, kMaxStepFrameBytes);
  ASSIGN_OR_RETURN(channel->transport_, transport::Transport::Create(channel->options_.transport));
  StepChannel* self = channel.get();
  channel->transport_->SetHandler(transport::kFrameTag, self);
  channel->transport_->SetPeerHandler(
      [self](PeerId peer, transport::PeerEvent event, const absl::Status& why) {
        if (event == transport::PeerEvent::kConnected) {
          std::lock_guard<std::mutex> lock(self->mu_);
          self->SessionLocked(peer);
          return;
        }
        LOG(INFO) << "step channel: the scheduler's connection " << peer
                  << " closed: " << why.message();
        self->EndSession(peer);
      });
  ASSIGN_OR_RETURN(channel->address_,
                   channel->transport_->Listen(channel->options_.listen_address));
  return channel;
}

StepChannel::~StepChannel() {
  std::vector<std::unique_ptr<Session>> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
    for (auto& [peer, session] : sessions_) all.push_back(std::move(session));
    sessions_.clear();
    for (auto& session : ended_) all.push_back(std::move(session));
    ended_.clear();
  }
  for (auto& session : all) {
    session->queue.Abort();
    session->queue.Close();
  }
  // The sessions' threads send their last results through the transport: it goes after.
  for (auto& session : all) session->thread.join();
  transport_.reset();
}

StepChannelStats StepChannel::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

StepChannel::Session* StepChannel::SessionLocked(PeerId peer) {
  if (closing_ || closed_.count(peer) > 0) return nullptr;
  auto it = sessions_.find(peer);
  if (it != sessions_.end()) return it->second.get();
  ReapLocked();
  auto session = std::make_unique<Session>();
  session->peer = peer;
  session->seal =
      std::make_shared<FrameSeal>(options_.transport.auth_key, transport_->PeerSecret(peer));
  if (options_.prepare) options_.prepare(session->queue);
  transport::Transport* transport = transport_.get();
  session->queue.SetPoll(
      [transport](absl::FunctionRef<bool()> ready, absl::Time deadline) {
        return transport->ProgressUntil(ready, deadline);
      },
      options_.plan_spin);
  Session* s = session.get();
  // A service thread, whichever thread starts it: the transport's, or a step thread that
  // took the connection's first frame while it progressed the transport (plan_spin).
  ServiceThreadScope service;
  s->thread = std::thread([this, s] {
    SetCurrentThreadName("step-session");
    options_.run(s->queue);
    s->finished.store(true);
  });
  sessions_[peer] = std::move(session);
  ++stats_.sessions;
  return s;
}

void StepChannel::EndSession(PeerId peer) {
  std::lock_guard<std::mutex> lock(mu_);
  closed_.insert(peer);
  auto it = sessions_.find(peer);
  if (it == sessions_.end()) return;
  Session* s = it->second.get();
  // Nobody waits for this connection's results any more.
  s->queue.Abort();
  s->queue.Close();
  ended_.push_back(std::move(it->second));
  sessions_.erase(it);
}

void StepChannel::ReapLocked() {
  for (auto it = ended_.begin(); it != ended_.end();) {
    if ((*it)->finished.load()) {
      (*it)->thread.join();
      it = ended_.erase(it);
    } else {
      ++it;
    }
  }
}

std::span<uint8_t> StepChannel::Place(PeerId, std::span<const uint8_t>, size_t) {
  return {};  // plans are small: the transport keeps them until Deliver
}

void StepChannel::Deliver(PeerId from, std::span<const uint8_t> header,
                          std::span<const uint8_t> payload, absl::Status status) {
  // Whatever is wrong, the frame is answered in its turn: with the step id its header
  // names, or 0 when the header cannot be read (the scheduler then drops the connection).
  std::shared_ptr<FrameSeal> seal;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Session* session = SessionLocked(from);
    // Closing, or the connection has closed: nobody would read the answer.
    if (session == nullptr) return;
    seal = session->seal;
  }
  uint64_t step_id = 0;
  auto plan = [&]() -> absl::StatusOr<StepPlan> {
    control::StepPlan wire;
    RETURN_IF_ERROR(
        ReadMessageFrame(header, payload, status, FrameKind::kPlan, &wire, &step_id, seal.get()));
    ASSIGN_OR_RETURN(StepPlan parsed, FromProto(wire));
    if (parsed.step_id != step_id) {
      return absl::InvalidArgumentError(
          absl::StrCat("step plan ", parsed.step_id, " came in a frame of step ", step_id));
    }
    return parsed;
  }();
  QueuedPlan queued;
  if (plan.ok()) {
    queued.plan = std::move(*plan);
  } else {
    LOG(ERROR) << "step channel: refused a plan from connection " << from << ": " << plan.status();
    StepResult refused;
    refused.step_id = step_id;
    refused.status = plan.status();
    queued.answer = std::move(refused);
  }
  queued.done = [this, from, seal](StepResult result) { SendResult(from, result, seal.get()); };
  std::lock_guard<std::mutex> lock(mu_);
  Session* session = SessionLocked(from);
  if (session == nullptr) return;
  ++(plan.ok() ? stats_.plans : stats_.refused);
  // The session's step thread, waiting for a plan, received this one itself.
  if (session->queue.PollingOn(std::this_thread::get_id())) ++stats_.polled;
  session->queue.Push(std::move(queued));
}

void StepChannel::SendResult(PeerId peer, const StepResult& result, FrameSeal* seal) {
  control::StepResult wire;
  ToProto(result, &wire);
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.results;
  }
  // A connection that is gone fails the send; its session is being aborted meanwhile.
  SendMessageFrame(*transport_, peer, FrameKind::kResult, result.step_id, wire, {}, seal);
}

}  // namespace strata
