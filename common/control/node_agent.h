// A node's side of the control plane: registers with the scheduler and keeps sending
// heartbeats, so that the scheduler knows the node is alive and ready.
//
// Registration is retried until it succeeds (the scheduler may start later, or still count
// an earlier incarnation of this node alive until its heartbeat deadline). A heartbeat
// answered "unknown" (the scheduler restarted, or declared this node dead) triggers a new
// registration. Every RPC has a deadline and carries the deployment's credentials; a
// scheduler that refuses them (another deployment's secret) is a fatal error.
//
// Thread-safety: Start/Stop from one thread; the agent runs its own thread.
#ifndef STRATA_COMMON_CONTROL_NODE_AGENT_H_
#define STRATA_COMMON_CONTROL_NODE_AGENT_H_

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/time/time.h"
#include "common/control/cluster_auth.h"
#include "proto/control.grpc.pb.h"

namespace strata {

class NodeAgent {
 public:
  // `status` is called before each heartbeat to describe the node.
  NodeAgent(std::string scheduler_address, control::NodeInfo info,
            std::function<control::NodeStatus()> status, std::shared_ptr<const ClusterAuth> auth);
  ~NodeAgent();

  void Start();
  void Stop();

  // Blocks until registered or `timeout` passes.
  bool WaitRegistered(absl::Duration timeout);
  uint64_t epoch() const { return epoch_.load(); }
  uint64_t node_id() const { return node_id_.load(); }
  // Set by the node when registration was refused for good (e.g. version mismatch).
  std::string fatal_error() const;

 private:
  void Run();
  bool Register();

  std::string scheduler_address_;
  control::NodeInfo info_;
  std::function<control::NodeStatus()> status_;
  std::shared_ptr<const ClusterAuth> auth_;
  std::unique_ptr<control::Scheduler::Stub> stub_;
  std::string session_token_;  // agent thread only

  std::atomic<uint64_t> epoch_{0};
  std::atomic<uint64_t> node_id_{0};
  std::atomic<bool> registered_{false};
  absl::Duration interval_ = absl::Milliseconds(500);

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::string fatal_error_;
  std::thread thread_;
};

}  // namespace strata

#endif  // STRATA_COMMON_CONTROL_NODE_AGENT_H_
