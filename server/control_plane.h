// The scheduler's side of the control plane (proto/control.proto, service Scheduler): node
// registration, heartbeats, liveness, and wiring nodes into the Scheduler.
//
// Register validates a node (protocol version, model shape, kernel path and the
// fingerprints of its kernels' results: kernel_agreement.h) and refuses a
// mismatch with FAILED_PRECONDITION and a reason. A thread of its own then configures it: a
// compute node gets the memory-node list (none in co-located mode, where its own KV cache
// becomes a pool), a memory node gets the model shape and its slot count. A memory node's
// pool comes alive in the scheduler (and the node counts as configured) only once every
// live compute node has taken a list that names it, so no plan places KV on a pool its
// compute node has not heard of. A node whose
// heartbeats stop for `heartbeat_timeout` is declared dead: its executor or pool is taken
// out of the scheduler (requests move elsewhere). A dead node that comes back registers
// again and is re-admitted, empty. A registration under the name of a node that is still
// alive is refused (ALREADY_EXISTS) until that node misses its heartbeat deadline, so nobody
// can push a live node out by registering in its place.
//
// Every call in both directions carries options.auth's credentials; Register and Heartbeat
// refuse calls without them (UNAUTHENTICATED).
//
// Thread-safety: gRPC handlers, the configuration threads and three event loops
// (common/base/event_loop.h) share state under a mutex. Each node is configured on a thread
// of its own (the calls block, and a memory node's takes minutes where its KV cache is large:
// about 3 s per GiB is touched), so nodes configure at the same time and a slow one holds up
// no other; a node declared dead, or the plane stopping, cancels its Configure call. The
// broadcast loop tells the configured compute nodes of every change to the memory nodes (or
// the rotation's departures), one broadcast at a time, each node on a thread of its own (one
// that hangs delays no other's news); the monitor loop sleeps until the next heartbeat
// deadline, so a long configuration never delays finding a dead node.
#ifndef STRATA_SERVER_CONTROL_PLANE_H_
#define STRATA_SERVER_CONTROL_PLANE_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "common/base/event_loop.h"
#include "common/control/cluster_auth.h"
#include "common/transport/transport.h"
#include "proto/control.grpc.pb.h"
#include "server/rotation_group.h"
#include "server/scheduler.h"

namespace strata {

struct ControlPlaneOptions {
  uint64_t epoch = 0;
  control::ModelShape model;  // what compute nodes must have loaded
  int expected_compute_nodes = 1;
  int expected_memory_nodes = 0;  // 0: co-located mode
  absl::Duration heartbeat_interval = absl::Milliseconds(500);
  absl::Duration heartbeat_timeout = absl::Seconds(3);
  absl::Duration step_deadline = absl::Seconds(60);
  // How long a live compute node may take to take a new memory-node list, its attempts
  // together (each at most 5 s, retried with backoff): one that heartbeats but never
  // answers, or keeps failing, is then taken out (it registers again), because while it
  // lives no memory node it has not heard of is announced.
  absl::Duration list_deadline = absl::Seconds(30);
  // Disk tiers: how long a batch of loads may take before its requests recompute instead
  // (saves and drops, which nobody waits for, take step_deadline).
  absl::Duration disk_load_deadline = absl::Seconds(2);
  // Admit nodes whose kernel path or kernel fingerprints differ from the live nodes'
  // (kernel_agreement.h), giving up bit-identical results. Off by default.
  bool allow_mixed_isa = false;
  // Compute nodes that offer a step channel (NodeInfo::step_address) take their plans over
  // it, through this transport (its auth_key the deployment's data-plane key); false, or a
  // node without one: over the RunSteps gRPC stream.
  bool data_plane_steps = true;
  transport::TransportConfig step_transport;
  // Credentials every call in and out must carry (required).
  std::shared_ptr<const ClusterAuth> auth;
  // Rotational pipelining: compute nodes join this group (the scheduler's executor of index
  // rotation_executor, alive while two replicas are) instead of becoming executors.
  std::shared_ptr<RotationGroup> rotation;
  int rotation_executor = -1;
};

struct NodeView {
  uint64_t id = 0;
  control::NodeInfo info;
  bool alive = false;
  bool configured = false;
  absl::Time last_seen;
  control::NodeStatus status;
};

class ControlPlane final : public control::Scheduler::Service {
 public:
  ControlPlane(Scheduler* scheduler, ControlPlaneOptions options);
  ~ControlPlane() override;
  void Stop();

  grpc::Status Register(grpc::ServerContext* context, const control::RegisterRequest* request,
                        control::RegisterResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context, const control::HeartbeatRequest* request,
                         control::HeartbeatResponse* response) override;

  // Every expected node registered, configured and alive, and the scheduler can run.
  bool Ready() const;
  // What /health reports: the deployment became Ready once, and can still serve (a live
  // compute node and a live KV pool), possibly degraded while a node is down.
  bool Serving() const;
  // What keeps the deployment from serving, for /health: the node kinds short of what is
  // expected, with counts, or the KV pools.
  std::string Missing() const;
  std::vector<NodeView> Nodes() const;
  // Asks every live node to exit (best effort, with a deadline).
  void ShutdownNodes();

 private:
  struct Node {
    NodeView view;
    int executor = -1;              // compute nodes
    bool in_rotation = false;       // compute nodes under rotational pipelining
    std::optional<PoolIndex> pool;  // memory nodes, and co-located compute nodes
    // Memory nodes: the node took its configuration (`ack`), so compute nodes are sent its
    // address; and, once every live compute node has taken a list with it, its pool was
    // announced to the scheduler (alive, with the ack's slots and disk tier) and the node
    // counts as configured (view.configured).
    bool kv_ready = false;
    bool announced = false;
    control::MemoryConfigAck ack;
    // Compute nodes: the memory nodes (ids) in the last list the node took.
    std::set<uint64_t> knows;
    std::shared_ptr<grpc::Channel> channel;
    std::string session_token;  // what its heartbeats must present
    // Its Configure call in progress (on its configuration thread, or a broadcast's), which
    // MarkDead and Stop cancel: a node that hangs while it configures would otherwise keep
    // its call open up to the deadline (minutes).
    grpc::ClientContext* configuring = nullptr;
  };
  // A thread that configures one node (ConfigureNode); `done` once it has nothing left to do
  // (guarded by mu_).
  struct Configuration {
    std::thread thread;
    bool done = false;
  };
  // Under mu_: starts node `id`'s configuration on a thread of its own, and joins those
  // that finished.
  void StartConfigurationLocked(uint64_t id);
  // On a configuration thread: configure a node that registered (blocking RPCs).
  void ConfigureNode(uint64_t id);
  // The Configure call of node `id` is about to start with `context` (null: it is over).
  // False if the node is gone or dead, or the plane is stopping: the call must not start.
  bool SetConfiguring(uint64_t id, grpc::ClientContext* context);
  // Coalesces requests to send compute nodes the new list of memory nodes.
  void RequestReconfigure();
  // On monitor_loop_: marks nodes dead whose heartbeat is overdue, then sleeps until the
  // next deadline (a timer, not a tick).
  void CheckHeartbeats();
  void ConfigureCompute(uint64_t id);
  void ConfigureMemory(uint64_t id);
  // On broadcast_loop_: sends every configured compute node the current list, each on a
  // thread of its own.
  void ReconfigureComputeNodes();
  // Sends compute node `id` the current list until it takes it, it dies, the plane stops, or
  // options.list_deadline passes (it is then declared dead).
  void TellComputeNode(uint64_t id, std::shared_ptr<grpc::Channel> channel);
  // True if what compute nodes are configured with changed (a memory node's pool or a
  // rotation replica left): the caller then has them reconfigured (RequestReconfigure).
  bool MarkDead(Node& node, const std::string& why);
  // Lets go of an executor that left the rotation on release_loop_, outside this plane's
  // lock and clear of configurations (a Configure call may take minutes); the group's
  // retire function (set in the constructor) has it destroyed there too, wherever its last
  // copy goes: its destructor fails the plans it holds, and a step channel's may wait for a
  // connection attempt. At shutdown (the loop has quit) it goes at once, on the caller's
  // thread (under this plane's lock where MarkDead calls this).
  void ReleaseLater(std::shared_ptr<StepExecutor> executor);
  void OnPoolDeath(PoolIndex pool);
  // What compute nodes are configured with now; `memory_ids` (may be null) gets the ids of
  // the memory nodes it names.
  control::ComputeConfig ComputeConfigLocked(std::set<uint64_t>* memory_ids = nullptr) const;
  // Announces to the scheduler each memory node's pool that every live compute node knows
  // (has taken a list with it), and no sooner: a plan that placed KV on a pool its compute
  // node has not heard of would fail the step, and that pool's node would be taken for dead.
  void AnnounceKnownPoolsLocked();

  Scheduler* scheduler_;
  ControlPlaneOptions options_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Node> nodes_;
  uint64_t next_id_ = 1;
  std::atomic<bool> reconfigure_pending_{false};
  mutable std::atomic<bool> ever_ready_{false};
  // Memory nodes keep their pool across restarts. A name's pool is reserved in the scheduler
  // when its node is first configured: nodes configure at the same time, and each must be
  // told its index before its call.
  std::map<std::string, PoolIndex> pool_of_name_;
  std::list<Configuration> configurations_;  // guarded by mu_
  bool stop_ = false;  // guarded by mu_; cv_ wakes a retry's back-off when it turns true
  EventLoop broadcast_loop_{"ctl-broadcast"};  // thread names keep 15 bytes
  EventLoop monitor_loop_{"control-monitor"};
  EventLoop release_loop_{"ctl-release"};   // ReleaseLater
  EventLoop::TimerId heartbeat_timer_ = 0;  // monitor_loop_ only
};

}  // namespace strata

#endif  // STRATA_SERVER_CONTROL_PLANE_H_
