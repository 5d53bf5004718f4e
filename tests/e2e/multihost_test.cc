// Multi-host: the scheduler, a compute node and two memory nodes each in a network
// namespace of their own, joined by veth pairs on a bridge, talking gRPC and UCX over TCP
// on those links. The namespaces are made and removed by the test; without the privilege
// to make them, it skips and says why.
#include <signal.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/wait_policy.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/deployment.h"
#include "tests/common/http_client.h"
#include "tests/common/netns.h"

namespace strata::testing {
namespace {

using json = nlohmann::json;

std::vector<std::string> Complete(int port, const std::vector<int>& prompt, int* status) {
  json body = {{"model", "tiny"},   {"prompt", prompt}, {"max_tokens", 12},
               {"temperature", 0},  {"logprobs", 0},    {"return_tokens_as_token_ids", true},
               {"ignore_eos", true}};
  HttpResponse r = HttpRequest(port, "POST", "/v1/completions", body.dump(), {}, nullptr, 120);
  *status = r.status;
  std::vector<std::string> tokens;
  json j = json::parse(r.body, nullptr, false);
  if (r.status != 200 || j.is_discarded()) return tokens;
  for (const auto& t : j["choices"][0]["logprobs"]["tokens"]) tokens.push_back(t);
  return tokens;
}

std::vector<int> Prompt(int n, int seed) {
  std::vector<int> p;
  for (int i = 0; i < n; ++i) p.push_back(100 + (i * 53 + seed * 977) % 30000);
  return p;
}

TEST(MultiHostTest, NodesOnSeparateHostsServeTheSameTokens) {
  auto hosts = NetnsHosts::Create("mh", 4);
  if (!hosts.ok()) {
    GTEST_SKIP() << "cannot create network namespaces here (needs root and iproute2): "
                 << hosts.status().message();
  }
  auto model = TestModel("tiny");
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<std::vector<int>> prompts = {Prompt(7, 1), Prompt(90, 2), Prompt(200, 3)};

  // Reference: co-located, on loopback.
  std::vector<std::vector<std::string>> reference;
  {
    DeploymentOptions o;
    o.memory_nodes = 0;
    auto d = Deployment::Start(o);
    ASSERT_TRUE(d.ok()) << d.status();
    for (const auto& p : prompts) {
      int status = 0;
      reference.push_back(Complete((*d)->http_port(), p, &status));
      ASSERT_EQ(status, 200);
    }
    (*d)->Stop();
  }

  const std::string root = RunfilesRoot();
  const std::string scheduler_host = (*hosts)->Address(1);
  const std::string port_file = TestTmpDir() + "/multihost-ports.json";
  std::remove(port_file.c_str());
  const std::vector<std::string> env = OpenMpEnvironmentList(1, CoreShare::kShared);
  std::vector<pid_t> pids;
  pids.push_back(
      (*hosts)->Spawn(1,
                      {root + "/server/server", "--model=" + *model, "--host=" + scheduler_host,
                       "--control_host=" + scheduler_host, "--port=0", "--control_port=0",
                       "--port_file=" + port_file, "--compute_nodes=1", "--memory_nodes=2",
                       "--mutex_deadlock_detection=true", ClusterSecretFlag()},
                      env));
  int http_port = 0, control_port = 0;
  for (int i = 0; i < 300 && control_port == 0; ++i) {
    std::ifstream in(port_file);
    std::stringstream text;
    text << in.rdbuf();
    json j = json::parse(text.str(), nullptr, false);
    if (!j.is_discarded() && j.is_object()) {
      http_port = j.value("http", 0);
      control_port = j.value("control", 0);
    }
    if (control_port == 0) absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_NE(control_port, 0) << "the server did not start in its namespace";
  const std::string scheduler = absl::StrCat(scheduler_host, ":", control_port);
  // The nodes' data plane, and abseil's deadlock detector as in every test's processes.
  const std::vector<std::string> ucx = {"--ucx_tls=tcp", "--ucx_net_devices=eth0",
                                        "--transport_error_mode=peer",
                                        "--mutex_deadlock_detection=true"};
  for (int m = 0; m < 2; ++m) {
    const int host = 3 + m;
    std::vector<std::string> argv = {root + "/memory_node/memory_node",
                                     "--scheduler=" + scheduler,
                                     absl::StrCat("--name=memory-", m),
                                     "--host=" + (*hosts)->Address(host),
                                     "--kv_budget_mib=32",
                                     "--threads=1",
                                     "--prefault_kv=false",
                                     ClusterSecretFlag()};
    argv.insert(argv.end(), ucx.begin(), ucx.end());
    pids.push_back((*hosts)->Spawn(host, argv, env));
  }
  std::vector<std::string> compute = {root + "/compute_node/compute_node", "--model=" + *model,
                                      "--scheduler=" + scheduler,          "--name=compute-0",
                                      "--host=" + (*hosts)->Address(2),    "--threads=1",
                                      "--attention_timeout_ms=5000",       ClusterSecretFlag()};
  compute.insert(compute.end(), ucx.begin(), ucx.end());
  pids.push_back((*hosts)->Spawn(2, compute, env));

  SetHttpHost(scheduler_host);
  bool healthy = false;
  for (int i = 0; i < 600 && !healthy; ++i) {
    healthy = HttpRequest(http_port, "GET", "/health").status == 200;
    if (!healthy) absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(healthy) << "the deployment across namespaces did not become healthy";
  for (size_t i = 0; i < prompts.size(); ++i) {
    int status = 0;
    const auto tokens = Complete(http_port, prompts[i], &status);
    ASSERT_EQ(status, 200);
    EXPECT_EQ(tokens, reference[i]) << "prompt " << i;
  }
  // One memory host goes down: the other takes over.
  kill(pids[1], SIGKILL);
  for (size_t i = 0; i < prompts.size(); ++i) {
    int status = 0;
    const auto tokens = Complete(http_port, prompts[i], &status);
    ASSERT_EQ(status, 200);
    EXPECT_EQ(tokens, reference[i]) << "prompt " << i << " after losing a memory host";
  }
  SetHttpHost("127.0.0.1");
  for (auto it = pids.rbegin(); it != pids.rend(); ++it) StopProcess(*it);
}

}  // namespace
}  // namespace strata::testing
