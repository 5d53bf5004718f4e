#include "compute_node/linear.h"

#include <omp.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>

#include "common/base/bfloat16.h"
#include "gtest/gtest.h"
#include "kernels/cpu/isa.h"

namespace strata {
namespace {

struct Weight {
  std::vector<uint16_t> data;
  TensorView view;
};

Weight MakeWeight(int64_t out, int64_t in, uint32_t seed, const char* dtype = "BF16") {
  Weight w;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(static_cast<float>(in)));
  w.data.resize(out * in * (std::string(dtype) == "F32" ? 2 : 1));
  for (int64_t i = 0; i < out * in; ++i) {
    const float v = normal(rng);
    if (std::string(dtype) == "F32") {
      std::memcpy(reinterpret_cast<float*>(w.data.data()) + i, &v, 4);
    } else {
      w.data[i] = FloatToBf16(v);
    }
  }
  w.view.name = "w";
  w.view.dtype_name = dtype;
  w.view.shape = {out, in};
  w.view.data = reinterpret_cast<const uint8_t*>(w.data.data());
  w.view.num_bytes = out * in * (std::string(dtype) == "F32" ? 4 : 2);
  return w;
}

float WeightAt(const Weight& w, int64_t i) {
  if (w.view.dtype_name == "F32")
    return RoundToBf16(reinterpret_cast<const float*>(w.data.data())[i]);
  return Bf16ToFloat(w.data[i]);
}

std::vector<uint16_t> RandomRows(int64_t rows, int64_t in, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> x(rows * in);
  for (auto& v : x) v = FloatToBf16(normal(rng));
  return x;
}

// STRATA_GEMM=own (linear_test_own_gemm) keeps layers off oneDNN on every CPU, and
// onednn (linear_test_onednn) puts them there wherever the CPU path is AVX-512; values other
// than auto, own and onednn are refused.
TEST(Linear, GemmChoiceFollowsStrataGemm) {
  const char* env = std::getenv("STRATA_GEMM");
  const std::string saved = env == nullptr ? "" : env;
  auto choice = RequestedGemm();
  ASSERT_TRUE(choice.ok()) << choice.status();
  const kernels::CpuIsa isa = kernels::ActiveCpuIsa();
  if (saved == "own") {
    EXPECT_EQ(*choice, GemmChoice::kOwn);
    EXPECT_FALSE(UseOneDnnBf16());
  } else if (saved == "onednn") {
    EXPECT_EQ(*choice, GemmChoice::kOneDnn);
    EXPECT_EQ(UseOneDnnBf16(), isa >= kernels::CpuIsa::kAvx512);
  } else {
    EXPECT_EQ(*choice, GemmChoice::kAuto);
    EXPECT_FALSE(UseOneDnnBf16());
  }
  setenv("STRATA_GEMM", "fastest", 1);
  EXPECT_EQ(RequestedGemm().status().code(), absl::StatusCode::kInvalidArgument);
  setenv("STRATA_GEMM", "auto", 1);
  EXPECT_EQ(RequestedGemm().value_or(GemmChoice::kOwn), GemmChoice::kAuto);
  if (env == nullptr) {
    unsetenv("STRATA_GEMM");
  } else {
    setenv("STRATA_GEMM", saved.c_str(), 1);
  }
}

TEST(Linear, MatchesExactDotProducts) {
  for (int64_t in : {128, 256, 512, 768, 2048}) {
    const int64_t out = 96;
    Weight w = MakeWeight(out, in, 1);
    auto linear = Linear::Create({&w.view}, {}, in);
    ASSERT_TRUE(linear.ok()) << linear.status();
    const int64_t m = 5;
    std::vector<uint16_t> x = RandomRows(RowsCapacity(m), in, 2);
    std::vector<float> y(RowsCapacity(m) * out);
    (*linear)->Forward(m, x.data(), y.data(), false);
    double worst = 0;
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t o = 0; o < out; ++o) {
        double exact = 0;  // bf16 products are exact in double; so is this sum, nearly
        for (int64_t k = 0; k < in; ++k) {
          exact += static_cast<double>(Bf16ToFloat(x[r * in + k])) * WeightAt(w, o * in + k);
        }
        worst = std::max(worst, std::abs(y[r * out + o] - exact));
      }
    }
    // f32 accumulation of `in` terms of size ~1/sqrt(in): error ~ sqrt(in) * 2^-24.
    EXPECT_LT(worst, 2e-5) << "in=" << in;
  }
}

TEST(Linear, FusedPartsBiasAndAccumulate) {
  Weight a = MakeWeight(32, 64, 3), b = MakeWeight(16, 64, 4, "F32");
  std::vector<float> bias_values(48);
  for (int i = 0; i < 48; ++i) bias_values[i] = 0.25f * i;
  TensorView bias_a{"ba", "F32", {32}, reinterpret_cast<const uint8_t*>(bias_values.data()), 128};
  TensorView bias_b{
      "bb", "F32", {16}, reinterpret_cast<const uint8_t*>(bias_values.data() + 32), 64};
  auto linear = Linear::Create({&a.view, &b.view}, {&bias_a, &bias_b}, 64);
  ASSERT_TRUE(linear.ok());
  EXPECT_EQ((*linear)->out_features(), 48);
  const int64_t m = 3;
  std::vector<uint16_t> x = RandomRows(m, 64, 5);
  std::vector<float> y(m * 48, 1.0f);
  (*linear)->Forward(m, x.data(), y.data(), /*accumulate=*/true);
  for (int64_t r = 0; r < m; ++r) {
    for (int o = 0; o < 48; ++o) {
      double exact = 1.0 + bias_values[o];
      for (int k = 0; k < 64; ++k) {
        const float wv = o < 32 ? WeightAt(a, o * 64 + k) : WeightAt(b, (o - 32) * 64 + k);
        exact += static_cast<double>(Bf16ToFloat(x[r * 64 + k])) * wv;
      }
      EXPECT_NEAR(y[r * 48 + o], exact, 1e-4) << r << "," << o;
    }
  }
}

// docs/architecture.md: GEMM rows must not depend on the batch size or the thread count.
TEST(Linear, RowsIndependentOfBatchSizeAndThreads) {
  const int64_t in = 768, out = 2048;
  Weight w = MakeWeight(out, in, 7);
  auto linear = Linear::Create({&w.view}, {}, in);
  ASSERT_TRUE(linear.ok());
  const int64_t max_m = 300;
  std::vector<uint16_t> x = RandomRows(RowsCapacity(max_m), in, 8);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  std::vector<float> alone(RowsCapacity(1) * out);
  (*linear)->Forward(1, x.data(), alone.data(), false);
  for (int threads : {1, 2, 4}) {
    omp_set_num_threads(threads);
    for (int64_t m : {1, 2, 7, 16, 17, 33, 64, 129, 300}) {
      std::vector<float> y(RowsCapacity(m) * out);
      (*linear)->Forward(m, x.data(), y.data(), false);
      ASSERT_EQ(std::memcmp(y.data(), alone.data(), out * sizeof(float)), 0)
          << "row 0 changed with m=" << m << " threads=" << threads;
    }
  }
  omp_set_num_threads(saved);
}

// Two threads run layers of the same shape at once, as two step threads of one process do:
// they share the cached primitives, and each must get exactly what it gets alone.
// The packed weight goes into the arena when one is given (huge pages, with the rest of the
// model's weights), whichever GEMM runs, and gives the bits of a layer with memory of its own.
TEST(Linear, PackedWeightGoesIntoTheArena) {
  const int64_t in = 320, out = 96;
  Weight w = MakeWeight(out, in, 21);
  StreamingArena arena;
  auto own = Linear::Create({&w.view}, {}, in);
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_EQ(arena.chunks(), 0u);
  auto in_arena = Linear::Create({&w.view}, {}, in, &arena);
  ASSERT_TRUE(in_arena.ok()) << in_arena.status();
  EXPECT_EQ(arena.chunks(), 1u) << (UseOneDnnBf16() ? "oneDNN" : "own GEMM");
  const int64_t m = 3;
  const std::vector<uint16_t> x = RandomRows(RowsCapacity(m), in, 22);
  std::vector<float> a(RowsCapacity(m) * out), b(RowsCapacity(m) * out);
  (*own)->Forward(m, x.data(), a.data(), false);
  (*in_arena)->Forward(m, x.data(), b.data(), false);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), m * out * sizeof(float)), 0);
  EXPECT_EQ((*own)->weight_bytes(), (*in_arena)->weight_bytes());
}

TEST(Linear, ConcurrentCallsGiveTheBitsOfSequentialOnes) {
  const int64_t in = 2048, out = 1024;
  Weight w0 = MakeWeight(out, in, 11), w1 = MakeWeight(out, in, 12);
  auto l0 = Linear::Create({&w0.view}, {}, in);
  auto l1 = Linear::Create({&w1.view}, {}, in);
  ASSERT_TRUE(l0.ok() && l1.ok());
  const Linear* layers[2] = {l0->get(), l1->get()};
  const int64_t sizes[] = {1, 5, 16, 33, 64};
  constexpr int kInputs = 5;
  // Inputs and the results of running them one at a time.
  std::vector<std::vector<uint16_t>> inputs;
  std::vector<std::vector<float>> expected[2];
  for (int i = 0; i < kInputs; ++i) {
    const int64_t m = sizes[i];
    inputs.push_back(RandomRows(RowsCapacity(m), in, 100 + i));
    for (int t = 0; t < 2; ++t) {
      std::vector<float> y(RowsCapacity(m) * out);
      layers[t]->Forward(m, inputs[i].data(), y.data(), false);
      expected[t].push_back(std::move(y));
    }
  }
  int mismatches[2] = {0, 0};
  auto run = [&](int t) {
    std::vector<float> y;
    for (int iter = 0; iter < 600; ++iter) {
      const int i = (iter + 2 * t) % kInputs;
      const int64_t m = sizes[i];
      y.assign(RowsCapacity(m) * out, 0.0f);
      layers[t]->Forward(m, inputs[i].data(), y.data(), false);
      if (std::memcmp(y.data(), expected[t][i].data(), m * out * sizeof(float)) != 0) {
        ++mismatches[t];
      }
    }
  };
  std::thread a(run, 0), b(run, 1);
  a.join();
  b.join();
  EXPECT_EQ(mismatches[0], 0);
  EXPECT_EQ(mismatches[1], 0);
}

}  // namespace
}  // namespace strata
