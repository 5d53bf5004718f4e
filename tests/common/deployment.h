// A local strata deployment for cross-process tests: generates a tiny model (with a real
// tokenizer) and runs the launcher, which starts the server and nodes on ephemeral ports.
// Tests that use it start processes, so their targets are tagged "exclusive".
#ifndef STRATA_TESTS_COMMON_DEPLOYMENT_H_
#define STRATA_TESTS_COMMON_DEPLOYMENT_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/control/cluster_auth.h"

namespace strata::testing {

struct DeploymentOptions {
  std::string model_shape = "tiny";
  std::string model_dir;  // overrides model_shape
  // The npm tokenizer package (under @lenml/) the generated model gets, with its chat
  // template.
  std::string tokenizer = "tokenizer-llama2";
  int compute_nodes = 1;
  int memory_nodes = 0;
  int threads = 1;
  int64_t kv_budget_mib = 64;
  int64_t memory_kv_budget_mib = 64;
  std::string api_key;
  // The launcher restarts nodes that exit; most tests kill nodes to watch the failure, so
  // here it is off unless a test asks for it.
  bool restart_nodes = false;
  std::vector<std::string> server_args;
  std::vector<std::string> launcher_args;
};

class Deployment {
 public:
  static absl::StatusOr<std::unique_ptr<Deployment>> Start(const DeploymentOptions& options);
  ~Deployment();

  int http_port() const { return http_port_; }
  int control_port() const { return control_port_; }
  int grpc_port() const { return grpc_port_; }  // strata.api.v1.Inference
  const std::string& model_dir() const { return model_dir_; }
  // Process id of "server", "compute-0", "memory-1", ...; -1 if unknown.
  pid_t Pid(const std::string& name) const;
  // The /metrics port of "server", "compute-0", "memory-1", ...; 0 if unknown.
  int MetricsPort(const std::string& name) const {
    auto it = metrics_ports_.find(name);
    return it == metrics_ports_.end() ? 0 : it->second;
  }
  // The gRPC control port of "compute-0", "memory-1", ...; 0 if unknown.
  int ControlPort(const std::string& name) const {
    auto it = control_ports_.find(name);
    return it == control_ports_.end() ? 0 : it->second;
  }
  // SIGTERM to the launcher; waits for it. Returns its exit status.
  int Stop();

 private:
  Deployment() = default;
  pid_t launcher_ = -1;
  int http_port_ = 0;
  int control_port_ = 0;
  int grpc_port_ = 0;
  std::string model_dir_;
  std::map<std::string, pid_t> pids_;
  std::map<std::string, int> metrics_ports_;
  std::map<std::string, int> control_ports_;
};

// The cluster secret of every test deployment: a 0600 file in TEST_TMPDIR, made once.
std::string TestClusterSecretFile();
std::string ClusterSecretFlag();  // "--cluster_secret_file=" + TestClusterSecretFile()
// Credentials from that secret, for a test's own control-plane calls and data-plane peers.
std::shared_ptr<const ClusterAuth> TestClusterAuth();

std::string RunfilesRoot();  // $TEST_SRCDIR/strata
std::string NpmDir();        // $STRATA_CACHE_DIR/npm
std::string TestTmpDir();
// A generated model with the npm Mistral/Llama tokenizer, cached per shape in TEST_TMPDIR.
absl::StatusOr<std::string> TestModel(const std::string& shape,
                                      const std::string& tokenizer = "tokenizer-llama2");
// A TCP port that was free a moment ago (for processes that need a fixed port).
int FreePort();
// Starts `argv` (argv[0] the binary) as a child that dies with the test; returns its pid.
pid_t SpawnProcess(const std::vector<std::string>& argv, const std::vector<std::string>& env = {});
// Sends SIGTERM (then SIGKILL after `grace`) and reaps.
void StopProcess(pid_t pid, absl::Duration grace = absl::Seconds(5));

}  // namespace strata::testing

#endif  // STRATA_TESTS_COMMON_DEPLOYMENT_H_
