// /metrics of every process of a disaggregated deployment (server, compute node, two
// memory nodes over UCX tcp): promtool accepts each exposition, the names operators
// expect are there with their labels, and the values agree with what the test did
// (requests finished, tokens generated, bytes that must have crossed the data plane).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/deployment.h"
#include "tests/common/http_client.h"

namespace strata::testing {
namespace {

using json = nlohmann::json;

// Runs `promtool check metrics` on `text`; returns its output and sets *exit_code.
std::string Promtool(const std::string& text, int* exit_code) {
  const std::string path = absl::StrCat(TestTmpDir(), "/metrics-", getpid(), ".txt");
  FILE* f = std::fopen(path.c_str(), "w");
  std::fwrite(text.data(), 1, text.size(), f);
  std::fclose(f);
  FILE* p = popen(("promtool check metrics < " + path + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  *exit_code = WEXITSTATUS(pclose(p));
  return out;
}

// Sample values by their full series text, e.g. `strata_num_requests_running{...}`.
std::map<std::string, double> Samples(const std::string& text) {
  std::map<std::string, double> samples;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    if (space == absl::string_view::npos) continue;
    samples[std::string(line.substr(0, space))] = std::stod(std::string(line.substr(space + 1)));
  }
  return samples;
}

// Sum of the samples whose series matches `pattern` (a regex over the series text).
double Sum(const std::map<std::string, double>& samples, const std::string& pattern) {
  const std::regex re(pattern);
  double total = 0;
  for (const auto& [series, value] : samples) {
    if (std::regex_match(series, re)) total += value;
  }
  return total;
}

class MetricsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    DeploymentOptions options;
    options.memory_nodes = 2;
    options.launcher_args = {"--data_plane=tcp"};
    auto d = Deployment::Start(options);
    ASSERT_TRUE(d.ok()) << d.status();
    deployment_ = d->release();
    HttpResponse models = HttpRequest(deployment_->http_port(), "GET", "/v1/models");
    model_ = json::parse(models.body)["data"][0]["id"];
    // Work to count: 6 requests of 8 tokens, two of them with the same prompt (long
    // enough to fill whole 16-token prefix blocks).
    for (int i = 0; i < 6; ++i) {
      json body = {{"model", model_},
                   {"prompt", absl::StrCat("Request number ", i % 5,
                                           " asks for a story about a lighthouse keeper who "
                                           "finds a map in a bottle on a stormy night")},
                   {"max_tokens", 8},
                   {"ignore_eos", true},
                   {"temperature", 0}};
      HttpResponse r =
          HttpRequest(deployment_->http_port(), "POST", "/v1/completions", body.dump());
      ASSERT_EQ(r.status, 200) << r.body;
      generated_ += json::parse(r.body)["usage"]["completion_tokens"].get<int>();
    }
    ASSERT_EQ(HttpRequest(deployment_->http_port(), "GET", "/no-such-route").status, 404);
  }
  static void TearDownTestSuite() {
    if (deployment_ != nullptr) EXPECT_EQ(deployment_->Stop(), 0);
    delete deployment_;
  }

  static std::string Scrape(const std::string& process) {
    const int port = deployment_->MetricsPort(process);
    EXPECT_GT(port, 0) << process << " has no metrics port";
    HttpResponse r = HttpRequest(port, "GET", "/metrics");
    EXPECT_EQ(r.status, 200) << process;
    return r.body;
  }

  static Deployment* deployment_;
  static std::string model_;
  static int generated_;
};

Deployment* MetricsTest::deployment_ = nullptr;
std::string MetricsTest::model_;
int MetricsTest::generated_ = 0;

TEST_F(MetricsTest, PromtoolAcceptsEveryProcess) {
  for (const std::string process : {"server", "compute-0", "memory-0", "memory-1"}) {
    const std::string text = Scrape(process);
    ASSERT_FALSE(text.empty()) << process;
    int code = -1;
    const std::string out = Promtool(text, &code);
    EXPECT_EQ(code, 0) << process << ": " << out;
    // No colons in metric names (promtool's rule); they may appear in label values only.
    for (const auto& [series, value] : Samples(text)) {
      const std::string name = series.substr(0, series.find('{'));
      EXPECT_EQ(name.find(':'), std::string::npos) << name;
      // prometheus-cpp's exposer adds its own exposer_* metrics on the nodes' ports.
      EXPECT_TRUE(name.rfind("strata_", 0) == 0 || name.rfind("exposer_", 0) == 0) << name;
    }
  }
}

TEST_F(MetricsTest, SchedulerMetricsCountWhatHappened) {
  const auto s = Samples(Scrape("server"));
  const std::string m = "\\{.*model_name=\"" + model_ + "\".*\\}";
  for (const char* name :
       {"strata_num_requests_running", "strata_num_requests_waiting", "strata_kv_cache_usage_perc",
        "strata_prefix_cache_queries_total", "strata_prefix_cache_hits_total",
        "strata_num_preemptions_total", "strata_prompt_tokens_total",
        "strata_generation_tokens_total", "strata_planner_shortfalls_total"}) {
    EXPECT_TRUE(s.count(absl::StrCat(name, "{model_name=\"", model_, "\"}"))) << name;
  }
  EXPECT_EQ(Sum(s, "strata_generation_tokens_total" + m), generated_);
  EXPECT_EQ(Sum(s, "strata_request_success_total\\{.*finished_reason=\"length\".*\\}"), 6);
  EXPECT_EQ(Sum(s, "strata_num_requests_running" + m), 0);
  EXPECT_EQ(Sum(s, "strata_planner_shortfalls_total" + m), 0);
  // The repeated prompt hit the prefix cache.
  EXPECT_GT(Sum(s, "strata_prefix_cache_hits_total" + m), 0);
  EXPECT_GE(Sum(s, "strata_prefix_cache_queries_total" + m),
            Sum(s, "strata_prefix_cache_hits_total" + m));
  for (const char* histogram :
       {"strata_time_to_first_token_seconds", "strata_e2e_request_latency_seconds",
        "strata_request_queue_time_seconds", "strata_request_prefill_time_seconds",
        "strata_request_decode_time_seconds", "strata_request_prompt_tokens",
        "strata_request_generation_tokens"}) {
    EXPECT_EQ(Sum(s, std::string(histogram) + "_count" + m), 6) << histogram;
  }
  // 7 tokens after the first, per request.
  EXPECT_EQ(Sum(s, "strata_inter_token_latency_seconds_count" + m), 6 * 7);
  EXPECT_EQ(Sum(s, "strata_request_generation_tokens_sum" + m), generated_);
  EXPECT_GT(Sum(s, "strata_scheduler_step_seconds_count" + m), 0);
  EXPECT_GT(Sum(s, "strata_scheduler_batch_tokens_count" + m), 0);
  // Per-pool capacity, for both memory nodes.
  for (const std::string pool : {"memory-0", "memory-1"}) {
    EXPECT_GT(Sum(s, "strata_kv_pool_tokens\\{.*pool=\"" + pool + "\".*state=\"total\".*\\}"), 0)
        << pool;
  }
  // HTTP requests by route and status (unknown routes folded into "other").
  EXPECT_EQ(Sum(s, "strata_http_requests_total\\{.*route=\"/v1/completions\".*status=\"200\".*"),
            6);
  EXPECT_EQ(Sum(s, "strata_http_requests_total\\{.*route=\"other\".*status=\"404\".*"), 1);
}

TEST_F(MetricsTest, SplitMetricsShowTheDataPlane) {
  const auto c = Samples(Scrape("compute-0"));
  // Each request's rows went to one of the memory nodes and came back.
  double to_memory = 0;
  for (const std::string peer : {"memory-0", "memory-1"}) {
    to_memory += Sum(c, "strata_data_plane_bytes_total\\{(?=.*peer=\"" + peer +
                            "\")(?=.*direction=\"sent\").*\\}");
  }
  EXPECT_GT(to_memory, 0);
  EXPECT_GT(Sum(c, "strata_data_plane_bytes_total\\{.*direction=\"received\".*\\}"), 0);
  EXPECT_GT(Sum(c, "strata_attention_round_trip_seconds_count\\{.*\\}"), 0);
  EXPECT_EQ(Sum(c, "strata_data_plane_errors_total\\{.*\\}"), 0);
  // How many answers the waiting step thread took itself depends on timing: only exported.
  EXPECT_TRUE(c.count("strata_data_plane_answers_polled_total{node=\"compute-0\"}"));
  EXPECT_TRUE(c.count("strata_pipeline_bubble_ratio{node=\"compute-0\",role=\"compute\"}"));
  EXPECT_GT(Sum(c, "strata_compute_node_steps_total\\{.*\\}"), 0);
  // Several steps on one stream: the node waited for each next plan, and says how long.
  EXPECT_GT(Sum(c, "strata_compute_node_plan_wait_seconds_count\\{.*\\}"), 0);
  // The plans came over the step channel on the data plane, none refused, each answered
  // (a plan sent ahead of a finished request's last step may still be running: looked at
  // again until it is back).
  const std::string kind = "strata_step_channel_frames_total\\{.*kind=\"";
  EXPECT_GT(Sum(c, kind + "plan\".*\\}"), 0);
  EXPECT_EQ(Sum(c, kind + "refused\".*\\}"), 0);
  auto step_frames = c;
  for (int i = 0;
       i < 50 && Sum(step_frames, kind + "result\".*\\}") != Sum(step_frames, kind + "plan\".*\\}");
       ++i) {
    absl::SleepFor(absl::Milliseconds(40));
    step_frames = Samples(Scrape("compute-0"));
  }
  EXPECT_EQ(Sum(step_frames, kind + "result\".*\\}"), Sum(step_frames, kind + "plan\".*\\}"));

  double memory_received = 0, attention = 0;
  for (const std::string node : {"memory-0", "memory-1"}) {
    const auto m = Samples(Scrape(node));
    memory_received += Sum(m, "strata_data_plane_bytes_total\\{.*direction=\"received\".*\\}");
    attention += Sum(m, "strata_memory_node_attention_seconds_total\\{.*\\}");
    EXPECT_GT(Sum(m, "strata_memory_node_kv_tokens\\{.*state=\"total\".*\\}"), 0) << node;
    EXPECT_TRUE(
        m.count(absl::StrCat("strata_pipeline_bubble_ratio{node=\"", node, "\",role=\"memory\"}")));
    EXPECT_EQ(Sum(m, "strata_data_plane_errors_total\\{.*\\}"), 0);
    // Nothing loads from disk here: nothing waits for it, and the gauge says so.
    EXPECT_TRUE(m.count(absl::StrCat("strata_memory_node_parked_frames{node=\"", node, "\"}")))
        << node;
    EXPECT_EQ(Sum(m, "strata_memory_node_parked_frames\\{.*\\}"), 0) << node;
  }
  // What the compute node sent is what the memory nodes received.
  EXPECT_EQ(memory_received, to_memory);
  EXPECT_GT(attention, 0);
}

TEST_F(MetricsTest, EveryMetricTheDashboardsUseIsExported) {
  std::set<std::string> exported;
  for (const std::string process : {"server", "compute-0", "memory-0", "memory-1"}) {
    for (const auto& [series, value] : Samples(Scrape(process))) {
      exported.insert(series.substr(0, series.find('{')));
    }
  }
  int used = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(RunfilesRoot() + "/deploy/grafana")) {
    if (entry.path().extension() != ".json") continue;
    std::ifstream in(entry.path());
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::regex name("strata_[a-z0-9_]+");
    for (auto it = std::sregex_iterator(text.begin(), text.end(), name);
         it != std::sregex_iterator(); ++it) {
      ++used;
      EXPECT_TRUE(exported.count(it->str()))
          << entry.path().filename() << " uses " << it->str() << ", which no process exports";
    }
  }
  EXPECT_GT(used, 20);
}

}  // namespace
}  // namespace strata::testing
