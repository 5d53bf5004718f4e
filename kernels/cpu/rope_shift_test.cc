// A key stored with RoPE at position p and moved by ShiftRope to p + shift equals the key
// with RoPE applied directly at p + shift (the model's own ApplyRope), within the rounding of
// the store's dtype; for the rope scalings the models use.
#include "kernels/cpu/rope_shift.h"

#include <cmath>
#include <random>
#include <vector>

#include "common/base/bfloat16.h"
#include "common/model/model_config.h"
#include "gtest/gtest.h"
#include "kernels/cpu/elementwise.h"

namespace strata::kernels {
namespace {

struct Case {
  const char* name;
  ModelConfig config;
  KvDType dtype;
};

ModelConfig Rope(double theta, RopeScaling scaling) {
  ModelConfig c;
  c.head_dim = 64;
  c.rope_theta = theta;
  c.rope_scaling = scaling;
  return c;
}

class RopeShiftTest : public ::testing::TestWithParam<Case> {};

// cos and sin of position * inv_freq, as the model runner tabulates them.
void Angles(const std::vector<double>& inv_freq, int64_t position, std::vector<float>* cos,
            std::vector<float>* sin) {
  cos->resize(inv_freq.size());
  sin->resize(inv_freq.size());
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const double angle = static_cast<double>(position) * inv_freq[i];
    (*cos)[i] = static_cast<float>(std::cos(angle));
    (*sin)[i] = static_cast<float>(std::sin(angle));
  }
}

TEST_P(RopeShiftTest, AShiftedKeyEqualsRopeAtTheNewPosition) {
  const Case& c = GetParam();
  const int heads = 3, dim = static_cast<int>(c.config.head_dim), half = dim / 2;
  const std::vector<double> inv_freq = RopeInverseFrequencies(c.config);
  auto load = [&](uint16_t x) { return c.dtype == KvDType::kF16 ? F16ToFloat(x) : Bf16ToFloat(x); };
  auto store = [&](float x) { return c.dtype == KvDType::kF16 ? FloatToF16(x) : FloatToBf16(x); };
  // One bf16 (or f16) step at the magnitude of x.
  const double ulp = c.dtype == KvDType::kF16 ? std::ldexp(1.0, -10) : std::ldexp(1.0, -7);

  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  int compared = 0;
  for (const auto& [position, shift] : std::vector<std::pair<int32_t, int32_t>>{
           {100, -64}, {4000, -3968}, {1000, -1}, {2047, -999}, {300, 0}, {17, 250}}) {
    const int32_t target = position + shift;
    std::vector<float> key(heads * dim);
    for (float& x : key) x = normal(rng);
    // RoPE at both positions with the runner's kernel and tables.
    auto rope_at = [&](int32_t p) {
      std::vector<float> cos_p, sin_p;
      Angles(inv_freq, p, &cos_p, &sin_p);
      std::vector<float> x = key;
      const int32_t zero = 0;
      ApplyRope(1, heads, dim, heads * dim, &zero, cos_p.data(), sin_p.data(), x.data());
      std::vector<uint16_t> out(x.size());
      for (size_t i = 0; i < x.size(); ++i) out[i] = store(x[i]);
      return out;
    };
    const std::vector<uint16_t> stored = rope_at(position);
    const std::vector<uint16_t> direct = rope_at(target);

    std::vector<float> cos_s, sin_s;
    Angles(inv_freq, shift, &cos_s, &sin_s);
    std::vector<uint16_t> moved(stored.size());
    ShiftRope(1, heads, dim, c.dtype, cos_s.data(), sin_s.data(), stored.data(), moved.data());

    bool changed = false;
    for (int h = 0; h < heads; ++h) {
      for (int i = 0; i < half; ++i) {
        const int a = h * dim + i, b = a + half;
        // Rotation keeps each pair's length: errors are relative to it.
        const double norm = std::hypot(key[a], key[b]);
        for (int e : {a, b}) {
          EXPECT_NEAR(load(moved[e]), load(direct[e]), 2.0 * ulp * norm + 1e-6)
              << c.name << ": position " << position << " shifted by " << shift << ", head " << h
              << ", element " << e % dim;
          changed = changed || moved[e] != stored[e];
          ++compared;
        }
      }
    }
    EXPECT_EQ(changed, shift != 0) << "position " << position << " shifted by " << shift;
  }
  EXPECT_EQ(compared, 6 * heads * dim);
}

// In place (the store's rows rotated where they are) gives the same as out of place.
TEST(RopeShift, InPlaceMatchesOutOfPlace) {
  const int rows = 5, heads = 2, dim = 32;
  std::vector<float> cos(dim / 2), sin(dim / 2);
  for (int i = 0; i < dim / 2; ++i) {
    cos[i] = static_cast<float>(std::cos(0.3 * (i + 1)));
    sin[i] = static_cast<float>(std::sin(0.3 * (i + 1)));
  }
  std::vector<uint16_t> x(rows * heads * dim);
  for (size_t i = 0; i < x.size(); ++i) x[i] = FloatToBf16(std::sin(0.1 * i) * 3.0f);
  std::vector<uint16_t> out(x.size());
  ShiftRope(rows, heads, dim, KvDType::kBF16, cos.data(), sin.data(), x.data(), out.data());
  ShiftRope(rows, heads, dim, KvDType::kBF16, cos.data(), sin.data(), x.data(), x.data());
  EXPECT_EQ(x, out);
}

INSTANTIATE_TEST_SUITE_P(
    Scalings, RopeShiftTest,
    ::testing::Values(
        Case{"plain_bf16", Rope(10000.0, {}), KvDType::kBF16},
        Case{"plain_f16", Rope(10000.0, {}), KvDType::kF16},
        Case{"linear_bf16", Rope(10000.0, {RopeScaling::Type::kLinear, 4.0}), KvDType::kBF16},
        Case{"llama3_bf16", Rope(500000.0, {RopeScaling::Type::kLlama3, 8.0, 1.0, 4.0, 256}),
             KvDType::kBF16}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace strata::kernels
