// Memory nodes for benchmarks: started as real memory_node processes (standalone, without
// a scheduler) and configured by RPC, as the control plane would.
#ifndef STRATA_COMPUTE_NODE_BENCH_MEMORY_NODES_H_
#define STRATA_COMPUTE_NODE_BENCH_MEMORY_NODES_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/control/cluster_auth.h"
#include "common/model/model_config.h"
#include "common/process/supervisor.h"
#include "compute_node/remote_attention.h"
#include "proto/control.pb.h"

namespace strata::bench {

// The memory_node binary beside this benchmark in bazel-bin.
std::string MemoryNodeBinary();

// The benchmark deployment's credentials: a random secret made once per process in a private
// temporary directory. Memory nodes get ClusterSecretFlag(); the benchmark's own calls and
// data-plane connections use BenchAuth().
std::shared_ptr<const ClusterAuth> BenchAuth();
std::string ClusterSecretFlag();

// A TCP port that was free a moment ago.
int FreePort();

struct StartedMemoryNode {
  std::string control;  // host:port of its gRPC service
  std::string data;     // its data-plane address
};

// Configures the memory node at `control` (retrying until it answers) as `pool` with
// `slots` KV slots for the model.
absl::StatusOr<StartedMemoryNode> ConfigureMemoryNode(const std::string& control, uint32_t pool,
                                                      const ModelConfig& model, int64_t slots);

control::NodeStatus MemoryNodeStatus(const std::string& control);

// Starts `count` memory nodes (the memory_node executable `binary`) on loopback with UCX `tls`,
// configured with `slots` each; they stop with `supervisor`. With `pin`, each runs on its own share
// of this process's cores (SplitCpus, as the launcher does; `pin_cpus` instead where not empty)
// with a thread per core; otherwise each gets the cores divided by `count` in threads, placed by
// the kernel. `args` are added to each node's flags.
absl::StatusOr<std::vector<StartedMemoryNode>> StartMemoryNodes(
    Supervisor& supervisor, const std::string& binary, int count, const std::string& tls, bool pin,
    const ModelConfig& model, int64_t slots, std::vector<std::string> args = {},
    const std::vector<int>& pin_cpus = {});

// The addresses RemoteAttention needs.
std::vector<MemoryNodeAddress> Addresses(const std::vector<StartedMemoryNode>& nodes);

}  // namespace strata::bench

#endif  // STRATA_COMPUTE_NODE_BENCH_MEMORY_NODES_H_
