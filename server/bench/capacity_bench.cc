// Capacity benchmark (prints figures; no assertion): how many 2k-token sequences fit at
// once, co-located (1 GiB of KV on the compute node) against disaggregated (two memory
// nodes of 4 GiB each, UCX shared memory), on the demo shape, with the real scheduler and
// forward pass. It reports:
//   - the most sequences running at once, and the generation throughput at that point;
//   - live KV tokens over the KV budget at the peak (token-granular allocation), and what
//     16-token pages would have wasted on the same sequences;
//   - in disaggregated mode, this process's (the compute node's) RSS growth per admitted
//     sequence.
//
//   bazel build -c opt //server/bench:capacity_bench //memory_node:memory_node
//   bazel-bin/server/bench/capacity_bench --prompt_tokens=2048
#include <omp.h>

#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <random>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/base/stopwatch.h"
#include "common/bench/demo_model.h"
#include "compute_node/attention_backend.h"
#include "compute_node/bench/memory_nodes.h"
#include "compute_node/model_runner.h"
#include "compute_node/model_weights.h"
#include "compute_node/remote_attention.h"
#include "compute_node/step_engine.h"
#include "server/scheduler.h"
#include "server/testing/in_process_executor.h"

ABSL_FLAG(std::string, model, "", "Model directory (default: the demo shape in /tmp)");
ABSL_FLAG(std::string, modes, "colocated,disaggregated", "Which modes to run");
ABSL_FLAG(int, prompt_tokens, 2048, "Prompt length of every sequence");
ABSL_FLAG(int, max_tokens, 160,
          "Tokens generated per sequence: enough that the first sequences still decode when "
          "the budget fills up");
ABSL_FLAG(int64_t, colocated_kv_mib, 1024, "KV budget of the compute node, co-located");
ABSL_FLAG(int64_t, memory_kv_mib, 4096, "KV budget per memory node");
ABSL_FLAG(int, memory_nodes, 2, "Memory nodes, disaggregated");
ABSL_FLAG(std::string, tls, "sm,self,tcp", "UCX transports for the data plane");
ABSL_FLAG(double, oversubscribe, 1.15, "Sequences submitted, over what the budget holds");

namespace strata {
namespace {

int64_t RssBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return 0;
}

struct Result {
  int64_t submitted = 0;
  int64_t peak_running = 0;
  double peak_kv_fraction = 0;  // used slots / total slots at the peak
  double paged_waste = 0;       // slots 16-token pages would waste / total slots, at the peak
  double decode_tok_s = 0;      // generated tokens per second while the most sequences run
  double rss_per_sequence = 0;  // compute-node RSS growth per admitted sequence
  int64_t kv_tokens = 0;        // budget in tokens
  double seconds = 0;
};

Result RunMode(const ModelWeights& weights, bool disaggregated) {
  const ModelConfig& c = weights.config;
  const int64_t per_token = 2LL * c.num_layers * c.kv_size() * 2;
  const int prompt = absl::GetFlag(FLAGS_prompt_tokens);
  const int max_tokens = absl::GetFlag(FLAGS_max_tokens);
  SchedulerConfig config;
  config.max_model_len = prompt + max_tokens + 64;
  config.max_num_seqs = 1024;
  config.max_num_batched_tokens = 2048;
  config.max_prefill_tokens = 2048;
  config.prefill_chunk_tokens = 512;
  config.max_waiting = 100000;
  config.block_tokens = 16;
  config.enable_prefix_caching = false;  // every prompt is distinct anyway
  config.vocab_size = static_cast<int32_t>(c.vocab_size);
  config.epoch = 1;
  Scheduler scheduler(config, nullptr);
  ModelRunner runner(&weights, config.max_model_len);
  Supervisor supervisor;
  std::unique_ptr<AttentionBackend> attention;
  Result result;
  if (disaggregated) {
    const int64_t slots = (absl::GetFlag(FLAGS_memory_kv_mib) << 20) / per_token;
    const int n = absl::GetFlag(FLAGS_memory_nodes);
    auto nodes = bench::StartMemoryNodes(supervisor, bench::MemoryNodeBinary(), n,
                                         absl::GetFlag(FLAGS_tls), /*pin=*/true, c, slots);
    if (!nodes.ok()) {
      std::fprintf(stderr, "%s\n", std::string(nodes.status().message()).c_str());
      std::exit(1);
    }
    RemoteAttentionOptions options;
    options.transport.ucx_options = {{"TLS", absl::GetFlag(FLAGS_tls)}, {"NET_DEVICES", "lo"}};
    options.transport.error_mode = transport::ErrorMode::kNone;
    options.transport.auth_key = bench::BenchAuth()->data_plane_key();
    options.layer_timeout = absl::Seconds(120);
    auto remote = RemoteAttention::Create(c, options);
    if (!remote.ok()) std::exit(1);
    (*remote)->SetMemoryNodes(1, bench::Addresses(*nodes));
    attention = std::move(*remote);
    for (int i = 0; i < n; ++i) scheduler.AddPool(absl::StrCat("memory-", i), slots);
    result.kv_tokens = slots * n;
  } else {
    const int64_t slots = (absl::GetFlag(FLAGS_colocated_kv_mib) << 20) / per_token;
    attention = std::move(*LocalAttention::Create(c, slots, true));
    result.kv_tokens = slots;
  }
  StepEngine engine(&runner, attention.get(),
                    {config.max_num_batched_tokens, config.max_model_len});
  scheduler.AddExecutor(std::make_unique<InProcessExecutor>("compute-0", &engine),
                        disaggregated ? std::nullopt : std::optional<PoolIndex>(PoolIndex(0)));
  if (!disaggregated) scheduler.AddPool("local", result.kv_tokens);
  scheduler.Start();

  const int64_t per_sequence = prompt + max_tokens;
  result.submitted =
      static_cast<int64_t>(absl::GetFlag(FLAGS_oversubscribe) * result.kv_tokens / per_sequence) +
      1;
  std::mutex mu;
  std::condition_variable cv;
  int64_t finished = 0;
  std::mt19937 rng(5);
  const int64_t rss_before = RssBytes();
  const Stopwatch watch;
  for (int64_t i = 0; i < result.submitted; ++i) {
    GenerateRequest r;
    for (int t = 0; t < prompt; ++t) r.prompt_tokens.push_back(3 + rng() % 31000);
    r.sampling.temperature = 0;
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    auto id = scheduler.Submit(std::move(r), [&](const RequestUpdate& u) {
      if (!u.finished) return;
      std::lock_guard<std::mutex> lock(mu);
      ++finished;
      cv.notify_all();
    });
    if (!id.ok()) std::exit(1);
  }
  // Sample the scheduler until everything finished.
  int64_t last_generated = 0;
  Stopwatch since_last;
  int64_t rss_at_peak = rss_before;
  std::vector<double> decode_rates;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu);
      if (cv.wait_for(lock, absl::ToChronoNanoseconds(absl::Milliseconds(500)),
                      [&] { return finished >= result.submitted; })) {
        break;
      }
    }
    const SchedulerStats s = scheduler.Stats();
    const double interval = since_last.ElapsedSeconds();
    since_last.Reset();
    int64_t used = 0, total = 0;
    for (const PoolStatus& p : s.pools) {
      if (!p.alive) continue;
      used += p.stats.used_slots;
      total += p.stats.total_slots;
    }
    if (s.num_running > result.peak_running) {
      result.peak_running = s.num_running;
      result.peak_kv_fraction = total > 0 ? static_cast<double>(used) / total : 0;
      result.paged_waste = total > 0 ? static_cast<double>(s.kv_paged_waste_slots) / total : 0;
      rss_at_peak = RssBytes();
    } else if (s.num_running == result.peak_running && total > 0) {
      result.peak_kv_fraction =
          std::max(result.peak_kv_fraction, static_cast<double>(used) / total);
    }
    // Throughput while the most sequences run (prompts of replacements may ride along).
    if (s.num_running == result.peak_running && s.generation_tokens_total > last_generated) {
      decode_rates.push_back((s.generation_tokens_total - last_generated) / interval);
    }
    last_generated = s.generation_tokens_total;
  }
  result.seconds = watch.ElapsedSeconds();
  if (!decode_rates.empty()) {
    std::sort(decode_rates.begin(), decode_rates.end());
    result.decode_tok_s = decode_rates[decode_rates.size() / 2];
  }
  result.rss_per_sequence =
      result.peak_running > 0 ? static_cast<double>(rss_at_peak - rss_before) / result.peak_running
                              : 0;
  scheduler.Stop();
  supervisor.StopAll(absl::Seconds(5));
  return result;
}

int Run() {
  absl::StatusOr<std::string> model_dir = BenchModelDir(absl::GetFlag(FLAGS_model));
  if (!model_dir.ok()) {
    std::fprintf(stderr, "%s\n", model_dir.status().ToString().c_str());
    return 1;
  }
  const std::string& dir = *model_dir;
  auto config = LoadModelConfig(dir);
  if (!config.ok()) return 1;
  auto weights = ModelWeights::Load(dir, *config);
  if (!weights.ok()) return 1;
  const int64_t per_token = 2LL * config->num_layers * config->kv_size() * 2;
  std::printf(
      "capacity: demo shape (%lld KV bytes per token), %d-token prompts, %d generated, "
      "%d threads\n",
      static_cast<long long>(per_token), absl::GetFlag(FLAGS_prompt_tokens),
      absl::GetFlag(FLAGS_max_tokens), omp_get_max_threads());
  std::printf("%14s %10s %9s %12s %9s %11s %11s %14s %8s\n", "mode", "kv_tokens", "submitted",
              "max_running", "kv_used", "paged_waste", "decode_t/s", "rss_per_seq_B", "seconds");
  std::vector<std::pair<std::string, Result>> results;
  for (const std::string mode : {"colocated", "disaggregated"}) {
    if (absl::GetFlag(FLAGS_modes).find(mode) == std::string::npos) continue;
    const Result r = RunMode(**weights, mode == "disaggregated");
    std::printf("%14s %10lld %9lld %12lld %8.1f%% %10.2f%% %11.1f %14.0f %8.1f\n", mode.c_str(),
                static_cast<long long>(r.kv_tokens), static_cast<long long>(r.submitted),
                static_cast<long long>(r.peak_running), 100 * r.peak_kv_fraction,
                100 * r.paged_waste, r.decode_tok_s, r.rss_per_sequence, r.seconds);
    std::fflush(stdout);
    results.emplace_back(mode, r);
  }
  if (results.size() == 2 && results[0].second.peak_running > 0) {
    std::printf(
        "max concurrent sequences, disaggregated over co-located: %.1fx (Lamina reports "
        "10.7x-64x larger batches on its hardware)\n",
        static_cast<double>(results[1].second.peak_running) / results[0].second.peak_running);
  }
  return 0;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return strata::Run();
}
