// Faults as a client sees them: while the only compute node is gone, every request gets 503
// (never a 500, and never an internal address), from the moment its connection breaks, not
// only once its heartbeats have been missed.
#include <signal.h>

#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/deployment.h"
#include "tests/common/http_client.h"

namespace strata::testing {
namespace {

// `n` copies of a completion request, sent at once, each from its own thread.
class ConcurrentRequests {
 public:
  ConcurrentRequests(int port, const std::string& body, int n) : responses_(n) {
    for (int i = 0; i < n; ++i) {
      threads_.emplace_back([this, port, body, i] {
        responses_[i] =
            HttpRequest(port, "POST", "/v1/completions", body, {}, nullptr, /*timeout_s=*/120);
      });
    }
  }
  // Joins even when a test gives up early.
  ~ConcurrentRequests() { Join(); }
  // The responses, in the order the requests were started, once all are back.
  std::vector<HttpResponse> Wait() {
    Join();
    return responses_;
  }

 private:
  void Join() {
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
  }
  std::vector<HttpResponse> responses_;
  std::vector<std::thread> threads_;
};

TEST(FaultTest, RequestsAfterTheComputeNodeDiesGet503WithNothingInternal) {
  DeploymentOptions options;
  options.server_args = {"--served_model_name=tiny"};
  auto d = Deployment::Start(options);
  ASSERT_TRUE(d.ok()) << d.status();
  const std::string body = R"({"model":"tiny","prompt":"Hello there","max_tokens":4})";
  ASSERT_EQ(HttpRequest((*d)->http_port(), "POST", "/v1/completions", body).status, 200);
  ASSERT_EQ(kill((*d)->Pid("compute-0"), SIGKILL), 0);
  // The heartbeat deadline is 3 s; ask throughout it and past it.
  const absl::Time until = absl::Now() + absl::Seconds(5);
  int requests = 0, refused = 0;
  while (absl::Now() < until) {
    const HttpResponse r = HttpRequest((*d)->http_port(), "POST", "/v1/completions", body, {},
                                       nullptr, /*timeout_s=*/30);
    ++requests;
    EXPECT_EQ(r.status, 503) << "request " << requests << ": " << r.body;
    refused += r.status == 503;
    EXPECT_EQ(r.body.find("127.0.0.1"), std::string::npos) << r.body;
    EXPECT_EQ(r.body.find("compute-0"), std::string::npos) << r.body;
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_GT(requests, 10);
  EXPECT_EQ(refused, requests);
  // /health names what is missing: the compute node, not a KV pool too.
  const HttpResponse health = HttpRequest((*d)->http_port(), "GET", "/health");
  EXPECT_EQ(health.status, 503);
  EXPECT_NE(health.body.find("a compute node (0 of 1 ready)"), std::string::npos) << health.body;
  EXPECT_EQ(health.body.find("KV pool"), std::string::npos) << health.body;
  (*d)->Stop();
}

// A memory node that hangs (SIGSTOP) stalls the steps that wait on it only until the
// scheduler declares it dead (3 s of missed heartbeats) and tells the compute node, not for
// the whole per-layer deadline (here 60 s): the compute node takes the new list of memory
// nodes without waiting for the step in flight.
TEST(FaultTest, AHungMemoryNodeStallsStepsOnlyUntilItIsDeclaredDead) {
  DeploymentOptions options;
  options.server_args = {"--served_model_name=tiny"};
  options.memory_nodes = 2;
  options.launcher_args = {"--attention_timeout_ms=60000"};
  auto d = Deployment::Start(options);
  ASSERT_TRUE(d.ok()) << d.status();
  const std::string body = R"({"model":"tiny","prompt":"Hello there","max_tokens":16})";
  ASSERT_EQ(HttpRequest((*d)->http_port(), "POST", "/v1/completions", body).status, 200);
  const pid_t hung = (*d)->Pid("memory-1");
  ASSERT_EQ(kill(hung, SIGSTOP), 0);
  const absl::Time start = absl::Now();
  std::vector<std::thread> clients;
  std::vector<int> statuses(4, 0);
  for (int i = 0; i < 4; ++i) {
    clients.emplace_back([&, i] {
      statuses[i] = HttpRequest((*d)->http_port(), "POST", "/v1/completions", body, {}, nullptr,
                                /*timeout_s=*/120)
                        .status;
    });
  }
  for (std::thread& t : clients) t.join();
  const absl::Duration took = absl::Now() - start;
  kill(hung, SIGCONT);
  // Requests on the hung node are moved to the other one (or fail cleanly); none waits for
  // the 60 s layer deadline.
  for (int s : statuses) EXPECT_TRUE(s == 200 || s == 503) << s;
  EXPECT_LT(took, absl::Seconds(20)) << "requests took " << absl::FormatDuration(took);
  (*d)->Stop();
}

// One of two compute nodes hangs (SIGSTOP) mid-generation, with two plans in flight on
// each, co-located (each node's KV in its own cache) and with two memory nodes: its steps
// stall only until the scheduler declares it dead (3 s of missed heartbeats), not until
// their step deadline (60 s): their requests are recomputed on the other node, with exactly
// the greedy text of an undisturbed run. Once it is back (SIGCONT) it serves again.
TEST(FaultTest, AHungComputeNodeStallsItsStepsOnlyUntilItIsDeclaredDead) {
  for (int memory_nodes : {0, 2}) {
    SCOPED_TRACE(absl::StrCat(memory_nodes, " memory nodes"));
    DeploymentOptions options;
    // At most 2 sequences per step, so that the 8 requests spread over both nodes.
    options.server_args = {"--served_model_name=tiny", "--max_plans_in_flight=2",
                           "--max_num_seqs=2"};
    options.compute_nodes = 2;
    options.memory_nodes = memory_nodes;
    auto d = Deployment::Start(options);
    ASSERT_TRUE(d.ok()) << d.status();
    const std::string body = R"({"model":"tiny","prompt":"Once upon","max_tokens":1500,)"
                             R"("temperature":0,"ignore_eos":true})";
    const HttpResponse reference = HttpRequest((*d)->http_port(), "POST", "/v1/completions", body);
    ASSERT_EQ(reference.status, 200) << reference.body;
    const std::string text = nlohmann::json::parse(reference.body)["choices"][0]["text"];
    constexpr int kClients = 8;
    const absl::Time start = absl::Now();
    ConcurrentRequests clients((*d)->http_port(), body, kClients);
    absl::SleepFor(absl::Milliseconds(400));  // both nodes run steps
    const double before =
        MetricSum((*d)->MetricsPort("compute-1"), "strata_compute_node_steps_total", "");
    absl::SleepFor(absl::Milliseconds(100));
    ASSERT_GT(MetricSum((*d)->MetricsPort("compute-1"), "strata_compute_node_steps_total", ""),
              before)
        << "compute-1 ran no step";
    const pid_t hung = (*d)->Pid("compute-1");
    ASSERT_EQ(kill(hung, SIGSTOP), 0);
    const std::vector<HttpResponse> responses = clients.Wait();
    const absl::Duration took = absl::Now() - start;
    kill(hung, SIGCONT);
    for (int i = 0; i < kClients; ++i) {
      const HttpResponse& r = responses[i];
      ASSERT_EQ(r.status, 200) << "client " << i << ": " << r.body;
      EXPECT_EQ(nlohmann::json::parse(r.body)["choices"][0]["text"], text) << "client " << i;
    }
    EXPECT_LT(took, absl::Seconds(40)) << "requests took " << absl::FormatDuration(took);
    // Back, it registers again (its heartbeats are refused), gets a new step channel and
    // runs steps again, with the same text.
    absl::SleepFor(absl::Seconds(1));  // what waited in its sockets is in
    const int port = (*d)->MetricsPort("compute-1");
    const double steps = MetricSum(port, "strata_compute_node_steps_total", "");
    bool back = false;
    for (const absl::Time until = absl::Now() + absl::Seconds(60); !back && absl::Now() < until;) {
      ConcurrentRequests again((*d)->http_port(), body, 4);
      for (const HttpResponse& r : again.Wait()) {
        ASSERT_EQ(r.status, 200) << r.body;
        EXPECT_EQ(nlohmann::json::parse(r.body)["choices"][0]["text"], text);
      }
      back = MetricSum(port, "strata_compute_node_steps_total", "") > steps;
    }
    EXPECT_TRUE(back) << "the compute node that hung ran no step after it came back";
    (*d)->Stop();
  }
}

// Two plans in flight on the only compute node, and it dies (SIGKILL) mid-generation, in
// co-located mode and with two memory nodes, with plans of different sequences and with
// asynchronous scheduling (plans sharing sequences, written to the node before the previous
// one is back): no request hangs or is lost; each one that was running completes or gets
// 503, and no error names an internal address or node.
TEST(FaultTest, AComputeNodeDyingWithTwoPlansInFlightLosesNothing) {
  for (const auto& [memory_nodes, async] :
       std::vector<std::pair<int, bool>>{{0, false}, {2, false}, {0, true}, {2, true}}) {
    SCOPED_TRACE(absl::StrCat(memory_nodes, " memory nodes", async ? ", asynchronous" : ""));
    DeploymentOptions options;
    // At most 2 sequences per step, so that 8 requests make several plans.
    options.server_args = {"--served_model_name=tiny", "--max_plans_in_flight=2",
                           "--max_num_seqs=2"};
    options.server_args.push_back(async ? "--async_scheduling" : "--async_scheduling=false");
    options.memory_nodes = memory_nodes;
    auto d = Deployment::Start(options);
    ASSERT_TRUE(d.ok()) << d.status();
    // Long enough that the 8 requests still run when the node dies 300 ms in: 400 tokens
    // each were all done by then on a Zen 5.
    const std::string body = R"({"model":"tiny","prompt":"Once upon","max_tokens":1500,)"
                             R"("ignore_eos":true})";
    constexpr int kClients = 8;
    const absl::Time start = absl::Now();
    ConcurrentRequests clients((*d)->http_port(), body, kClients);
    absl::SleepFor(absl::Milliseconds(300));  // steps are running
    ASSERT_EQ(kill((*d)->Pid("compute-0"), SIGKILL), 0);
    const std::vector<HttpResponse> responses = clients.Wait();
    const absl::Duration took = absl::Now() - start;
    int refused = 0;
    for (int i = 0; i < kClients; ++i) {
      const HttpResponse& r = responses[i];
      EXPECT_TRUE(r.status == 200 || r.status == 503)
          << "client " << i << ": " << r.status << " " << r.body;
      refused += r.status == 503;
      EXPECT_EQ(r.body.find("127.0.0.1"), std::string::npos) << r.body;
      EXPECT_EQ(r.body.find("compute-0"), std::string::npos) << r.body;
    }
    EXPECT_GT(refused, 0) << "the compute node died after every request had finished";
    EXPECT_LT(took, absl::Seconds(60)) << "requests took " << absl::FormatDuration(took);
    (*d)->Stop();
  }
}

// kLoadClients greedy completions of `max_tokens` at once on a deployment of `options` (two
// memory nodes), and `settle` later memory-1 is killed (SIGKILL) or hangs (SIGSTOP) while
// they run. Nothing hangs and nothing is lost: every request completes with exactly the
// greedy output of an undisturbed run (its KV is recomputed on the live node), or, while the
// hung node is still counted alive, fails cleanly with 503; all within `bound`. Returns the
// requests preempted meanwhile.
constexpr int kLoadClients = 8;
double FailAMemoryNodeUnderLoad(const DeploymentOptions& options, int signal, int max_tokens,
                                absl::Duration settle, absl::Duration bound) {
  auto d = Deployment::Start(options);
  EXPECT_TRUE(d.ok()) << d.status();
  if (!d.ok()) return 0;
  const std::string body = absl::StrCat(R"({"model":"tiny","prompt":"Once upon","max_tokens":)",
                                        max_tokens, R"(,"temperature":0,"ignore_eos":true})");
  const HttpResponse reference = HttpRequest((*d)->http_port(), "POST", "/v1/completions", body);
  EXPECT_EQ(reference.status, 200) << reference.body;
  if (reference.status != 200) return 0;
  const std::string text = nlohmann::json::parse(reference.body)["choices"][0]["text"];
  const absl::Time start = absl::Now();
  ConcurrentRequests clients((*d)->http_port(), body, kLoadClients);
  absl::SleepFor(settle);
  const HttpResponse metrics = HttpRequest((*d)->http_port(), "GET", "/metrics");
  EXPECT_EQ(metrics.body.find(R"(strata_num_requests_running{model_name="tiny"} 0)"),
            std::string::npos)
      << "nothing was running when the memory node failed";
  EXPECT_NE(metrics.body.find(R"(strata_num_requests_running{model_name="tiny"})"),
            std::string::npos);
  const pid_t victim = (*d)->Pid("memory-1");
  EXPECT_EQ(kill(victim, signal), 0);
  const std::vector<HttpResponse> responses = clients.Wait();
  const absl::Duration took = absl::Now() - start;
  if (signal == SIGSTOP) kill(victim, SIGCONT);
  int completed = 0;
  for (int i = 0; i < kLoadClients; ++i) {
    const HttpResponse& r = responses[i];
    if (signal == SIGKILL) {
      EXPECT_EQ(r.status, 200) << "client " << i << ": " << r.body;
    } else {
      EXPECT_TRUE(r.status == 200 || r.status == 503)
          << "client " << i << ": " << r.status << " " << r.body;
    }
    if (r.status != 200) continue;
    ++completed;
    EXPECT_EQ(nlohmann::json::parse(r.body)["choices"][0]["text"], text) << "client " << i;
  }
  EXPECT_GT(completed, 0);
  EXPECT_LT(took, bound) << "requests took " << absl::FormatDuration(took);
  const double preempted =
      MetricSum((*d)->http_port(), "strata_num_preemptions_total", "model_name=\"tiny\"");
  (*d)->Stop();
  return preempted;
}

// Two batches in flight on the compute node (--pipelining=two), and one memory node is
// killed or hangs mid-generation (FailAMemoryNodeUnderLoad). Long enough to be running
// 300 ms in (400 tokens were not, on a Zen 5).
TEST(FaultTest, AMemoryNodeFailingUnderTwoBatchesInFlightLosesNothing) {
  for (int signal : {SIGKILL, SIGSTOP}) {
    SCOPED_TRACE(signal == SIGKILL ? "SIGKILL" : "SIGSTOP");
    DeploymentOptions options;
    options.server_args = {"--served_model_name=tiny", "--max_num_seqs=4"};
    options.memory_nodes = 2;
    options.launcher_args = {"--pipelining=two", "--attention_timeout_ms=60000"};
    FailAMemoryNodeUnderLoad(options, signal, 1500, absl::Milliseconds(300), absl::Seconds(40));
  }
}

// Rotational pipelining across processes: 3 compute replicas and 2 memory nodes, at most 8
// sequences, each memory node's answer due within `attention_timeout_ms`.
DeploymentOptions Rotational(int attention_timeout_ms) {
  DeploymentOptions options;
  options.server_args = {"--served_model_name=tiny", "--max_num_seqs=8"};
  options.compute_nodes = 3;
  options.memory_nodes = 2;
  options.launcher_args = {"--pipelining=rotational",
                           absl::StrCat("--attention_timeout_ms=", attention_timeout_ms)};
  return options;
}

// Rotational pipelining across processes (3 compute replicas, 2 memory nodes), and one
// memory node is killed or hangs mid-generation (FailAMemoryNodeUnderLoad). Its rows fail
// alone in each rotated step, named in the contexts the replicas hand each other over UCX,
// and the other node's requests go on: only the failed node's are moved. Placement spreads
// the clients over both nodes, and a whole rotated step failing (as it used to) moved the
// live node's too, every client of the batches that held one of the failed node's.
TEST(FaultTest, AMemoryNodeFailingUnderRotationLosesNothing) {
  for (int signal : {SIGKILL, SIGSTOP}) {
    SCOPED_TRACE(signal == SIGKILL ? "SIGKILL" : "SIGSTOP");
    const DeploymentOptions options = Rotational(/*attention_timeout_ms=*/4000);
    const double preempted =
        FailAMemoryNodeUnderLoad(options, signal, 600, absl::Milliseconds(400), absl::Seconds(90));
    EXPECT_LT(preempted, kLoadClients) << "the live node's requests were moved too";
  }
}

// Rotational pipelining across processes: 4 batches rotate over 3 compute replicas that
// share 2 memory nodes (contexts move between the compute processes over UCX). Greedy text
// equals a deployment without pipelining, and plans travel over the replicas' step
// channels. Then one replica is killed (SIGKILL) or hangs (SIGSTOP) mid-generation:
// nothing hangs and nothing is lost; every request completes with exactly the undisturbed
// text, its batch recomputed on the two replicas left. A hung replica keeps its
// connections open: the others give up the contexts it owes when the scheduler declares
// it dead (3 s of missed heartbeats) and says so in their configuration, not at their
// hand-off deadline (twice the attention timeout: two minutes here, past the clients'
// timeout). Once it is back (SIGCONT) it rejoins at its old address and takes part again.
TEST(FaultTest, AComputeReplicaDyingOrHangingMidRotationLosesNothing) {
  const std::string body = R"({"model":"tiny","prompt":"Once upon","max_tokens":300,)"
                           R"("temperature":0,"ignore_eos":true})";
  std::string reference;
  {
    DeploymentOptions options;
    options.server_args = {"--served_model_name=tiny"};
    options.memory_nodes = 2;
    auto d = Deployment::Start(options);
    ASSERT_TRUE(d.ok()) << d.status();
    const HttpResponse r = HttpRequest((*d)->http_port(), "POST", "/v1/completions", body);
    ASSERT_EQ(r.status, 200) << r.body;
    reference = nlohmann::json::parse(r.body)["choices"][0]["text"];
    (*d)->Stop();
  }
  for (int signal : {SIGKILL, SIGSTOP}) {
    SCOPED_TRACE(signal == SIGKILL ? "SIGKILL" : "SIGSTOP");
    const DeploymentOptions options = Rotational(signal == SIGKILL ? 4000 : 60000);
    auto d = Deployment::Start(options);
    ASSERT_TRUE(d.ok()) << d.status();
    const HttpResponse single = HttpRequest((*d)->http_port(), "POST", "/v1/completions", body);
    ASSERT_EQ(single.status, 200) << single.body;
    EXPECT_EQ(nlohmann::json::parse(single.body)["choices"][0]["text"], reference)
        << "rotation changed the greedy output";
    // The replicas take their plans over their step channels, not gRPC.
    double plans = 0;
    for (const std::string node : {"compute-0", "compute-1", "compute-2"}) {
      plans +=
          MetricSum((*d)->MetricsPort(node), "strata_step_channel_frames_total", "kind=\"plan\"");
    }
    EXPECT_GT(plans, 0) << "no plan came over a replica's step channel";
    constexpr int kClients = 8;
    const absl::Time start = absl::Now();
    ConcurrentRequests clients((*d)->http_port(), body, kClients);
    absl::SleepFor(absl::Milliseconds(400));  // batches are rotating
    const pid_t victim = (*d)->Pid("compute-2");
    ASSERT_EQ(kill(victim, signal), 0);
    const std::vector<HttpResponse> responses = clients.Wait();
    const absl::Duration took = absl::Now() - start;
    if (signal == SIGSTOP) kill(victim, SIGCONT);
    for (int i = 0; i < kClients; ++i) {
      const HttpResponse& r = responses[i];
      ASSERT_EQ(r.status, 200) << "client " << i << ": " << r.body;
      EXPECT_EQ(nlohmann::json::parse(r.body)["choices"][0]["text"], reference) << "client " << i;
    }
    EXPECT_LT(took, absl::Seconds(90)) << "requests took " << absl::FormatDuration(took);
    if (signal == SIGSTOP) {
      // Back, the hung replica registers again (its heartbeats are refused) and rejoins the
      // rotation at its old address: the others gave up only the steps it had been sent,
      // so it takes contexts again, and the text stays the same.
      absl::SleepFor(absl::Seconds(1));  // what waited in its sockets is in
      const int port = (*d)->MetricsPort("compute-2");
      const double contexts = MetricSum(port, "strata_context_frames_total", "kind=\"received\"");
      bool rejoined = false;
      for (const absl::Time until = absl::Now() + absl::Seconds(60);
           !rejoined && absl::Now() < until;) {
        const HttpResponse r = HttpRequest((*d)->http_port(), "POST", "/v1/completions", body);
        ASSERT_EQ(r.status, 200) << r.body;
        EXPECT_EQ(nlohmann::json::parse(r.body)["choices"][0]["text"], reference);
        rejoined = MetricSum(port, "strata_context_frames_total", "kind=\"received\"") > contexts;
      }
      EXPECT_TRUE(rejoined) << "the replica that hung took no context after it came back";
    }
    (*d)->Stop();
  }
}

// With restarts on (the launcher's default), a node that dies comes back by itself.
TEST(FaultTest, TheLauncherRestartsANodeThatDied) {
  DeploymentOptions options;
  options.server_args = {"--served_model_name=tiny"};
  options.memory_nodes = 1;
  options.restart_nodes = true;
  auto d = Deployment::Start(options);
  ASSERT_TRUE(d.ok()) << d.status();
  const std::string body = R"({"model":"tiny","prompt":"Hello there","max_tokens":4})";
  const HttpResponse before = HttpRequest((*d)->http_port(), "POST", "/v1/completions", body);
  ASSERT_EQ(before.status, 200);
  for (const std::string node : {"compute-0", "memory-0"}) {
    const pid_t pid = (*d)->Pid(node);
    ASSERT_GT(pid, 0);
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    // Down (heartbeats missed), then back: restarted, registered and configured again.
    bool down = false, back = false;
    for (int i = 0; i < 600 && !back; ++i) {
      const int health = HttpRequest((*d)->http_port(), "GET", "/health").status;
      const int ok = HttpRequest((*d)->http_port(), "POST", "/v1/completions", body).status;
      down = down || health == 503 || ok != 200;
      back = down && health == 200 && ok == 200;
      absl::SleepFor(absl::Milliseconds(100));
    }
    EXPECT_TRUE(down) << node;
    EXPECT_TRUE(back) << node << " did not come back";
  }
  (*d)->Stop();
}

}  // namespace
}  // namespace strata::testing
