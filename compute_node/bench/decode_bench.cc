// Decode benchmark on the demo shape (issue: foundation). Prints, for batch sizes 1, 8, 32
// and 64 at contexts 256 and 2048:
//   - tokens/s of a full decode step (all layers, LM head, greedy sampling);
//   - the same step with attention skipped ("GEMM-only"), and the ratio of the two;
//   - at batch 1, the fraction of the memory-bandwidth bound: (bytes of weights and KV read
//     per step) / (read bandwidth of a streaming-read probe on all cores, measured in the
//     same run);
//   - attention's own KV read rate, against the same probe.
// The KV cache is filled with random values instead of a prefill; attention's cost does
// not depend on the values. Figures only: no assertion.
//
//   bazel run -c opt //compute_node/bench:decode_bench -- [--model=DIR] [--batches=1,8,32,64]
#include <immintrin.h>
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/base/bfloat16.h"
#include "common/model/model_generator.h"
#include "compute_node/attention_backend.h"
#include "compute_node/model_runner.h"
#include "compute_node/model_weights.h"
#include "compute_node/sampler.h"
#include "kernels/cpu/isa.h"

ABSL_FLAG(std::string, model, "", "Model directory (default: generate the demo shape in /tmp)");
ABSL_FLAG(std::string, batches, "1,8,32,64", "Batch sizes");
ABSL_FLAG(std::string, contexts, "256,2048", "Context lengths");
ABSL_FLAG(int, iters, 20, "Timed steps per configuration");

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// Best-of-5 streaming read bandwidth (bytes/s) over a buffer larger than the caches, on
// all threads. Loads only: a copy would count its bytes twice.
double ReadProbe() {
  const size_t bytes = 1ull << 30;
  char* buffer = static_cast<char*>(aligned_alloc(64, bytes));
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < bytes; i += 4096) std::memset(buffer + i, 1, 4096);
  double best = 0;
  for (int round = 0; round < 5; ++round) {
    const auto t0 = Clock::now();
    int64_t sink = 0;
#pragma omp parallel reduction(+ : sink)
    {
      const int n = omp_get_num_threads(), id = omp_get_thread_num();
      const size_t per = bytes / n;
      const __m512i* p = reinterpret_cast<const __m512i*>(buffer + per * id);
      __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
      for (size_t i = 0; i < per / 64; i += 4) {
        a0 = _mm512_add_epi64(a0, _mm512_load_si512(p + i));
        a1 = _mm512_add_epi64(a1, _mm512_load_si512(p + i + 1));
        a2 = _mm512_add_epi64(a2, _mm512_load_si512(p + i + 2));
        a3 = _mm512_add_epi64(a3, _mm512_load_si512(p + i + 3));
      }
      sink += _mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
    }
    const double s = Seconds(t0, Clock::now());
    if (sink == 42) std::puts("");
    best = std::max(best, bytes / s);
  }
  free(buffer);
  return best;
}

// Attention that does nothing: the GEMM-only baseline.
class NoAttention : public AttentionBackend {
 public:
  absl::Status BeginStep(const StepKvPlan&) override { return absl::OkStatus(); }
  absl::Status Attend(int, BatchBuffers&, int64_t) override { return absl::OkStatus(); }
};

std::vector<int> ParseList(const std::string& s) {
  std::vector<int> out;
  for (absl::string_view piece : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    int v;
    if (absl::SimpleAtoi(piece, &v)) out.push_back(v);
  }
  return out;
}

int Run() {
  std::string dir = absl::GetFlag(FLAGS_model);
  if (dir.empty()) {
    dir = "/tmp/strata-bench-demo";
    if (!std::filesystem::exists(dir + "/config.json")) {
      auto shape = NamedModelShape("demo");
      if (!GenerateModel(*shape, {}, dir).ok()) return 1;
    }
  }
  auto config = LoadModelConfig(dir);
  if (!config.ok()) return 1;
  auto weights = ModelWeights::Load(dir, *config);
  if (!weights.ok()) {
    std::fprintf(stderr, "%s\n", std::string(weights.status().message()).c_str());
    return 1;
  }
  const ModelConfig& c = *config;
  const int threads = omp_get_max_threads();
  const double probe = ReadProbe();
  const double weight_bytes = static_cast<double>((*weights)->gemm_weight_bytes());
  const double kv_bytes_per_pos = 2.0 * c.num_layers * c.kv_size() * 2;
  std::printf("decode benchmark: %s, %.1fM parameters, %d threads, %s kernels\n", dir.c_str(),
              c.NumParameters() / 1e6, threads, kernels::CpuIsaName(kernels::ActiveCpuIsa()));
  std::printf("read probe (all cores, loads only): %.1f GB/s; GEMM weights %.1f MB\n", probe / 1e9,
              weight_bytes / 1e6);
  std::printf("%6s %6s %10s %10s %10s %8s %10s %12s %10s\n", "batch", "ctx", "step_ms", "tok/s",
              "gemm_ms", "vs_gemm", "bound_frac", "attn_KV_GB/s", "KV_frac");
  const int iters = absl::GetFlag(FLAGS_iters);
  for (int ctx : ParseList(absl::GetFlag(FLAGS_contexts))) {
    for (int batch : ParseList(absl::GetFlag(FLAGS_batches))) {
      const int64_t slots = static_cast<int64_t>(batch) * (ctx + iters + 8);
      ModelRunner runner(weights->get(), ctx + iters + 8);
      auto local = LocalAttention::Create(c, slots, /*prefault=*/true);
      if (!local.ok()) return 1;
      // Random KV for positions [0, ctx) of every sequence.
      KvStore& store = const_cast<KvStore&>((*local)->engine().store());
      std::mt19937 rng(1);
      for (int l = 0; l < c.num_layers; ++l) {
        uint16_t* k = store.k(l);
        uint16_t* v = store.v(l);
        const int64_t n = slots * store.row_elements();
        for (int64_t i = 0; i < n; ++i) {
          k[i] = FloatToBf16(static_cast<float>(static_cast<int32_t>(rng() % 2001) - 1000) / 1000.0f);
          v[i] = k[i];
        }
      }
      StepKvPlan setup;
      for (int b = 0; b < batch; ++b) {
        SlotAssignment a;
        a.request_id = b + 1;
        for (int64_t p = 0; p < ctx + iters + 8; ++p) a.slots.push_back(static_cast<int32_t>(b * (ctx + iters + 8) + p));
        setup.assignments.push_back(a);
      }
      if (!(*local)->BeginStep(setup).ok()) return 1;
      BatchBuffers buffers(c, batch);
      std::vector<int32_t> tokens(batch, 100);
      std::vector<float> logits(RowsCapacity(batch) * c.vocab_size);
      std::vector<int32_t> rows(batch);
      for (int b = 0; b < batch; ++b) rows[b] = b;
      SamplingParams greedy;
      greedy.temperature = 0;
      NoAttention none;
      auto step = [&](AttentionBackend& attention, int position) {
        StepKvPlan plan;
        for (int b = 0; b < batch; ++b) plan.rows.push_back({static_cast<uint64_t>(b + 1), position, -1});
        if (!ForwardLayers(runner, attention, buffers, plan, tokens.data()).ok()) std::abort();
        runner.Logits(buffers, rows, logits.data());
        for (int b = 0; b < batch; ++b) {
          SampleInput in;
          in.params = &greedy;
          tokens[b] = Sample(logits.data() + static_cast<size_t>(b) * c.vocab_size, c.vocab_size, in).token;
        }
      };
      auto time_steps = [&](AttentionBackend& attention) {
        step(attention, ctx);  // warm-up (primitive creation)
        const auto t0 = Clock::now();
        for (int i = 0; i < iters; ++i) step(attention, ctx + 1 + (i % 4));
        return Seconds(t0, Clock::now()) / iters;
      };
      const double full = time_steps(**local);
      const double gemm_only = time_steps(none);
      // Attention alone, per layer call, to get its KV read rate.
      buffers.q.assign(buffers.q.size(), FloatToBf16(0.1f));
      StepKvPlan plan;
      for (int b = 0; b < batch; ++b) plan.rows.push_back({static_cast<uint64_t>(b + 1), ctx, -1});
      (*local)->BeginStep(plan);
      const auto a0 = Clock::now();
      for (int i = 0; i < iters; ++i) {
        for (int l = 0; l < c.num_layers; ++l) (*local)->Attend(l, buffers, batch);
      }
      const double attention = Seconds(a0, Clock::now()) / iters;
      const double kv_read = batch * (ctx + 1) * kv_bytes_per_pos;
      const double kv_rate = kv_read / attention;
      const double bound = (weight_bytes + kv_read) / probe;
      std::printf("%6d %6d %10.2f %10.1f %10.2f %8.2f %10s %12.1f %10.2f\n", batch, ctx, full * 1e3,
                  batch / full, gemm_only * 1e3, gemm_only / full,
                  batch == 1 ? std::to_string(bound / full).substr(0, 5).c_str() : "-", kv_rate / 1e9,
                  kv_rate / probe);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return strata::Run();
}
