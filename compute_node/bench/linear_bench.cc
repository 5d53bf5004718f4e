// Linear-layer benchmark (prints figures; no assertion): Linear::Forward on the demo
// model's projection shapes, at several batch sizes, as weight-read bandwidth and GFLOP/s.
// Several copies of each layer rotate so the weights come from memory, as in a real step.
//
//   bazel run -c opt //compute_node/bench:linear_bench -- --batches=1,8,64
#include <omp.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/base/bfloat16.h"
#include "common/base/stopwatch.h"
#include "common/model/safetensors.h"
#include "compute_node/linear.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa.h"

ABSL_FLAG(std::string, batches, "1,8,64", "Rows per call");
ABSL_FLAG(int, copies, 12, "Copies of each layer that rotate (one per model layer)");
ABSL_FLAG(double, seconds, 1.0, "Approximate time per shape and batch");

namespace strata {
namespace {

struct Shape {
  const char* name;
  int64_t in, out;
};

int Run() {
  const Shape shapes[] = {{"qkv", 768, 2304},  {"o", 768, 768},         {"gate_up", 768, 4096},
                          {"down", 2048, 768}, {"lm_head", 768, 32000}, {"tiny", 64, 64}};
  std::vector<int> batches;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_batches), ',')) {
    int v = 0;
    if (absl::SimpleAtoi(part, &v)) batches.push_back(v);
  }
  const kernels::GemmWideProbe probe = kernels::MeasureGemmWideProbe();
  std::printf(
      "%d threads, %s kernels (GEMM of wide batches: %s; one thread's vdpbf16ps %.1f and "
      "f32 FMAs %.1f GFLOP/s)\n%-8s %6s %10s %10s %10s\n",
      omp_get_max_threads(), kernels::CpuIsaName(kernels::ActiveCpuIsa()),
      kernels::GemmWideKernelName(kernels::ActiveGemmWideKernel()), probe.dot / 1e9,
      probe.fma / 1e9, "layer", "batch", "call_us", "weight_GB/s", "GFLOP/s");
  std::mt19937 rng(3);
  for (const Shape& shape : shapes) {
    const int copies = shape.out > 10000 ? 1 : absl::GetFlag(FLAGS_copies);
    std::vector<uint16_t> w(static_cast<size_t>(shape.in) * shape.out);
    for (auto& x : w)
      x = FloatToBf16(static_cast<float>(static_cast<int>(rng() % 200) - 100) / 1000);
    TensorView view;
    view.dtype_name = "BF16";
    view.shape = {shape.out, shape.in};
    view.data = reinterpret_cast<const uint8_t*>(w.data());
    view.num_bytes = w.size() * 2;
    std::vector<std::unique_ptr<Linear>> layers;
    for (int i = 0; i < copies; ++i) layers.push_back(*Linear::Create({&view}, {}, shape.in));
    for (int m : batches) {
      std::vector<uint16_t> x(RowsCapacity(m) * shape.in, FloatToBf16(0.5f));
      std::vector<float> y(RowsCapacity(m) * shape.out);
      const double flops = 2.0 * m * shape.in * shape.out;
      const int iters = std::max(
          3, static_cast<int>(absl::GetFlag(FLAGS_seconds) * 2e11 / (flops * copies + 1e8)));
      double best = 1e30;
      for (int it = 0; it < iters + 1; ++it) {
        const Stopwatch watch;
        for (auto& layer : layers) layer->Forward(m, x.data(), y.data(), false);
        const double s = watch.ElapsedSeconds() / copies;
        if (it > 0) best = std::min(best, s);
      }
      std::printf("%-8s %6d %10.1f %10.1f %10.1f\n", shape.name, m, best * 1e6,
                  layers[0]->weight_bytes() / best / 1e9, flops / best / 1e9);
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
