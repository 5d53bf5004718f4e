// HTTP API overhead, against a running server:
//
//   overhead: requests/s and latency of /v1/completions with max_tokens 1, sequential and
//   with --concurrency clients, against the in-process cost of the same requests: the
//   server's own end-to-end latency (scheduler submit to finish, from the
//   strata_e2e_request_latency_seconds histogram scraped before and after). The difference
//   is what HTTP, JSON, tokenization and response building add.
//
//   fanout: --streams concurrent streaming completions; time to open them all, first-event
//   and inter-event figures, and the server's RSS (--server_pid) before and at the peak.
//
//   http_bench --port=8000 --server_pid=1234 --mode=overhead,fanout
//   tests/bench/run_http_bench   (builds, starts a co-located demo deployment, runs both)
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <regex>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "common/base/stopwatch.h"
#include "nlohmann/json.hpp"
#include "tests/common/http_client.h"
#include "tests/common/stream_fanout.h"

ABSL_FLAG(int, port, 8000, "Server HTTP port");
ABSL_FLAG(int, server_pid, 0, "Server process id, for its RSS (0: not reported)");
ABSL_FLAG(std::string, mode, "overhead,fanout", "overhead, fanout, or both");
ABSL_FLAG(int, requests, 200, "Requests per overhead round");
ABSL_FLAG(int, concurrency, 8, "Clients in the concurrent overhead round");
ABSL_FLAG(int, streams, 1000, "Concurrent streams in the fan-out");
ABSL_FLAG(int, stream_tokens, 32, "Tokens per stream");

namespace strata::testing {
namespace {

using json = nlohmann::json;

// Sum and count of the server's e2e latency histogram.
std::pair<double, double> ServerE2e(int port) {
  const std::string text = HttpRequest(port, "GET", "/metrics").body;
  auto value = [&](const std::string& series) {
    const std::regex re(series + "\\{[^}]*\\} ([0-9.e+-]+)");
    std::smatch m;
    return std::regex_search(text, m, re) ? std::stod(m[1]) : 0.0;
  };
  return {value("strata_e2e_request_latency_seconds_sum"),
          value("strata_e2e_request_latency_seconds_count")};
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

void Overhead(int port, const std::string& model) {
  const std::string body =
      json({{"model", model}, {"prompt", "Hello there"}, {"max_tokens", 1}, {"temperature", 0}})
          .dump();
  std::printf("%-12s %8s %9s %11s %11s %11s %12s %10s\n", "round", "requests", "req/s", "client_ms",
              "client_p99", "server_ms", "overhead_ms", "overhead%");
  for (int clients : {1, absl::GetFlag(FLAGS_concurrency)}) {
    const int n = absl::GetFlag(FLAGS_requests);
    const auto [sum0, count0] = ServerE2e(port);
    std::vector<double> latencies(n);
    std::atomic<int> next{0}, failed{0};
    const Stopwatch watch;
    std::vector<std::thread> threads;
    for (int c = 0; c < clients; ++c) {
      threads.emplace_back([&] {
        for (int i = next++; i < n; i = next++) {
          const Stopwatch request;
          if (HttpRequest(port, "POST", "/v1/completions", body).status != 200) ++failed;
          latencies[i] = request.ElapsedSeconds();
        }
      });
    }
    for (auto& t : threads) t.join();
    const double wall = watch.ElapsedSeconds();
    const auto [sum1, count1] = ServerE2e(port);
    double client_mean = 0;
    for (double l : latencies) client_mean += l / n;
    const double server_mean = count1 > count0 ? (sum1 - sum0) / (count1 - count0) : 0;
    std::printf("%-12s %8d %9.1f %11.2f %11.2f %11.2f %12.2f %9.1f%%%s\n",
                clients == 1 ? "sequential" : absl::StrCat(clients, " clients").c_str(), n,
                n / wall, 1e3 * client_mean, 1e3 * Percentile(latencies, 0.99), 1e3 * server_mean,
                1e3 * (client_mean - server_mean), 100 * (client_mean - server_mean) / client_mean,
                failed ? absl::StrCat("  (", failed.load(), " failed)").c_str() : "");
    std::fflush(stdout);
  }
}

void Fanout(int port, const std::string& model, int pid) {
  FanoutOptions o;
  o.port = port;
  o.streams = absl::GetFlag(FLAGS_streams);
  o.body = [&](int i) {
    return json({{"model", model},
                 {"prompt", absl::StrCat("Stream ", i, " begins")},
                 {"max_tokens", absl::GetFlag(FLAGS_stream_tokens)},
                 {"ignore_eos", true},
                 {"stream", true}})
        .dump();
  };
  const long long rss0 = pid > 0 ? RssBytes(pid) : -1;
  long long peak = rss0;
  o.on_tick = [&](double, int) { peak = std::max(peak, pid > 0 ? RssBytes(pid) : -1); };
  const Stopwatch watch;
  const auto stats = RunFanout(o);
  const double wall = watch.ElapsedSeconds();
  std::vector<double> first, gaps;
  int done = 0;
  long long events = 0;
  for (const auto& s : stats) {
    done += s.done;
    events += s.events;
    if (s.first_event_s >= 0) first.push_back(s.first_event_s);
    gaps.push_back(s.max_gap_s);
  }
  std::printf(
      "fan-out: %d streams, %d finished in %.1f s, %lld events (%.0f/s); first event p50 %.2f s "
      "p99 %.2f s; longest gap p50 %.2f s max %.2f s; server RSS %.1f -> %.1f MiB (%.1f KiB "
      "per stream)\n",
      o.streams, done, wall, events, events / wall, Percentile(first, 0.5), Percentile(first, 0.99),
      Percentile(gaps, 0.5), Percentile(gaps, 1.0), rss0 / 1048576.0, peak / 1048576.0,
      (peak - rss0) / 1024.0 / o.streams);
}

int Run() {
  const int port = absl::GetFlag(FLAGS_port);
  HttpResponse models = HttpRequest(port, "GET", "/v1/models");
  if (models.status != 200) {
    std::fprintf(stderr, "no server on port %d\n", port);
    return 1;
  }
  const std::string model = json::parse(models.body)["data"][0]["id"];
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode.find("overhead") != std::string::npos) Overhead(port, model);
  if (mode.find("fanout") != std::string::npos) {
    Fanout(port, model, absl::GetFlag(FLAGS_server_pid));
  }
  return 0;
}

}  // namespace
}  // namespace strata::testing

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return strata::testing::Run();
}
