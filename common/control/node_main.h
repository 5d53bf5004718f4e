// The skeleton every node process shares once its core is built: the control-plane gRPC
// server with the deployment's credentials, grpc.health.v1 for Kubernetes' probes, the
// Prometheus endpoint, registration and heartbeats with the scheduler, and the wait for a
// shutdown signal. compute_node/main.cc and memory_node/main.cc build their core and
// service from their flags and hand both to ServeNode.
//
// Health: service "" is SERVING while the process is up; "strata.ready" follows the
// node's status (registered and configured), refreshed every 200 ms.
//
// Thread-safety: ServeNode runs on the main thread and returns when the process should exit.
#ifndef STRATA_COMMON_CONTROL_NODE_MAIN_H_
#define STRATA_COMMON_CONTROL_NODE_MAIN_H_

#include <functional>
#include <memory>
#include <string>

#include "common/control/cluster_auth.h"
#include "common/metrics/metrics.h"
#include "proto/control.grpc.pb.h"

namespace strata {

// A node's identity for the scheduler with this build's protocol and build versions set.
control::NodeInfo MakeNodeInfo(control::NodeRole role, const std::string& name,
                               const std::string& cpu_isa);

struct NodeProcess {
  std::string host;       // control-plane and metrics listen address
  int port = 0;           // control port (0: any free port)
  int metrics_port = -1;  // -1: no /metrics, 0: any free port
  // Scheduler to register with; empty: standalone, configured by direct RPC (benchmarks).
  std::string scheduler;
  int max_message_bytes = 0;  // 0: gRPC's default
  std::shared_ptr<const ClusterAuth> auth;
  std::shared_ptr<metrics::MetricsRegistry> registry;
  grpc::Service* service = nullptr;  // the node's control service, not owned
  // The node's identity (MakeNodeInfo, plus role-specific fields); ServeNode adds the
  // control address once it listens.
  control::NodeInfo info;
  // The node's status for heartbeats and the readiness probe. Must not block on a step.
  std::function<control::NodeStatus()> status;
  // What the start-up line adds after the addresses (kernels, threads, cores).
  std::string description;
};

// Serves until a shutdown signal or a fatal answer from the scheduler (another protocol
// version, refused credentials). Returns the process's exit code: 0 after a signal, 1 when
// it cannot listen or the scheduler refused it for good.
int ServeNode(NodeProcess node);

}  // namespace strata

#endif  // STRATA_COMMON_CONTROL_NODE_MAIN_H_
