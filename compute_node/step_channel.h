// The compute node's step channel: step plans in and results out over the data plane
// (docs/architecture.md, "The step channel"), instead of the RunSteps gRPC stream.
//
// A served token used to cross eight threads between the node's result and its next
// plan: gRPC's pollers on both sides, the scheduler's stream writer and reader, and the
// node's plan reader and result writer. On a machine whose cores the step's team fills,
// every one of those wake-ups waits for a core (docs/benchmarks.md). Here a plan is one
// data-plane frame that the node's transport thread hands straight to the step thread's
// queue, and the step thread sends its result itself.
//
// Each connection is one stream of plans, as a RunSteps call is: a session with its own
// PlanQueue and step thread, which runs `run` until the connection closes. The scheduler
// connects (server/data_plane_executor.h); the transport's handshake checks the
// deployment's data-plane key, so only the deployment's own processes get in.
//
// Framing (common/transport/frame.h): a kPlan frame carries a serialized
// strata.control.StepPlan, a kResult frame a serialized strata.control.StepResult, each
// under the usual 64-byte header with its checksum. Where the deployment has a secret
// (options.transport.auth_key), both are sealed (FrameSeal, common/protocol/step_frame.h):
// a plan that is not sealed, or does not open, is refused like a bad one. Every frame that arrives
// is answered by exactly one result, in arrival order: a plan that cannot be read (a bad header,
// checksum or proto, or a receive that failed) gets a result with its step id and the
// error, without running. The sender matches results to plans in order and treats any
// mismatch as a broken connection.
//
// A connection that closes (the scheduler died or gave up on a step) aborts its session:
// plans still queued are answered Cancelled without running, the running ones finish.
//
// Thread-safety: thread-safe. `prepare` runs on the transport thread (or on a step thread
// that took a new connection's first frame while it progressed the transport), `run` on
// the session's thread.
#ifndef STRATA_COMPUTE_NODE_STEP_CHANNEL_H_
#define STRATA_COMPUTE_NODE_STEP_CHANNEL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/protocol/step_frame.h"
#include "common/transport/transport.h"
#include "compute_node/step_pipeline.h"

namespace strata {

struct StepChannelOptions {
  transport::TransportConfig transport;
  std::string listen_address = "127.0.0.1:0";
  // Called with a session's queue before any plan arrives in it (ComputeNode::PrepareQueue).
  // May be empty.
  std::function<void(PlanQueue&)> prepare;
  // Runs plans from the queue until it is closed and drained (ComputeNode::RunPipelined).
  std::function<void(PlanQueue&)> run;
  // How long the step thread, idle with no plan queued, progresses the channel's transport
  // itself before it sleeps until the transport thread hands it a plan (PlanQueue::SetPoll).
  // Zero: it sleeps at once. Rotational replicas never wait in Pop (ComputeNode::RunRotated
  // takes plans without waiting), so it does not apply to them.
  absl::Duration plan_spin = absl::Microseconds(500);
};

struct StepChannelStats {
  uint64_t sessions = 0;  // connections served since start
  uint64_t plans = 0;     // plans queued to run
  uint64_t refused = 0;   // frames answered with an error without running
  uint64_t results = 0;   // results sent
  // Frames that a session's step thread (the thread waiting in its queue's Pop) received
  // itself, progressing the transport while it waited for a plan (plan_spin), rather than
  // the transport thread.
  uint64_t polled = 0;
};

class StepChannel : public transport::MessageHandler {
 public:
  static absl::StatusOr<std::unique_ptr<StepChannel>> Create(StepChannelOptions options);
  // Closes every session (running plans finish first), then the transport.
  ~StepChannel() override;

  // Where the channel listens ("host:port"), reported at registration.
  const std::string& address() const { return address_; }
  StepChannelStats stats() const;

  std::span<uint8_t> Place(transport::PeerId from, std::span<const uint8_t> header,
                           size_t payload_bytes) override;
  void Deliver(transport::PeerId from, std::span<const uint8_t> header,
               std::span<const uint8_t> payload, absl::Status status) override;

 private:
  struct Session {
    transport::PeerId peer = 0;
    std::shared_ptr<FrameSeal> seal;  // its connection's seal (step_frame.h)
    PlanQueue queue;
    std::thread thread;
    std::atomic<bool> finished{false};
  };

  explicit StepChannel(StepChannelOptions options) : options_(std::move(options)) {}
  // The open session of `peer`, started on its connection (or its first frame, should that
  // come first). Null once the channel is closing, and for a connection that has closed:
  // a frame finished receiving after the close must not start a session nobody ends.
  // Holds mu_.
  Session* SessionLocked(transport::PeerId peer);
  // The connection of `peer` is gone: its session stops taking plans.
  void EndSession(transport::PeerId peer);
  // Sends `result` to `peer` as a kResult frame, sealed by `seal` (any thread).
  void SendResult(transport::PeerId peer, const StepResult& result, FrameSeal* seal);
  // Joins the threads of ended sessions that have finished. Holds mu_.
  void ReapLocked();

  StepChannelOptions options_;
  std::unique_ptr<transport::Transport> transport_;
  std::string address_;

  mutable std::mutex mu_;
  bool closing_ = false;
  std::map<transport::PeerId, std::unique_ptr<Session>> sessions_;  // open connections
  std::vector<std::unique_ptr<Session>> ended_;                     // threads still to join
  std::set<transport::PeerId> closed_;  // connections that closed (ids are never reused)
  StepChannelStats stats_;
};

}  // namespace strata

#endif  // STRATA_COMPUTE_NODE_STEP_CHANNEL_H_
