// GemmBf16 against a double-precision reference, and its invariances: a row's output does
// not depend on the batch, the thread count or the ISA path.
#include "kernels/cpu/gemm.h"

#include <omp.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "common/base/bfloat16.h"
#include "gtest/gtest.h"
#include "kernels/cpu/isa.h"

namespace strata::kernels {
namespace {

std::vector<uint16_t> RandomBf16(int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<uint16_t> out(count);
  for (auto& v : out) v = FloatToBf16(dist(rng));
  return out;
}

struct Problem {
  int64_t n, k;
  std::vector<uint16_t> w, packed;
  std::vector<float> bias;

  Problem(int64_t n_, int64_t k_, uint32_t seed) : n(n_), k(k_) {
    w = RandomBf16(n * k, seed);
    packed.resize(PackedGemmWeightSize(n, k));
    PackGemmWeight(w.data(), n, k, packed.data());
    for (int64_t j = 0; j < n; ++j) bias.push_back(0.25f * static_cast<float>(j % 7) - 0.5f);
  }
};

void CheckAgainstDoubleReference() {
  for (const auto& [m, n, k] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{1, 16, 8},
                                                                                  {5, 37, 70},
                                                                                  {13, 200, 129},
                                                                                  {50, 33, 256},
                                                                                  {100, 64, 31},
                                                                                  {3, 90, 33},
                                                                                  {4, 90, 129},
                                                                                  {8, 112, 64}}) {
    Problem p(n, k, static_cast<uint32_t>(m * 1000 + n));
    const std::vector<uint16_t> x = RandomBf16(m * k, 99);
    std::vector<float> y(m * n, 0.0f), prior(m * n);
    for (int64_t i = 0; i < m * n; ++i) prior[i] = 0.125f * static_cast<float>(i % 5);
    GemmBf16(m, n, k, x.data(), p.packed.data(), p.bias.data(), false, y.data());
    std::vector<float> acc = prior;
    GemmBf16(m, n, k, x.data(), p.packed.data(), nullptr, true, acc.data());
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t j = 0; j < n; ++j) {
        double exact = 0, magnitude = 0;
        for (int64_t kk = 0; kk < k; ++kk) {
          const double t =
              static_cast<double>(Bf16ToFloat(x[r * k + kk])) * Bf16ToFloat(p.w[j * k + kk]);
          exact += t;
          magnitude += std::fabs(t);
        }
        const double tolerance = 1e-6 * magnitude + 1e-6;
        EXPECT_NEAR(y[r * n + j], exact + p.bias[j], tolerance) << m << "x" << n << "x" << k;
        EXPECT_NEAR(acc[r * n + j], exact + prior[r * n + j], tolerance);
      }
    }
  }
}

// The active path and the scalar one (which shares the work split and the stores: groups of
// 4 blocks, partial groups of 2 and 3 blocks at n = 90 and 112).
TEST(GemmBf16, MatchesDoubleReferenceWithBiasAndAccumulate) {
  const CpuIsa saved = ActiveCpuIsa();
  for (CpuIsa isa : {saved, CpuIsa::kScalar}) {
    ASSERT_TRUE(ForceCpuIsa(isa));
    SCOPED_TRACE(CpuIsaName(isa));
    CheckAgainstDoubleReference();
  }
  ForceCpuIsa(saved);
}

void CheckRowsIndependentOfBatchAndThreads();

// Where the CPU has AVX-512 BF16, each kernel of wide batches (gemm.h, GemmWideKernel) in
// turn, then the process's own choice; elsewhere the process's choice alone.
std::vector<GemmWideKernel> WideKernels() {
  if (!CpuSupports(CpuIsa::kAvx512Bf16)) return {GemmWideKernel::kAuto};
  return {GemmWideKernel::kDot, GemmWideKernel::kFma, GemmWideKernel::kAuto};
}

TEST(GemmBf16, WideKernelIsOneOfTheTwo) {
  const GemmWideKernel active = ActiveGemmWideKernel();
  EXPECT_TRUE(active == GemmWideKernel::kDot || active == GemmWideKernel::kFma)
      << GemmWideKernelName(active);
  if (!CpuSupports(CpuIsa::kAvx512Bf16)) EXPECT_EQ(active, GemmWideKernel::kDot);
  // The probe's rates are those of the instructions the CPU has, and where they differ
  // clearly the process's own choice (STRATA_GEMM_WIDE is unset under bazel test) follows
  // them: FMAs at 1.25x vdpbf16ps's rate or more pick kFma.
  const GemmWideProbe probe = MeasureGemmWideProbe();
  EXPECT_EQ(probe.dot > 0, CpuSupports(CpuIsa::kAvx512Bf16));
  EXPECT_EQ(probe.fma > 0, CpuSupports(CpuIsa::kAvx512));
  if (std::getenv("STRATA_GEMM_WIDE") == nullptr && probe.dot > 0) {
    if (probe.fma > 1.6 * probe.dot) EXPECT_EQ(active, GemmWideKernel::kFma);
    if (probe.fma < 1.0 * probe.dot) EXPECT_EQ(active, GemmWideKernel::kDot);
  }
  ForceGemmWideKernel(GemmWideKernel::kFma);
  EXPECT_EQ(ActiveGemmWideKernel(), GemmWideKernel::kFma);
  ForceGemmWideKernel(GemmWideKernel::kAuto);
  EXPECT_EQ(ActiveGemmWideKernel(), active);
}

// A row's output is the same alone and in batches of every size, with 1-3 threads: on an
// AVX-512 BF16 CPU the batch of one runs vdpbf16ps and those from kGemmWideRows up the
// wide kernel, so under kFma this is also vdpbf16ps against the FMAs (from 9 rows with the
// next group's weights requested into L2).
TEST(GemmBf16, RowsIndependentOfBatchAndThreads) {
  for (GemmWideKernel wide : WideKernels()) {
    SCOPED_TRACE(GemmWideKernelName(wide));
    ForceGemmWideKernel(wide);
    CheckRowsIndependentOfBatchAndThreads();
  }
  ForceGemmWideKernel(GemmWideKernel::kAuto);
}

void CheckRowsIndependentOfBatchAndThreads() {
  const int64_t n = 300, k = 384;
  Problem p(n, k, 7);
  const int64_t max_m = 130;
  const std::vector<uint16_t> x = RandomBf16(max_m * k, 8);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  std::vector<float> alone(max_m * n);
  for (int64_t r = 0; r < max_m; ++r) {
    GemmBf16(1, n, k, x.data() + r * k, p.packed.data(), p.bias.data(), false,
             alone.data() + r * n);
  }
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    for (int64_t m : {2, 6, 7, 47, 48, 49, 130}) {
      std::vector<float> y(m * n);
      GemmBf16(m, n, k, x.data(), p.packed.data(), p.bias.data(), false, y.data());
      EXPECT_EQ(std::memcmp(y.data(), alone.data(), m * n * sizeof(float)), 0)
          << "m=" << m << " threads=" << threads;
    }
  }
  omp_set_num_threads(saved);
}

// Every vector path against the scalar one, bit for bit: rows 1-67 (below, at and past the
// row tiles of 5 and 6 rows, AVX2's switch from blocks side by side to one block at a time
// at 4 rows, and the pass of 48), n not a multiple of 16 nor of a group's 64 columns (and
// past one group; last groups of 1, 2, 3 and 4 blocks, at 1 row too), k odd and even.
// On AVX-512 BF16 both kernels of wide batches are checked.
TEST(GemmBf16, VectorPathsAgreeWithScalarBitForBit) {
  const CpuIsa saved = ActiveCpuIsa();
  int checked = 0;
  for (CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16})
    for (GemmWideKernel wide :
         isa == CpuIsa::kAvx512Bf16 ? WideKernels() : std::vector{GemmWideKernel::kAuto}) {
      if (!CpuSupports(isa)) continue;
      ++checked;
      ForceGemmWideKernel(wide);
      for (const auto& [m, n, k] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
               {1, 70, 257},  {5, 70, 257},  {6, 70, 257},   {9, 70, 257},  {12, 70, 257},
               {13, 70, 257}, {47, 70, 257}, {48, 70, 257},  {49, 70, 257}, {67, 70, 257},
               {1, 200, 256}, {7, 200, 256}, {67, 200, 256}, {3, 16, 1},    {2, 33, 3},
               {3, 90, 129},  {4, 90, 129},  {8, 90, 129},   {11, 112, 64}, {4, 112, 65},
               {1, 90, 129},  {1, 112, 65}}) {
        Problem p(n, k, 11);
        const std::vector<uint16_t> x = RandomBf16(m * k, 12);
        std::vector<float> scalar(m * n), vector(m * n);
        ASSERT_TRUE(ForceCpuIsa(CpuIsa::kScalar));
        GemmBf16(m, n, k, x.data(), p.packed.data(), p.bias.data(), false, scalar.data());
        ASSERT_TRUE(ForceCpuIsa(isa));
        GemmBf16(m, n, k, x.data(), p.packed.data(), p.bias.data(), false, vector.data());
        EXPECT_EQ(std::memcmp(scalar.data(), vector.data(), scalar.size() * sizeof(float)), 0)
            << CpuIsaName(isa) << " (wide: " << GemmWideKernelName(wide) << "), " << m << "x" << n
            << "x" << k;
      }
    }
  ForceGemmWideKernel(GemmWideKernel::kAuto);
  ForceCpuIsa(saved);
  if (checked == 0) GTEST_SKIP() << "no vector path on this CPU";
}

}  // namespace
}  // namespace strata::kernels
