// A remote compute node as a StepExecutor over its step channel on the data plane
// (compute_node/step_channel.h): each plan is one frame out, each result one frame back,
// with no thread of this executor's own in between. Submit sends on the caller's thread;
// results arrive on the transport's thread, which hands each to its sink in order.
//
// The same promises as the gRPC stream (grpc_executor.h):
//   - plans go out as soon as they are submitted, while earlier ones still run, and results
//     come back in submission order, exactly one per plan;
//   - each step has a deadline, counted from when it becomes the oldest unanswered one: a
//     node that does not answer in time loses its connection and its steps fail with
//     DeadlineExceeded;
//   - a broken connection (the node died: the transport detects a dead peer over tcp and
//     InfiniBand; a send failed; a result that does not match the oldest plan, does not
//     parse or does not open) fails every plan sent on it, in order, and the next plan
//     connects again.
// Where the deployment has a secret (options.transport.auth_key), every frame is sealed
// (FrameSeal, common/protocol/step_frame.h): plans and results are encrypted and
// authenticated, each connection under a key of its own (from Transport::PeerSecret).
// Connecting happens on a thread of its own, never on the submitter's: plans submitted
// meanwhile wait, in order, and fail together if the node cannot be reached. (Probe
// connects on its caller's thread, for the control plane's configuration.)
//
// Thread-safety: thread-safe.
#ifndef STRATA_SERVER_DATA_PLANE_EXECUTOR_H_
#define STRATA_SERVER_DATA_PLANE_EXECUTOR_H_

#include <grpcpp/grpcpp.h>

#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/base/event_loop.h"
#include "common/protocol/step_frame.h"
#include "common/transport/transport.h"
#include "server/step_executor.h"

namespace strata {

struct DataPlaneExecutorOptions {
  std::string name;
  std::string address;  // the node's step channel ("host:port")
  absl::Duration step_deadline = absl::Seconds(60);
  // Must detect dead peers (ErrorMode::kPeer over tcp or InfiniBand) for a dead node to fail
  // its steps at once rather than at their deadline.
  transport::TransportConfig transport;
  // The node's control channel, whose state Reachable reports; null: reachable while the
  // data-plane connection is up, or none has been tried.
  std::shared_ptr<grpc::Channel> control;
};

struct DataPlaneExecutorStats {
  uint64_t connects = 0;  // connections made
  uint64_t sent = 0;      // plans sent
  uint64_t answered = 0;  // results matched to their plan
  uint64_t failed = 0;    // plans completed with an error by this executor
};

class DataPlaneExecutor : public StepExecutor, public transport::MessageHandler {
 public:
  static absl::StatusOr<std::unique_ptr<DataPlaneExecutor>> Create(
      DataPlaneExecutorOptions options);
  // Plans not yet answered complete with an error: none is lost.
  ~DataPlaneExecutor() override;

  std::string name() const override { return options_.name; }
  void Submit(std::shared_ptr<const StepPlan> plan, StepResultSink sink) override;
  // The node's control channel is up and its step channel has not failed since it last
  // connected; while it has, each call tries a connection in the background.
  bool Reachable() override;
  // Plans still waiting for a connection are not among those failed: they go out, or fail,
  // with it.
  void Abandon(const absl::Status& why) override;
  DataPlaneExecutorStats stats() const;
  // Connects now, on the calling thread, unless connected or connecting already: whether
  // the node's step channel can be reached (the control plane falls back to gRPC if not).
  absl::Status Probe();

  std::span<uint8_t> Place(transport::PeerId from, std::span<const uint8_t> header,
                           size_t payload_bytes) override;
  void Deliver(transport::PeerId from, std::span<const uint8_t> header,
               std::span<const uint8_t> payload, absl::Status status) override;

 private:
  struct Waiting {
    std::shared_ptr<const StepPlan> plan;
    StepResultSink sink;
  };
  struct Sent {
    uint64_t step_id;
    StepResultSink sink;
  };

  explicit DataPlaneExecutor(DataPlaneExecutorOptions options);
  // Sends `plan` on `peer`, recording it as unanswered. Holds send_mu_.
  void SendLocked(transport::PeerId peer, std::shared_ptr<const StepPlan> plan,
                  StepResultSink sink);
  // Connector thread: connects, then sends what waited, or fails it.
  void Connect();
  // Posts a Connect unless one is under way or the executor stops. Holds mu_.
  void ConnectSoonLocked();
  // The connection `peer` is broken: every plan sent on it fails with `error`, oldest
  // first. Nothing if `peer` is no longer the open connection, or (`if_deadline`) if the
  // oldest plan's deadline is no longer that one (a result came meanwhile).
  void Break(transport::PeerId peer, const absl::Status& error, bool unreachable,
             std::optional<absl::Time> if_deadline = std::nullopt);
  // The oldest plan's deadline is looked at on the connector thread when it is due, by a
  // timer, not by a thread that looks every so often: schedules that unless a look is due
  // by then already (a result that came since only moves the deadline later). Holds mu_.
  void WatchDeadlineLocked();
  // Connector thread, at a deadline: breaks the connection if the oldest plan missed it,
  // else watches the deadline it has now.
  void CheckDeadline();

  DataPlaneExecutorOptions options_;
  std::unique_ptr<transport::Transport> transport_;
  EventLoop connector_{"exec-connect"};

  // Lock order: complete_mu_, then send_mu_ (a sink may submit again), then mu_. Nothing
  // waits for complete_mu_ while holding send_mu_: a send's completion, which may run
  // inside Send, hands failures to the connector thread.
  std::mutex send_mu_;      // keeps the order of sends and of their records in sent_
  std::mutex complete_mu_;  // keeps the order in which sinks run
  mutable std::mutex mu_;
  std::optional<transport::PeerId> peer_;  // the open connection
  std::shared_ptr<FrameSeal> seal_;        // peer_'s frames' seal (step_frame.h)
  bool connecting_ = false;
  // The last connection died with its peer, or the last attempt failed: Reachable says no
  // until a connection works again (the control channel may not know yet).
  bool lost_ = false;
  absl::Status last_connect_;  // the last connection attempt's outcome
  bool stop_ = false;
  std::deque<Waiting> waiting_;  // submitted while not connected, oldest first
  std::deque<Sent> sent_;        // sent on peer_, unanswered, oldest first
  absl::Time deadline_at_ = absl::InfiniteFuture();
  absl::Time check_at_ = absl::InfiniteFuture();  // the next look at deadline_at_ scheduled
  DataPlaneExecutorStats stats_;
};

}  // namespace strata

#endif  // STRATA_SERVER_DATA_PLANE_EXECUTOR_H_
