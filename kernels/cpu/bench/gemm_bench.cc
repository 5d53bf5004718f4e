// strata's own GEMM benchmark (prints figures; no assertion): GemmBf16 on the linear layers
// of a Llama-shaped model, per instruction set and rows per call, as GFLOP/s and as the
// rate at which the packed weights are read. Each call takes a different weight from a set
// that far exceeds the last-level cache, so weights come from DRAM as in a real step.
//
//   bazel build //kernels/cpu/bench:gemm_bench
//   OMP_NUM_THREADS=2 bazel-bin/kernels/cpu/bench/gemm_bench --rows=1,8,32,64
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "common/base/huge_pages.h"
#include "common/base/stopwatch.h"
#include "common/bench/int_list.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa.h"

ABSL_FLAG(std::string, rows, "1,8,32,64", "Rows per call");
ABSL_FLAG(int, hidden, 768, "Hidden size");
ABSL_FLAG(int, ffn, 2048, "FFN (intermediate) size");
ABSL_FLAG(int, layers, 12, "Layers whose weights the calls rotate through");
ABSL_FLAG(std::string, isas, "", "Instruction sets to run, comma-separated (default: the active)");
ABSL_FLAG(int, rounds, 5, "Passes over every layer's weights per configuration; the median");

namespace strata::kernels {
namespace {

// Packed as the compute node holds its weights (compute_node/linear.h: on huge pages).
using Packed = std::vector<uint16_t, StreamingAllocator<uint16_t>>;

struct Weight {
  int64_t n, k;
  Packed packed;
};

int Run() {
  const int64_t hidden = absl::GetFlag(FLAGS_hidden), ffn = absl::GetFlag(FLAGS_ffn);
  // One layer's projections as [out][in]: q, k, v and o, gate and up, down.
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {hidden, hidden}, {hidden, hidden}, {hidden, hidden}, {hidden, hidden},
      {ffn, hidden},    {ffn, hidden},    {hidden, ffn}};
  std::mt19937 rng(1);
  std::vector<Weight> weights;
  int64_t bytes = 0, flops_per_row = 0;
  for (int l = 0; l < absl::GetFlag(FLAGS_layers); ++l) {
    for (const auto& [n, k] : shapes) {
      std::vector<uint16_t> w(n * k);
      for (auto& v : w) v = static_cast<uint16_t>(0x3c00 + rng() % 0x0400);  // bf16 in [2^-7, 2^-6)
      Weight packed{n, k, Packed(PackedGemmWeightSize(n, k))};
      PackGemmWeight(w.data(), n, k, packed.packed.data());
      bytes += n * k * 2;
      flops_per_row += 2 * n * k;
      weights.push_back(std::move(packed));
    }
  }
  const std::vector<CpuIsa> isas = CpuIsasFromList(absl::GetFlag(FLAGS_isas));
  std::printf(
      "own GEMM: %d layers of %lld/%lld, %.1f MB of weights, %d threads; avx512bf16 runs "
      "batches from %lld rows on %s (STRATA_GEMM_WIDE)\n",
      absl::GetFlag(FLAGS_layers), static_cast<long long>(hidden), static_cast<long long>(ffn),
      bytes / 1e6, omp_get_max_threads(), static_cast<long long>(kGemmWideRows),
      GemmWideKernelName(ActiveGemmWideKernel()));
  std::printf("%12s %6s %10s %10s %10s\n", "isa", "rows", "ms/pass", "GFLOP/s", "weight_GB/s");
  for (CpuIsa isa : isas) {
    if (!ForceCpuIsa(isa)) continue;
    for (const int m : ParseIntList(absl::GetFlag(FLAGS_rows))) {
      if (m <= 0) continue;
      const int64_t widest = std::max(hidden, ffn);
      std::vector<uint16_t> x(m * widest);
      for (auto& v : x) v = static_cast<uint16_t>(0x3f80 + rng() % 0x80);
      std::vector<float> y(m * widest);
      std::vector<double> passes;
      for (int round = 0; round <= absl::GetFlag(FLAGS_rounds); ++round) {
        const Stopwatch pass;
        for (const Weight& w : weights) {
          GemmBf16(m, w.n, w.k, x.data(), w.packed.data(), nullptr, false, y.data());
        }
        if (round > 0) passes.push_back(pass.ElapsedSeconds());  // the first warms up
      }
      std::sort(passes.begin(), passes.end());
      const double s = passes[passes.size() / 2];
      std::printf("%12s %6d %10.2f %10.1f %10.1f\n", CpuIsaName(isa), m, s * 1e3,
                  static_cast<double>(flops_per_row) * m / s / 1e9, bytes / s / 1e9);
    }
  }
  return 0;
}

}  // namespace
}  // namespace strata::kernels

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return strata::kernels::Run();
}
