// The embedded default, end to end: the launcher starts the server and a compute node,
// /health turns 200 once they registered, and /v1/completions answers a string or token-id
// prompt with greedy text, logprobs and token_id:N tokens, matching the in-process runtime.
#include <sched.h>
#include <signal.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_join.h"
#include "common/base/cpu_quota_testing.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/deployment.h"
#include "tests/common/http_client.h"

namespace strata::testing {
namespace {

using json = nlohmann::json;

class ServeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto d = Deployment::Start({});
    ASSERT_TRUE(d.ok()) << d.status();
    deployment_ = d->release();
  }
  static void TearDownTestSuite() {
    if (deployment_ == nullptr) return;
    // SIGTERM stops every process the launcher started.
    const pid_t server = deployment_->Pid("server"), compute = deployment_->Pid("compute-0");
    EXPECT_EQ(deployment_->Stop(), 0);
    EXPECT_NE(kill(server, 0), 0) << "the server outlived the launcher";
    EXPECT_NE(kill(compute, 0), 0) << "the compute node outlived the launcher";
    delete deployment_;
  }
  static json Post(const std::string& path, const json& body, int* status = nullptr) {
    HttpResponse r = HttpRequest(deployment_->http_port(), "POST", path, body.dump());
    if (status) *status = r.status;
    return json::parse(r.body, nullptr, false);
  }
  static Deployment* deployment_;
};

Deployment* ServeTest::deployment_ = nullptr;

// Plans compute-0 took over its step channel (strata_step_channel_frames_total, kind plan);
// -1 if its metrics cannot be read.
double StepChannelPlans(const Deployment& d) {
  const int port = d.MetricsPort("compute-0");
  if (port <= 0) return -1;
  const HttpResponse r = HttpRequest(port, "GET", "/metrics");
  if (r.status != 200) return -1;
  const std::regex line(
      R"re(strata_step_channel_frames_total\{[^}]*kind="plan"[^}]*\} ([0-9.e+]+))re");
  std::smatch m;
  return std::regex_search(r.body, m, line) ? std::stod(m[1]) : -1;
}

TEST_F(ServeTest, HealthIsOkOnceNodesRegistered) {
  EXPECT_EQ(HttpRequest(deployment_->http_port(), "GET", "/health").status, 200);
  EXPECT_NE(deployment_->Pid("compute-0"), -1);
}

TEST_F(ServeTest, ModelsShowTheServedNameNotThePath) {
  const HttpResponse r = HttpRequest(deployment_->http_port(), "GET", "/v1/models");
  ASSERT_EQ(r.status, 200);
  const json models = json::parse(r.body);
  EXPECT_EQ(models["data"][0]["id"], "tiny");
  EXPECT_EQ(models["data"][0]["root"], "tiny");
  EXPECT_EQ(r.body.find(deployment_->model_dir()), std::string::npos) << r.body;
}

// A model directory without tokenizer files: token-id prompts work and the completion's
// text is its token ids, never an empty string.
TEST(NoTokenizerTest, CompletionTextIsTheTokenIds) {
  auto model = TestModel("tiny");
  ASSERT_TRUE(model.ok()) << model.status();
  const std::string dir = TestTmpDir() + "/no-tokenizer/tiny";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  for (const auto& entry : std::filesystem::directory_iterator(*model)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("tokenizer", 0) == 0) continue;
    std::filesystem::copy(entry.path(), dir + "/" + name);
  }
  DeploymentOptions options;
  options.model_dir = dir;
  auto d = Deployment::Start(options);
  ASSERT_TRUE(d.ok()) << d.status();
  const HttpResponse r =
      HttpRequest((*d)->http_port(), "POST", "/v1/completions",
                  R"({"model":"tiny","prompt":[1,5,9],"max_tokens":4,"ignore_eos":true})");
  ASSERT_EQ(r.status, 200) << r.body;
  const json body = json::parse(r.body);
  const std::string text = body["choices"][0]["text"];
  EXPECT_TRUE(std::regex_match(text, std::regex("(token_id:[0-9]+){4}"))) << text;
  const HttpResponse words = HttpRequest((*d)->http_port(), "POST", "/v1/completions",
                                         R"({"model":"tiny","prompt":"hello","max_tokens":4})");
  EXPECT_EQ(words.status, 400) << words.body;
  (*d)->Stop();
}

TEST_F(ServeTest, CompletionFromStringAndFromTokenIds) {
  int status = 0;
  json text = Post(
      "/v1/completions",
      {{"model", "tiny"}, {"prompt", "Once upon a time"}, {"max_tokens", 8}, {"temperature", 0}},
      &status);
  ASSERT_EQ(status, 200) << text.dump();
  EXPECT_EQ(text["object"], "text_completion");
  EXPECT_EQ(text["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(text["usage"]["completion_tokens"], 8);
  // The same prompt as token ids (the tokenizer adds BOS to text prompts).
  json tokens = Post("/tokenize", {{"prompt", "Once upon a time"}});
  json by_ids =
      Post("/v1/completions",
           {{"model", "tiny"}, {"prompt", tokens["tokens"]}, {"max_tokens", 8}, {"temperature", 0}},
           &status);
  ASSERT_EQ(status, 200);
  EXPECT_EQ(by_ids["choices"][0]["text"], text["choices"][0]["text"]);
  EXPECT_EQ(by_ids["usage"]["prompt_tokens"], tokens["count"]);
}

TEST_F(ServeTest, LogprobsAndTokenIdStrings) {
  int status = 0;
  json r = Post("/v1/completions",
                {{"model", "tiny"},
                 {"prompt", {1, 415, 2936}},
                 {"max_tokens", 4},
                 {"temperature", 0},
                 {"logprobs", 3},
                 {"return_tokens_as_token_ids", true}},
                &status);
  ASSERT_EQ(status, 200) << r.dump();
  const json& lp = r["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    const std::string token = lp["tokens"][i];
    EXPECT_EQ(token.rfind("token_id:", 0), 0u) << token;
    ASSERT_EQ(lp["top_logprobs"][i].size(), 3u);
    // Greedy: the chosen token is the most likely one, and logprobs are <= 0.
    double best = -1e9;
    for (auto& [k, v] : lp["top_logprobs"][i].items()) best = std::max(best, v.get<double>());
    EXPECT_DOUBLE_EQ(lp["token_logprobs"][i].get<double>(), best);
    EXPECT_LE(best, 0.0);
  }
}

TEST_F(ServeTest, GreedyOutputIsDeterministic) {
  const json body = {{"model", "tiny"}, {"prompt", "abc"}, {"max_tokens", 12}, {"temperature", 0}};
  json a = Post("/v1/completions", body), b = Post("/v1/completions", body);
  EXPECT_EQ(a["choices"][0]["text"], b["choices"][0]["text"]);
}

// Plans travel over each compute node's step channel on the data plane by default. The same
// requests give the same tokens when they go over the RunSteps gRPC stream instead: chosen by
// the server (--step_channel=grpc), or because the node offers no step channel.
TEST_F(ServeTest, StepsOverGrpcGiveTheTokensOfStepsOverTheDataPlane) {
  const json greedy = {{"model", "tiny"},
                       {"prompt", "the step channel"},
                       {"max_tokens", 24},
                       {"temperature", 0},
                       {"ignore_eos", true}};
  const json seeded = {{"model", "tiny"},    {"prompt", "seeded"}, {"max_tokens", 16},
                       {"temperature", 0.8}, {"seed", 7},          {"n", 2},
                       {"ignore_eos", true}};
  const json want_greedy = Post("/v1/completions", greedy);
  const json want_seeded = Post("/v1/completions", seeded);
  ASSERT_TRUE(want_greedy.contains("choices")) << want_greedy.dump();
  ASSERT_TRUE(want_seeded.contains("choices")) << want_seeded.dump();
  EXPECT_GT(StepChannelPlans(*deployment_), 0) << "the default deployment's plans did not "
                                                  "come over the step channel";
  DeploymentOptions by_server;
  by_server.server_args = {"--step_channel=grpc"};
  DeploymentOptions by_node;
  by_node.launcher_args = {"--node_args=--step_channel=false"};
  for (const DeploymentOptions& options : {by_server, by_node}) {
    auto d = Deployment::Start(options);
    ASSERT_TRUE(d.ok()) << d.status();
    for (const auto& [body, want] : {std::pair{greedy, want_greedy}, {seeded, want_seeded}}) {
      const HttpResponse r = HttpRequest((*d)->http_port(), "POST", "/v1/completions", body.dump());
      ASSERT_EQ(r.status, 200) << r.body;
      const json got = json::parse(r.body);
      ASSERT_EQ(got["choices"].size(), want["choices"].size());
      for (size_t i = 0; i < got["choices"].size(); ++i) {
        EXPECT_EQ(got["choices"][i]["text"], want["choices"][i]["text"]) << body.dump();
      }
    }
    EXPECT_EQ(StepChannelPlans(**d), 0) << "plans came over the step channel, not gRPC";
    (*d)->Stop();
  }
}

// Under control-plane TLS the plans still take the step channel, sealed with the
// deployment's secret (the data plane has no encryption of its own), and give the same
// text. Certificates as a cluster's CA would issue them, made by the openssl tool.
TEST_F(ServeTest, ControlPlaneTlsTakesSealedStepsOverTheStepChannel) {
  if (std::system("openssl version >/dev/null 2>&1") != 0) GTEST_SKIP() << "no openssl tool";
  const std::string dir = TestTmpDir() + "/control-tls";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string script =
      "cd " + dir +
      " && set -e; exec >/dev/null 2>&1; "
      "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 "
      "-subj /CN=strata-test-ca; "
      "openssl req -newkey rsa:2048 -nodes -keyout node.key -out node.csr -subj /CN=strata-node; "
      "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > ext; "
      "openssl x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out node.pem "
      "-days 2 -extfile ext; chmod 600 *.key";
  ASSERT_EQ(std::system(script.c_str()), 0) << "openssl failed";
  DeploymentOptions tls;
  tls.launcher_args = {"--control_tls_cert=" + dir + "/node.pem",
                       "--control_tls_key=" + dir + "/node.key",
                       "--control_tls_ca=" + dir + "/ca.pem"};
  auto d = Deployment::Start(tls);
  ASSERT_TRUE(d.ok()) << d.status();
  const json body = {{"model", "tiny"},
                     {"prompt", "the step channel"},
                     {"max_tokens", 24},
                     {"temperature", 0},
                     {"ignore_eos", true}};
  const HttpResponse r = HttpRequest((*d)->http_port(), "POST", "/v1/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["choices"][0]["text"],
            Post("/v1/completions", body)["choices"][0]["text"]);
  EXPECT_GT(StepChannelPlans(**d), 0) << "the plans did not come over the step channel";
  (*d)->Stop();
}

// The scheduling policy of each thread of process `pid`, by thread name.
std::map<std::string, std::set<int>> ThreadPolicies(pid_t pid) {
  std::map<std::string, std::set<int>> out;
  for (const auto& task : std::filesystem::directory_iterator(std::filesystem::path("/proc") /
                                                              std::to_string(pid) / "task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    std::getline(comm, name);
    const int policy = sched_getscheduler(std::stoi(task.path().filename().string()));
    if (policy >= 0) out[name].insert(policy);  // < 0: the thread has just exited
  }
  return out;
}

// Which threads may preempt the step's OpenMP team on shared cores (docs/architecture.md,
// "Service threads yield to compute"): the compute node's service threads are SCHED_BATCH,
// its step thread and team SCHED_OTHER; the server's threads, which carry every token to
// the client, are SCHED_OTHER by default.
TEST_F(ServeTest, OnlyTheComputeNodesServiceThreadsYieldToItsTeam) {
  // Where the kernel refuses SCHED_BATCH (a seccomp profile), the nodes run every thread
  // as SCHED_OTHER and say so in their logs: nothing to check.
  bool batch_allowed = false;
  std::thread probe([&] {
    const sched_param param{};
    batch_allowed = sched_setscheduler(0, SCHED_BATCH, &param) == 0;
  });
  probe.join();
  if (!batch_allowed) GTEST_SKIP() << "SCHED_BATCH is refused here";
  int status = 0;
  Post("/v1/completions", {{"prompt", "hello"}, {"max_tokens", 4}, {"temperature", 0}}, &status);
  ASSERT_EQ(status, 200);
  const auto server = ThreadPolicies(deployment_->Pid("server"));
  ASSERT_FALSE(server.empty());
  for (const auto& [name, policies] : server) {
    EXPECT_EQ(policies, std::set<int>{SCHED_OTHER}) << "server thread " << name;
  }
  const auto compute = ThreadPolicies(deployment_->Pid("compute-0"));
  ASSERT_TRUE(compute.count("step")) << "no step thread";
  EXPECT_EQ(compute.at("step"), std::set<int>{SCHED_OTHER});
  ASSERT_TRUE(compute.count("ucx-transport")) << "no transport thread";
  EXPECT_EQ(compute.at("ucx-transport"), std::set<int>{SCHED_BATCH});
}

// One model is served: a request may leave "model" out (as vLLM allows); a wrong name is a
// 404 and a name that is not a string a 400.
TEST_F(ServeTest, ModelMayBeOmittedButNotWrong) {
  int status = 0;
  json ok = Post("/v1/completions", {{"prompt", "abc"}, {"max_tokens", 3}}, &status);
  EXPECT_EQ(status, 200) << ok.dump();
  EXPECT_EQ(ok["model"], "tiny");
  ok = Post("/v1/chat/completions",
            {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 3}}, &status);
  EXPECT_EQ(status, 200) << ok.dump();
  EXPECT_EQ(ok["model"], "tiny");
  json e = Post("/v1/completions", {{"model", "other"}, {"prompt", "abc"}}, &status);
  EXPECT_EQ(status, 404) << e.dump();
  e = Post("/v1/completions", {{"model", 7}, {"prompt", "abc"}}, &status);
  EXPECT_EQ(status, 400) << e.dump();
  EXPECT_EQ(e["error"]["param"], "model");
}

// usage.prompt_tokens_details.cached_tokens on a stream (stream_options.include_usage) is
// what the prefix cache served: nothing the first time, the prompt's full 16-token blocks
// the second.
TEST_F(ServeTest, StreamedUsageReportsCachedPromptTokens) {
  std::vector<int> prompt;
  for (int i = 0; i < 70; ++i) prompt.push_back(100 + 7 * i);
  const json body = {{"model", "tiny"},
                     {"prompt", prompt},
                     {"max_tokens", 2},
                     {"stream", true},
                     {"stream_options", {{"include_usage", true}}}};
  auto cached = [&] {
    const HttpResponse r =
        HttpRequest(deployment_->http_port(), "POST", "/v1/completions", body.dump());
    EXPECT_EQ(r.status, 200);
    int64_t tokens = -1;
    size_t at = 0;
    while ((at = r.body.find("data: {", at)) != std::string::npos) {
      const size_t end = r.body.find("\n\n", at);
      const json event = json::parse(r.body.substr(at + 6, end - at - 6), nullptr, false);
      if (event.contains("usage") && event["usage"].is_object()) {
        EXPECT_EQ(event["usage"]["prompt_tokens"], 70);
        tokens = event["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
      }
      at = end;
    }
    return tokens;
  };
  EXPECT_EQ(cached(), 0);
  EXPECT_EQ(cached(), 64);  // four full blocks of 16 of the 70 tokens
}

TEST_F(ServeTest, BadRequestsGetErrorsAndTheServerKeepsServing) {
  int status = 0;
  json e = Post("/v1/completions", {{"model", "tiny"}, {"prompt", {1, 99999999}}}, &status);
  EXPECT_EQ(status, 400);
  EXPECT_TRUE(e.contains("error"));
  HttpResponse bad = HttpRequest(deployment_->http_port(), "POST", "/v1/completions", "{not json");
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(HttpRequest(deployment_->http_port(), "GET", "/nope").status, 404);
  EXPECT_EQ(HttpRequest(deployment_->http_port(), "GET", "/health").status, 200);
}

// The arguments /proc gives for `pid`, in order.
std::vector<std::string> CommandLine(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline", std::ios::binary);
  std::vector<std::string> args;
  for (std::string arg; std::getline(in, arg, '\0');) args.push_back(arg);
  return args;
}

// That the launcher started compute-0 and memory-0 with --threads=1.
void ExpectTeamsOfOneThread(const Deployment& d) {
  for (const char* node : {"compute-0", "memory-0"}) {
    const std::vector<std::string> args = CommandLine(d.Pid(node));
    ASSERT_FALSE(args.empty()) << node;
    EXPECT_NE(std::find(args.begin(), args.end(), "--threads=1"), args.end())
        << node << ": " << absl::StrJoin(args, " ");
  }
}

// Left to its default, the launcher sizes the compute node's team and each memory node's to
// the cores it may run on (taskset, a container's cpuset), not to the machine's cores: on one
// allowed core of two or more, every team is one thread.
TEST(LauncherCores, DefaultTeamsFollowTheAllowedCoresNotTheMachines) {
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  if (CPU_COUNT(&allowed) < 2) GTEST_SKIP() << "needs two allowed cores";
  cpu_set_t first;
  CPU_ZERO(&first);
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &allowed)) {
      CPU_SET(cpu, &first);
      break;
    }
  }
  // The launcher and every process it starts inherit this thread's single core.
  ASSERT_EQ(sched_setaffinity(0, sizeof(first), &first), 0);
  DeploymentOptions options;
  options.threads = 0;  // the launcher's default
  options.memory_nodes = 1;
  auto d = Deployment::Start(options);
  ASSERT_EQ(sched_setaffinity(0, sizeof(allowed), &allowed), 0);
  ASSERT_TRUE(d.ok()) << d.status();
  ExpectTeamsOfOneThread(**d);
  EXPECT_EQ((*d)->Stop(), 0);
}

// Under a CPU quota below the cores it may run on (a container's CPU limit without a cpuset
// of its own), the launcher sizes the teams to the quota: a quota of one core on two or more
// cores gives the compute node and a memory node one thread each.
TEST(LauncherCores, DefaultTeamsFollowTheCpuQuota) {
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  if (CPU_COUNT(&allowed) < 2) GTEST_SKIP() << "needs two allowed cores";
  ScopedCpuQuota quota(1);
  if (!quota.ok()) GTEST_SKIP() << quota.why_not();
  DeploymentOptions options;
  options.threads = 0;  // the launcher's default
  options.memory_nodes = 1;
  auto d = Deployment::Start(options);
  ASSERT_TRUE(d.ok()) << d.status();
  ExpectTeamsOfOneThread(**d);
  EXPECT_EQ((*d)->Stop(), 0);
  quota.Leave();
}

}  // namespace
}  // namespace strata::testing
