#include "compute_node/bench/memory_nodes.h"

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/cpu_affinity.h"
#include "common/base/logging.h"
#include "common/base/wait_policy.h"
#include "proto/control.grpc.pb.h"

namespace strata::bench {

std::string MemoryNodeBinary() {
  std::filesystem::path self = std::filesystem::canonical("/proc/self/exe");
  return (self.parent_path() / "../../memory_node/memory_node").lexically_normal().string();
}

namespace {

struct Credentials {
  std::string secret_file;
  std::shared_ptr<const ClusterAuth> auth;
};

const Credentials& BenchCredentials() {
  static const Credentials* credentials = [] {
    char dir[] = "/tmp/strata-bench-XXXXXX";
    CHECK(mkdtemp(dir) != nullptr) << "mkdtemp failed";
    const std::string file = std::string(dir) + "/cluster-secret";
    CHECK_OK(WriteClusterSecret(file));
    auto auth = ClusterAuth::Load({.secret_file = file});
    CHECK_OK(auth.status());
    return new Credentials{file, *auth};
  }();
  return *credentials;
}

}  // namespace

std::shared_ptr<const ClusterAuth> BenchAuth() { return BenchCredentials().auth; }

std::string ClusterSecretFlag() {
  return "--cluster_secret_file=" + BenchCredentials().secret_file;
}

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(addr);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length);
  close(fd);
  return ntohs(addr.sin_port);
}

control::NodeStatus MemoryNodeStatus(const std::string& control) {
  auto stub = control::MemoryNode::NewStub(BenchAuth()->CreateChannel(control));
  grpc::ClientContext context;
  BenchAuth()->Attach(&context);
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  control::HealthResponse response;
  stub->Health(&context, control::HealthRequest(), &response);
  return response.status();
}

absl::StatusOr<StartedMemoryNode> ConfigureMemoryNode(const std::string& control, uint32_t pool,
                                                      const ModelConfig& c, int64_t slots) {
  auto stub = control::MemoryNode::NewStub(BenchAuth()->CreateChannel(control));
  for (int attempt = 0; attempt < 300; ++attempt) {
    grpc::ClientContext context;
    BenchAuth()->Attach(&context);
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
    control::HealthResponse health;
    if (!stub->Health(&context, control::HealthRequest(), &health).ok()) {
      absl::SleepFor(absl::Milliseconds(100));
      continue;
    }
    control::MemoryConfig config;
    config.set_epoch(1);
    config.set_pool_index(pool);
    control::ModelShape* m = config.mutable_model();
    m->set_name("bench");
    m->set_num_layers(c.num_layers);
    m->set_num_heads(c.num_heads);
    m->set_num_kv_heads(c.num_kv_heads);
    m->set_head_dim(c.head_dim);
    m->set_kv_dtype("bf16");
    config.set_num_slots(slots);
    grpc::ClientContext configure;
    BenchAuth()->Attach(&configure);
    configure.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(600)));
    control::MemoryConfigAck ack;
    grpc::Status status = stub->Configure(&configure, config, &ack);
    if (!status.ok()) return absl::InternalError(status.error_message());
    return StartedMemoryNode{control, health.node().data_address()};
  }
  return absl::DeadlineExceededError("memory node at " + control + " did not answer");
}

absl::StatusOr<std::vector<StartedMemoryNode>> StartMemoryNodes(
    Supervisor& supervisor, const std::string& binary, int count, const std::string& tls, bool pin,
    const ModelConfig& model, int64_t slots, std::vector<std::string> args,
    const std::vector<int>& pin_cpus) {
  if (!std::filesystem::exists(binary)) {
    return absl::NotFoundError("no memory_node binary at " + binary +
                               " (build //memory_node:memory_node)");
  }
  const bool shared_memory = tls.find("sm") != std::string::npos;
  const std::vector<std::vector<int>> cpus =
      pin ? SplitCpus(pin_cpus.empty() ? AllowedCpus() : pin_cpus, count)
          : std::vector<std::vector<int>>(count);
  std::vector<StartedMemoryNode> nodes;
  for (int i = 0; i < count; ++i) {
    const int port = FreePort();
    const int node_threads =
        cpus[i].empty() ? std::max(1, DefaultTeamSize() / count) : static_cast<int>(cpus[i].size());
    ChildSpec spec{absl::StrCat("memory-", i),
                   {binary, "--scheduler=", absl::StrCat("--port=", port),
                    absl::StrCat("--name=memory-", i), "--ucx_tls=" + tls, "--ucx_net_devices=lo",
                    shared_memory ? "--transport_error_mode=none" : "--transport_error_mode=peer",
                    absl::StrCat("--threads=", node_threads), ClusterSecretFlag()},
                   // The bench process (the compute side) runs on every core: shared.
                   OpenMpEnvironment(node_threads, CoreShare::kShared)};
    if (!cpus[i].empty()) spec.argv.push_back("--cpus=" + FormatCpuList(cpus[i]));
    spec.argv.insert(spec.argv.end(), args.begin(), args.end());
    auto pid = supervisor.Spawn(spec);
    if (!pid.ok()) return pid.status();
    auto node = ConfigureMemoryNode(absl::StrCat("127.0.0.1:", port), static_cast<uint32_t>(i),
                                    model, slots);
    if (!node.ok()) return node.status();
    nodes.push_back(*node);
  }
  return nodes;
}

std::vector<MemoryNodeAddress> Addresses(const std::vector<StartedMemoryNode>& nodes) {
  std::vector<MemoryNodeAddress> out;
  for (size_t i = 0; i < nodes.size(); ++i) {
    out.push_back({PoolIndex(static_cast<uint32_t>(i)), absl::StrCat("memory-", i), nodes[i].data});
  }
  return out;
}

}  // namespace strata::bench
