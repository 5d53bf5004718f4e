// Request-level benchmark client: replays a synthetic workload against a running strata
// server and reports what `vllm bench serve` reports: request throughput, output tokens/s,
// and mean/p50/p99 of time to first token (TTFT), time per output token (TPOT),
// inter-token latency (ITL) and end-to-end latency.
//
// Workload: sessions arrive as a Poisson process at --rate per second. Prompt and output
// lengths are drawn from log-normal distributions shaped like ShareGPT's (a long right
// tail, scaled to this CPU model by --prompt_median and --output_median). A fraction of
// sessions (--multi_turn) have 2-4 turns: each later turn resends the whole history (the
// earlier prompts and the tokens the server generated) plus a new user message, after a
// think time, so that prefix reuse matters as it does for chat. Prompts are token ids, so
// the client needs no tokenizer. --sessions shapes conversations like ShareGPT's (73%
// multi-turn, 5.75 turns on average) and reports cached prompt tokens per request and the
// server's hits by tier (tests/bench/run_session_bench compares recompute, the DRAM prefix
// cache and the disk tier).
//
//   serve_bench --port=8000 --rate=2 --duration_s=60
//   tests/bench/run_serve_bench   (builds, starts deployments, sweeps the offered load)
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/stopwatch.h"
#include "nlohmann/json.hpp"
#include "tests/common/http_client.h"

ABSL_FLAG(std::string, host, "127.0.0.1", "Server address (IPv4)");
ABSL_FLAG(int, port, 8000, "Server HTTP port");
ABSL_FLAG(std::string, model, "", "Model name (default: the first of /v1/models)");
ABSL_FLAG(double, rate, 1.0, "Sessions per second (Poisson arrivals)");
ABSL_FLAG(double, duration_s, 60, "How long new sessions keep arriving");
ABSL_FLAG(int, prompt_median, 120, "Median prompt length, tokens");
ABSL_FLAG(int, output_median, 60, "Median output length, tokens");
ABSL_FLAG(int, max_prompt, 1024, "Longest prompt, tokens");
ABSL_FLAG(int, max_output, 256, "Longest output, tokens");
ABSL_FLAG(double, multi_turn, 0.3, "Fraction of sessions with several turns");
ABSL_FLAG(double, mean_turns, 3,
          "Mean turns of a multi-turn session (2 plus a geometric number; ShareGPT: 5.75)");
ABSL_FLAG(bool, sessions, false,
          "Session mode (the disk tier's benchmark): ShareGPT's conversation shape (73% "
          "multi-turn, 5.75 turns on average, unless set), and a report of cached prompt tokens "
          "per request and, from the server's /metrics, hits by tier and prefill computed");
ABSL_FLAG(double, think_s, 1.0, "Mean think time between turns, seconds");
ABSL_FLAG(int, vocab, 32000, "Token ids are drawn from [3, vocab)");
ABSL_FLAG(uint32_t, seed, 1, "Workload seed");
ABSL_FLAG(std::string, label, "", "Label printed with the result line");
ABSL_FLAG(bool, dry_run, false, "Print the workload's sessions and turns, and send nothing");
ABSL_FLAG(bool, header, true, "Print the header line");

namespace strata::testing {
namespace {

using json = nlohmann::json;

struct RequestRecord {
  bool ok = false;
  std::string error;
  int prompt_tokens = 0;
  int output_tokens = 0;
  int cached_tokens = 0;  // usage.prompt_tokens_details.cached_tokens
  int turn = 0;           // of its session, from 0
  double ttft = 0, e2e = 0;
  std::vector<double> itl;  // gaps between token chunks
};

struct Turn {
  std::vector<int> new_tokens;
  int max_tokens;
};

struct Session {
  double arrival = 0;  // seconds from the start
  std::vector<Turn> turns;
};

class Workload {
 public:
  explicit Workload(uint32_t seed) : rng_(seed) {}

  int LogNormal(double median, double sigma, int lo, int hi) {
    std::lognormal_distribution<double> d(std::log(median), sigma);
    return std::clamp(static_cast<int>(d(rng_)), lo, hi);
  }
  std::vector<int> Tokens(int n) {
    std::vector<int> out(n);
    for (int& t : out) t = 3 + static_cast<int>(rng_() % (absl::GetFlag(FLAGS_vocab) - 3));
    return out;
  }
  std::vector<Session> Sessions() {
    std::vector<Session> out;
    std::exponential_distribution<double> gap(absl::GetFlag(FLAGS_rate));
    std::uniform_real_distribution<double> unit(0, 1);
    double t = 0;
    while (true) {
      t += gap(rng_);
      if (t > absl::GetFlag(FLAGS_duration_s)) break;
      Session s;
      s.arrival = t;
      // Turns past the second: geometric, so that multi-turn sessions average --mean_turns.
      std::geometric_distribution<int> more(1.0 /
                                            std::max(1.0, absl::GetFlag(FLAGS_mean_turns) - 1.0));
      const int turns =
          unit(rng_) < absl::GetFlag(FLAGS_multi_turn) ? std::min(2 + more(rng_), 32) : 1;
      for (int i = 0; i < turns; ++i) {
        // Later turns add a shorter user message to the resent history.
        const double median = absl::GetFlag(FLAGS_prompt_median) * (i == 0 ? 1.0 : 0.4);
        s.turns.push_back({Tokens(LogNormal(median, 0.9, 4, absl::GetFlag(FLAGS_max_prompt))),
                           LogNormal(absl::GetFlag(FLAGS_output_median), 0.7, 2,
                                     absl::GetFlag(FLAGS_max_output))});
      }
      out.push_back(std::move(s));
    }
    return out;
  }
  double Think() {
    std::exponential_distribution<double> d(1.0 / std::max(1e-3, absl::GetFlag(FLAGS_think_s)));
    return d(rng_);
  }

 private:
  std::mt19937 rng_;
};

// One streamed completion; `generated` gets the token ids the server produced.
RequestRecord Complete(const std::string& model, const std::vector<int>& prompt, int max_tokens,
                       std::vector<int>* generated) {
  RequestRecord rec;
  rec.prompt_tokens = static_cast<int>(prompt.size());
  json body = {{"model", model},
               {"prompt", prompt},
               {"max_tokens", max_tokens},
               {"temperature", 0.8},
               {"top_p", 0.95},
               {"ignore_eos", true},
               {"stream", true},
               {"logprobs", 0},
               {"return_tokens_as_token_ids", true},
               {"stream_options", {{"include_usage", true}}}};
  const Stopwatch watch;
  double last = 0;  // seconds from the start to the previous token event
  bool first = true;
  std::string pending;
  HttpResponse r = HttpRequest(
      absl::GetFlag(FLAGS_port), "POST", "/v1/completions", body.dump(), {},
      [&](const std::string& chunk) {
        pending += chunk;
        // Token events carry text or logprobs; time them as they arrive.
        size_t end;
        while ((end = pending.find("\n\n")) != std::string::npos) {
          const std::string event = pending.substr(0, end);
          pending.erase(0, end + 2);
          if (!absl::StartsWith(event, "data: ") || event == "data: [DONE]") continue;
          json j = json::parse(event.substr(6), nullptr, false);
          if (j.is_discarded()) continue;
          if (j.contains("usage") && j["usage"].is_object()) {
            const json& details = j["usage"]["prompt_tokens_details"];
            if (details.is_object() && details.contains("cached_tokens")) {
              rec.cached_tokens = details["cached_tokens"].get<int>();
            }
          }
          if (!j.contains("choices") || j["choices"].empty()) continue;
          const json& lp = j["choices"][0]["logprobs"];
          int n = 0;
          if (lp.is_object() && lp.contains("tokens")) {
            for (const auto& t : lp["tokens"]) {
              int id = 0;
              const std::string s = t.get<std::string>();
              if (absl::SimpleAtoi(s.substr(s.find(':') + 1), &id)) generated->push_back(id);
              ++n;
            }
          }
          if (n == 0) continue;
          const double now = watch.ElapsedSeconds();
          if (first) {
            rec.ttft = now;
            first = false;
          } else {
            rec.itl.push_back(now - last);
          }
          last = now;
          rec.output_tokens += n;
        }
        return true;
      },
      600);
  rec.e2e = watch.ElapsedSeconds();
  rec.ok = r.status == 200 && rec.output_tokens > 0;
  if (!rec.ok) rec.error = absl::StrCat("HTTP ", r.status, ": ", r.body.substr(0, 200));
  return rec;
}

struct Stats {
  double mean = 0, p50 = 0, p99 = 0;
};

Stats Summarize(std::vector<double> v) {
  Stats s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / v.size();
  s.p50 = v[v.size() / 2];
  s.p99 = v[std::min(v.size() - 1, static_cast<size_t>(v.size() * 0.99))];
  return s;
}

// The server's counters this report needs, by series (name and labels as exposed).
std::map<std::string, double> ScrapeMetrics() {
  std::map<std::string, double> out;
  const HttpResponse r = HttpRequest(absl::GetFlag(FLAGS_port), "GET", "/metrics");
  if (r.status != 200) return out;
  for (absl::string_view line : absl::StrSplit(r.body, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    if (!absl::StartsWith(line, "strata_prefix_cache") &&
        !absl::StartsWith(line, "strata_prefill_tokens_computed") &&
        !absl::StartsWith(line, "strata_prompt_tokens_total")) {
      continue;
    }
    const size_t space = line.rfind(' ');
    double v = 0;
    if (space != absl::string_view::npos && absl::SimpleAtod(line.substr(space + 1), &v)) {
      std::string series(line.substr(0, space));
      // Keep the tier label alone: the model name differs by deployment.
      const size_t tier = series.find("tier=\"");
      const size_t brace = series.find('{');
      if (brace != std::string::npos) {
        series = series.substr(0, brace) +
                 (tier != std::string::npos
                      ? "{" + series.substr(tier, series.find('"', tier + 6) + 1 - tier) + "}"
                      : "");
      }
      out[series] += v;
    }
  }
  return out;
}

// Session mode's report: cached prompt tokens per request (all, and later turns alone), hit
// rate overall and by tier, prefill tokens computed, and TTFT of later turns.
void PrintSessions(const std::vector<RequestRecord>& records,
                   const std::map<std::string, double>& before,
                   const std::map<std::string, double>& after) {
  auto delta = [&](const std::string& series) {
    const auto a = after.find(series);
    const auto b = before.find(series);
    return (a == after.end() ? 0 : a->second) - (b == before.end() ? 0 : b->second);
  };
  int64_t prompt = 0, cached = 0, later = 0, later_prompt = 0, later_cached = 0;
  std::vector<double> later_ttft;
  for (const RequestRecord& r : records) {
    if (!r.ok) continue;
    prompt += r.prompt_tokens;
    cached += r.cached_tokens;
    if (r.turn > 0) {
      ++later;
      later_prompt += r.prompt_tokens;
      later_cached += r.cached_tokens;
      later_ttft.push_back(r.ttft);
    }
  }
  const double queried = delta("strata_prefix_cache_queries_total");
  const double dram = delta("strata_prefix_cache_tier_hits_total{tier=\"dram\"}");
  const double disk = delta("strata_prefix_cache_tier_hits_total{tier=\"disk\"}");
  const Stats t = Summarize(later_ttft);
  std::printf(
      "sessions %-14s requests %zu (later turns %lld): cached %.1f%% of prompt tokens "
      "(%.0f per request; later turns %.1f%%); server hits %.1f%% (dram %.1f%%, disk %.1f%%) "
      "of %.0f looked up; hits served from DRAM %.1f%% (AttentionStore: over 99.6%% "
      "scheduler-aware, about 0.5%% LRU or FIFO); prefill computed %.0f of %.0f prompt "
      "tokens; later-turn TTFT ms p50/p99 %d/%d\n",
      absl::GetFlag(FLAGS_label).c_str(), records.size(), static_cast<long long>(later),
      prompt > 0 ? 100.0 * cached / prompt : 0.0,
      records.empty() ? 0.0 : static_cast<double>(cached) / records.size(),
      later_prompt > 0 ? 100.0 * later_cached / later_prompt : 0.0,
      queried > 0 ? 100.0 * (dram + disk) / queried : 0.0,
      queried > 0 ? 100.0 * dram / queried : 0.0, queried > 0 ? 100.0 * disk / queried : 0.0,
      queried, dram + disk > 0 ? 100.0 * dram / (dram + disk) : 0.0,
      delta("strata_prefill_tokens_computed_total"), delta("strata_prompt_tokens_total"),
      static_cast<int>(t.p50 * 1e3), static_cast<int>(t.p99 * 1e3));
}

int Run() {
  SetHttpHost(absl::GetFlag(FLAGS_host));
  std::string model = absl::GetFlag(FLAGS_model);
  if (model.empty() && !absl::GetFlag(FLAGS_dry_run)) {
    json models = json::parse(HttpRequest(absl::GetFlag(FLAGS_port), "GET", "/v1/models").body,
                              nullptr, false);
    if (models.is_discarded() || models["data"].empty()) {
      std::fprintf(stderr, "no model at %s:%d\n", absl::GetFlag(FLAGS_host).c_str(),
                   absl::GetFlag(FLAGS_port));
      return 1;
    }
    model = models["data"][0]["id"];
  }
  if (absl::GetFlag(FLAGS_sessions)) {
    // ShareGPT's shape, as AttentionStore measured it, where the flags were left alone.
    if (absl::GetFlag(FLAGS_multi_turn) == 0.3) absl::SetFlag(&FLAGS_multi_turn, 0.73);
    if (absl::GetFlag(FLAGS_mean_turns) == 3) absl::SetFlag(&FLAGS_mean_turns, 5.75);
  }
  const std::map<std::string, double> metrics_before = ScrapeMetrics();
  Workload workload(absl::GetFlag(FLAGS_seed));
  const std::vector<Session> sessions = workload.Sessions();
  if (absl::GetFlag(FLAGS_dry_run)) {
    size_t turns = 0;
    for (const Session& s : sessions) {
      turns += s.turns.size();
      std::printf("session at %.1f s: %zu turns, first prompt %zu tokens\n", s.arrival,
                  s.turns.size(), s.turns[0].new_tokens.size());
    }
    std::printf("%zu sessions, %zu turns\n", sessions.size(), turns);
    return 0;
  }
  std::mutex mu;
  std::vector<RequestRecord> records;
  std::vector<std::thread> threads;
  const Stopwatch watch;
  for (const Session& session : sessions) {
    absl::SleepFor(absl::Seconds(session.arrival) - watch.Elapsed());
    const double think = workload.Think();
    threads.emplace_back([&, session, think] {
      std::vector<int> history;
      int index = 0;
      for (const Turn& turn : session.turns) {
        history.insert(history.end(), turn.new_tokens.begin(), turn.new_tokens.end());
        if (static_cast<int>(history.size()) > absl::GetFlag(FLAGS_max_prompt)) {
          break;  // the conversation outgrew the context this run allows
        }
        std::vector<int> generated;
        RequestRecord rec = Complete(model, history, turn.max_tokens, &generated);
        rec.turn = index++;
        const bool ok = rec.ok;
        {
          std::lock_guard<std::mutex> lock(mu);
          records.push_back(std::move(rec));
        }
        if (!ok) break;
        history.insert(history.end(), generated.begin(), generated.end());
        absl::SleepFor(absl::Seconds(think));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const double elapsed = watch.ElapsedSeconds();

  std::vector<double> ttft, tpot, itl, e2e;
  int64_t ok = 0, failed = 0, output = 0, input = 0;
  std::string first_error;
  for (const RequestRecord& r : records) {
    if (!r.ok) {
      ++failed;
      if (first_error.empty()) first_error = r.error;
      continue;
    }
    ++ok;
    output += r.output_tokens;
    input += r.prompt_tokens;
    ttft.push_back(r.ttft);
    e2e.push_back(r.e2e);
    if (r.output_tokens > 1) tpot.push_back((r.e2e - r.ttft) / (r.output_tokens - 1));
    itl.insert(itl.end(), r.itl.begin(), r.itl.end());
  }
  if (absl::GetFlag(FLAGS_header)) {
    std::printf("%-14s %6s %6s %5s %7s %8s %9s  %-20s %-20s %-20s %-20s\n", "label", "rate", "done",
                "fail", "req/s", "out_t/s", "in_t/s", "TTFT ms mean/p50/p99",
                "TPOT ms mean/p50/p99", "ITL ms mean/p50/p99", "E2E s mean/p50/p99");
  }
  auto ms = [](const Stats& s) {
    return absl::StrCat(static_cast<int>(s.mean * 1e3), "/", static_cast<int>(s.p50 * 1e3), "/",
                        static_cast<int>(s.p99 * 1e3));
  };
  auto sec = [](const Stats& s) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.2f/%.2f/%.2f", s.mean, s.p50, s.p99);
    return std::string(buf);
  };
  std::printf("%-14s %6.2f %6lld %5lld %7.2f %8.1f %9.1f  %-20s %-20s %-20s %-20s\n",
              absl::GetFlag(FLAGS_label).c_str(), absl::GetFlag(FLAGS_rate),
              static_cast<long long>(ok), static_cast<long long>(failed), ok / elapsed,
              output / elapsed, input / elapsed, ms(Summarize(ttft)).c_str(),
              ms(Summarize(tpot)).c_str(), ms(Summarize(itl)).c_str(), sec(Summarize(e2e)).c_str());
  if (absl::GetFlag(FLAGS_sessions)) PrintSessions(records, metrics_before, ScrapeMetrics());
  if (!first_error.empty()) std::printf("first error: %s\n", first_error.c_str());
  return failed == 0 ? 0 : 2;
}

}  // namespace
}  // namespace strata::testing

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return strata::testing::Run();
}
