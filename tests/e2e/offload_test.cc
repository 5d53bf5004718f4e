// Attention offloading across processes on loopback: the launcher starts the server, a
// compute node and memory nodes talking UCX over TCP. Greedy outputs equal co-located
// ones, with a bf16 or an f16 KV cache; a memory node killed (SIGKILL) or hung (SIGSTOP)
// mid-generation only moves its requests, and a hung one that wakes up comes back; a compute node
// that disappears stops admission until it registers again.
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <fstream>
#include <future>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/base/cpu_affinity.h"
#include "common/base/wait_policy.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/deployment.h"
#include "tests/common/http_client.h"

namespace strata::testing {
namespace {

using json = nlohmann::json;

struct Completion {
  int status = 0;
  std::string text;
  std::vector<std::string> tokens;
  std::string finish;
  std::string error;
};

Completion Complete(int port, const std::vector<int>& prompt, int max_tokens) {
  json body = {{"model", "tiny-gqa"}, {"prompt", prompt}, {"max_tokens", max_tokens},
               {"temperature", 0},    {"logprobs", 0},    {"return_tokens_as_token_ids", true},
               {"ignore_eos", true}};
  HttpResponse r = HttpRequest(port, "POST", "/v1/completions", body.dump(), {}, nullptr, 300);
  Completion c;
  c.status = r.status;
  json j = json::parse(r.body, nullptr, false);
  if (j.is_discarded()) return c;
  if (r.status != 200) {
    c.error = j.value("/error/message"_json_pointer, std::string());
    return c;
  }
  c.text = j["choices"][0]["text"];
  c.finish = j["choices"][0]["finish_reason"];
  for (const auto& t : j["choices"][0]["logprobs"]["tokens"]) c.tokens.push_back(t);
  return c;
}

// The same, streamed; `chunks` counts the events received so far (to act mid-generation).
Completion StreamComplete(int port, const std::vector<int>& prompt, int max_tokens,
                          std::atomic<int>* chunks) {
  json body = {{"model", "tiny-gqa"}, {"prompt", prompt}, {"max_tokens", max_tokens},
               {"temperature", 0},    {"logprobs", 0},    {"return_tokens_as_token_ids", true},
               {"ignore_eos", true},  {"stream", true}};
  HttpResponse r = HttpRequest(
      port, "POST", "/v1/completions", body.dump(), {},
      [chunks](const std::string&) {
        ++*chunks;
        return true;
      },
      300);
  Completion c;
  c.status = r.status;
  if (r.status != 200) {
    c.error = r.body;
    return c;
  }
  for (const std::string& event : SseEvents(r.body)) {
    if (event == "[DONE]") break;
    json j = json::parse(event, nullptr, false);
    if (j.is_discarded()) continue;
    if (j.contains("error")) {
      c.status = 500;
      c.error = j["error"].dump();
      return c;
    }
    const json& choice = j["choices"][0];
    c.text += choice.value("text", "");
    if (choice.contains("logprobs") && choice["logprobs"].is_object()) {
      for (const auto& t : choice["logprobs"]["tokens"]) c.tokens.push_back(t);
    }
    if (!choice["finish_reason"].is_null()) c.finish = choice["finish_reason"];
  }
  return c;
}

// Starts streams for every prompt and returns once each has produced `min_chunks` events.
std::vector<std::future<Completion>> StartStreams(int port,
                                                  const std::vector<std::vector<int>>& prompts,
                                                  int max_tokens, int min_chunks,
                                                  std::vector<std::atomic<int>>& chunks) {
  std::vector<std::future<Completion>> futures;
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::atomic<int>* counter = &chunks[i];
    const std::vector<int> p = prompts[i];
    futures.push_back(std::async(std::launch::async,
                                 [=] { return StreamComplete(port, p, max_tokens, counter); }));
  }
  for (int wait = 0; wait < 3000; ++wait) {
    bool all = true;
    for (auto& c : chunks) all = all && c.load() >= min_chunks;
    if (all) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return futures;
}

std::vector<std::vector<int>> Prompts() {
  std::vector<std::vector<int>> out;
  for (int i = 0; i < 5; ++i) {
    std::vector<int> p;
    for (int j = 0; j < 20 + 61 * i; ++j) p.push_back(100 + (j * 37 + i * 101) % 30000);
    out.push_back(p);
  }
  return out;
}

std::vector<Completion> CompleteAll(int port, const std::vector<std::vector<int>>& prompts,
                                    int max_tokens) {
  std::vector<std::future<Completion>> futures;
  for (const auto& p : prompts) {
    futures.push_back(
        std::async(std::launch::async, [=] { return Complete(port, p, max_tokens); }));
  }
  std::vector<Completion> out;
  for (auto& f : futures) out.push_back(f.get());
  return out;
}

// The cores a process may run on, as /proc lists them ("0-1,3"), normalised.
std::string CpusOf(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Cpus_allowed_list:", 0) != 0) continue;
    auto cpus = ParseCpuList(std::string(absl::StripAsciiWhitespace(line.substr(18))));
    return cpus.ok() ? FormatCpuList(*cpus) : "unparsable: " + line;
  }
  return "no Cpus_allowed_list";
}

DeploymentOptions Offloaded(int memory_nodes) {
  DeploymentOptions o;
  o.model_shape = "tiny-gqa";
  o.memory_nodes = memory_nodes;
  o.threads = 1;
  o.launcher_args = {"--data_plane=tcp", "--attention_timeout_ms=2500", "--memory_threads=1"};
  return o;
}

bool WaitHealth(int port, int want, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (HttpRequest(port, "GET", "/health").status == want) return true;
    absl::SleepFor(absl::Milliseconds(100));
  }
  return false;
}

TEST(OffloadTest, OutputsEqualCoLocatedAcrossProcesses) {
  const auto prompts = Prompts();
  std::vector<Completion> reference;
  {
    DeploymentOptions o = Offloaded(0);
    auto d = Deployment::Start(o);
    ASSERT_TRUE(d.ok()) << d.status();
    reference = CompleteAll((*d)->http_port(), prompts, 12);
    EXPECT_EQ((*d)->Stop(), 0);
  }
  auto d = Deployment::Start(Offloaded(2));
  ASSERT_TRUE(d.ok()) << d.status();
  // The launcher gives each memory node its own share of the cores.
  const auto shares = SplitCpus(AllowedCpus(), 2);
  for (int i = 0; i < 2; ++i) {
    const pid_t pid = (*d)->Pid(absl::StrCat("memory-", i));
    ASSERT_NE(pid, -1);
    EXPECT_EQ(CpusOf(pid), FormatCpuList(shares[i])) << "memory-" << i;
  }
  const auto got = CompleteAll((*d)->http_port(), prompts, 12);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(reference[i].status, 200) << reference[i].error;
    ASSERT_EQ(got[i].status, 200) << got[i].error;
    EXPECT_EQ(got[i].tokens, reference[i].tokens) << "prompt " << i;
    EXPECT_EQ(got[i].text, reference[i].text) << "prompt " << i;
  }
  EXPECT_EQ((*d)->Stop(), 0);
}

// With an f16 KV cache (--kv_cache_dtype=f16 on the launcher: the server and every
// compute node), the memory nodes keep it and the outputs still equal co-located ones,
// bit for bit. (Its numbers against the numpy reference: //compute_node:reference_test_*_f16_kv.)
TEST(OffloadTest, AnF16KvCacheGivesTheSameOutputsAcrossProcesses) {
  const auto prompts = Prompts();
  std::vector<Completion> reference;
  {
    DeploymentOptions o = Offloaded(0);
    o.launcher_args.push_back("--kv_cache_dtype=f16");
    auto d = Deployment::Start(o);
    ASSERT_TRUE(d.ok()) << d.status();
    reference = CompleteAll((*d)->http_port(), prompts, 12);
    EXPECT_EQ((*d)->Stop(), 0);
  }
  DeploymentOptions o = Offloaded(2);
  o.launcher_args.push_back("--kv_cache_dtype=f16");
  auto d = Deployment::Start(o);
  ASSERT_TRUE(d.ok()) << d.status();
  const auto got = CompleteAll((*d)->http_port(), prompts, 12);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(reference[i].status, 200) << reference[i].error;
    ASSERT_EQ(got[i].status, 200) << got[i].error;
    EXPECT_EQ(got[i].tokens, reference[i].tokens) << "prompt " << i;
  }
  EXPECT_EQ((*d)->Stop(), 0);
}

// Kills memory-1 mid-generation: every stream still completes with the outputs of a
// healthy deployment, and the deployment keeps serving. Returns how long the streams took
// to complete after the kill.
absl::Duration KillAMemoryNodeMidGeneration(const DeploymentOptions& o) {
  auto d = Deployment::Start(o);
  EXPECT_TRUE(d.ok()) << d.status();
  if (!d.ok()) return absl::ZeroDuration();
  const int port = (*d)->http_port();
  const auto prompts = Prompts();
  // Outputs are deterministic: what the same prompts give on the healthy deployment.
  const auto reference = CompleteAll(port, prompts, 300);
  std::vector<std::atomic<int>> chunks(prompts.size());
  auto futures = StartStreams(port, prompts, 300, 10, chunks);
  EXPECT_EQ(kill((*d)->Pid("memory-1"), SIGKILL), 0);
  const absl::Time killed = absl::Now();
  for (size_t i = 0; i < futures.size(); ++i) {
    const Completion c = futures[i].get();
    EXPECT_EQ(c.status, 200) << "prompt " << i << ": " << c.error;
    EXPECT_EQ(c.tokens, reference[i].tokens) << "prompt " << i << " changed after the move";
  }
  const absl::Duration took = absl::Now() - killed;
  // Degraded but serving.
  EXPECT_EQ(HttpRequest(port, "GET", "/health").status, 200);
  const Completion later = Complete(port, prompts[0], 5);
  EXPECT_EQ(later.status, 200) << later.error;
  EXPECT_EQ((*d)->Stop(), 0);
  return took;
}

TEST(OffloadTest, KilledMemoryNodeOnlyMovesItsRequests) {
  KillAMemoryNodeMidGeneration(Offloaded(2));
}

// Over shared memory, where UCX cannot see a dead peer, the connection's liveness socket
// does (common/transport/ucx_bootstrap.h). With the layer deadline and the heartbeats'
// far past the test's time, only the connection can find the dead node in time.
TEST(OffloadTest, KilledMemoryNodeOverSharedMemoryIsFoundOnItsConnection) {
  DeploymentOptions o = Offloaded(2);
  o.launcher_args = {"--data_plane=sm", "--attention_timeout_ms=600000", "--memory_threads=1",
                     "--server_args=--heartbeat_timeout_ms=600000"};
  EXPECT_LT(KillAMemoryNodeMidGeneration(o), absl::Seconds(300))
      << "the dead memory node was found by a deadline, not on its connection";
}

// Stops memory-0 (SIGSTOP) mid-generation: every stream completes with a healthy
// deployment's outputs, and once woken it registers again and serves.
void HangAMemoryNodeAndWakeIt(const DeploymentOptions& o) {
  auto d = Deployment::Start(o);
  ASSERT_TRUE(d.ok()) << d.status();
  const int port = (*d)->http_port();
  const auto prompts = Prompts();
  const auto reference = CompleteAll(port, prompts, 300);
  const pid_t hung = (*d)->Pid("memory-0");
  std::vector<std::atomic<int>> chunks(prompts.size());
  auto futures = StartStreams(port, prompts, 300, 10, chunks);
  ASSERT_EQ(kill(hung, SIGSTOP), 0);
  const absl::Time stopped = absl::Now();
  for (size_t i = 0; i < futures.size(); ++i) {
    const Completion c = futures[i].get();
    ASSERT_EQ(c.status, 200) << "prompt " << i << ": " << c.error;
    EXPECT_EQ(c.tokens, reference[i].tokens) << "prompt " << i;
  }
  // The step did not hang: the 2.5 s layer deadline (and heartbeats) moved the requests.
  EXPECT_LT(absl::Now() - stopped, absl::Seconds(60));
  // Wake it: it finds itself unknown, registers again and is configured empty.
  ASSERT_EQ(kill(hung, SIGCONT), 0);
  absl::SleepFor(absl::Seconds(4));
  // With the other memory node gone, only the woken one can serve.
  ASSERT_EQ(kill((*d)->Pid("memory-1"), SIGKILL), 0);
  Completion after;
  for (int attempt = 0; attempt < 20; ++attempt) {
    after = Complete(port, prompts[1], 10);
    if (after.status == 200) break;
    absl::SleepFor(absl::Milliseconds(500));
  }
  ASSERT_EQ(after.status, 200) << after.error;
  EXPECT_EQ(std::vector<std::string>(reference[1].tokens.begin(), reference[1].tokens.begin() + 10),
            after.tokens);
  EXPECT_EQ((*d)->Stop(), 0);
}

TEST(OffloadTest, HungMemoryNodeIsFoundByDeadlineAndComesBack) {
  HangAMemoryNodeAndWakeIt(Offloaded(2));
}

// The same over shared memory, the embedded default's data plane: a stopped process keeps
// its connections open (its liveness sockets say nothing), so the layer deadline finds it,
// as over tcp.
TEST(OffloadTest, HungMemoryNodeOverSharedMemoryIsFoundByDeadlineAndComesBack) {
  DeploymentOptions o = Offloaded(2);
  o.launcher_args = {"--data_plane=sm", "--attention_timeout_ms=2500", "--memory_threads=1"};
  HangAMemoryNodeAndWakeIt(o);
}

TEST(OffloadTest, ComputeNodeThatLeavesStopsAdmissionUntilItReturns) {
  DeploymentOptions o = Offloaded(1);
  auto d = Deployment::Start(o);
  ASSERT_TRUE(d.ok()) << d.status();
  const int port = (*d)->http_port();
  const auto prompts = Prompts();
  const Completion before = Complete(port, prompts[0], 8);
  ASSERT_EQ(before.status, 200) << before.error;
  ASSERT_EQ(kill((*d)->Pid("compute-0"), SIGKILL), 0);
  // Reported: health goes 503 once the heartbeats stop, and requests are refused.
  ASSERT_TRUE(WaitHealth(port, 503, absl::Seconds(15)));
  const Completion refused = Complete(port, prompts[0], 8);
  EXPECT_EQ(refused.status, 503) << refused.error;
  // A compute node registers under the same name: admitted again.
  const std::string root = RunfilesRoot();
  const pid_t again = SpawnProcess(
      {root + "/compute_node/compute_node", "--model=" + (*d)->model_dir(),
       absl::StrCat("--scheduler=127.0.0.1:", (*d)->control_port()), "--name=compute-0",
       "--threads=1", "--ucx_tls=tcp", "--ucx_net_devices=lo", "--transport_error_mode=peer",
       "--mutex_deadlock_detection=true", ClusterSecretFlag()},
      OpenMpEnvironmentList(1, CoreShare::kShared));
  ASSERT_TRUE(WaitHealth(port, 200, absl::Seconds(60)));
  const Completion after = Complete(port, prompts[0], 8);
  ASSERT_EQ(after.status, 200) << after.error;
  EXPECT_EQ(after.tokens, before.tokens);
  StopProcess(again);
  (*d)->Stop();
}

}  // namespace
}  // namespace strata::testing
