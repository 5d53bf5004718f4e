#include "kernels/cpu/elementwise.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "common/base/bfloat16.h"
#include "gtest/gtest.h"
#include "kernels/cpu/isa.h"

namespace strata::kernels {
namespace {

std::vector<CpuIsa> SupportedIsas() {
  std::vector<CpuIsa> isas;
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16}) {
    if (CpuSupports(isa)) isas.push_back(isa);
  }
  return isas;
}

class ElementwiseTest : public ::testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override {
    saved_ = ActiveCpuIsa();
    ASSERT_TRUE(ForceCpuIsa(GetParam()));
  }
  void TearDown() override { ForceCpuIsa(saved_); }
  CpuIsa saved_;
  std::mt19937 rng_{42};
  std::vector<float> Normal(size_t n, float std = 1.0f) {
    std::normal_distribution<float> d(0.0f, std);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng_);
    return v;
  }
};

// |got - want| within bf16 rounding (2^-8 relative) plus a small absolute slack.
void ExpectBf16Near(const std::vector<uint16_t>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(Bf16ToFloat(got[i]), want[i], std::abs(want[i]) * 4e-3 + 1e-6) << i;
  }
}

TEST_P(ElementwiseTest, RmsNormMatchesFormula) {
  for (int dim : {768, 128, 100, 5}) {
    const int rows = 9;
    std::vector<float> x = Normal(rows * dim, 3.0f);
    std::vector<float> w = Normal(dim);
    std::vector<uint16_t> out(rows * dim);
    RmsNorm(rows, dim, x.data(), w.data(), 1e-5f, out.data());
    std::vector<double> want(rows * dim);
    for (int r = 0; r < rows; ++r) {
      double ss = 0;
      for (int i = 0; i < dim; ++i) ss += double(x[r * dim + i]) * x[r * dim + i];
      const double inv = 1.0 / std::sqrt(ss / dim + 1e-5);
      for (int i = 0; i < dim; ++i) want[r * dim + i] = x[r * dim + i] * inv * w[i];
    }
    ExpectBf16Near(out, want);
  }
}

TEST_P(ElementwiseTest, SiluMulMatchesFormula) {
  for (int ffn : {2048, 40, 3}) {
    const int rows = 5;
    std::vector<float> gu = Normal(rows * 2 * ffn, 4.0f);
    gu[0] = -100.0f;  // exp overflow side
    gu[1] = 100.0f;
    std::vector<uint16_t> out(rows * ffn);
    SiluMul(rows, ffn, gu.data(), out.data());
    std::vector<double> want(rows * ffn);
    for (int r = 0; r < rows; ++r) {
      for (int i = 0; i < ffn; ++i) {
        const double g = gu[r * 2 * ffn + i];
        const double u = gu[r * 2 * ffn + ffn + i];
        want[r * ffn + i] = g / (1.0 + std::exp(-g)) * u;
      }
    }
    ExpectBf16Near(out, want);
  }
}

TEST_P(ElementwiseTest, RopeRotatesHalvesByPositionAngle) {
  const int heads = 3, dim = 64, half = 32, rows = 4, stride = heads * dim + 16;
  std::vector<float> x = Normal(rows * stride);
  const std::vector<float> original = x;
  const int max_pos = 50;
  std::vector<float> cos(max_pos * half), sin(max_pos * half);
  for (int p = 0; p < max_pos; ++p) {
    for (int i = 0; i < half; ++i) {
      const double angle = p * std::pow(10000.0, -2.0 * i / dim);
      cos[p * half + i] = static_cast<float>(std::cos(angle));
      sin[p * half + i] = static_cast<float>(std::sin(angle));
    }
  }
  const std::vector<int32_t> positions = {0, 1, 17, 49};
  ApplyRope(rows, heads, dim, stride, positions.data(), cos.data(), sin.data(), x.data());
  for (int r = 0; r < rows; ++r) {
    for (int h = 0; h < heads; ++h) {
      for (int i = 0; i < half; ++i) {
        const double angle = positions[r] * std::pow(10000.0, -2.0 * i / dim);
        const double a = original[r * stride + h * dim + i];
        const double b = original[r * stride + h * dim + half + i];
        EXPECT_NEAR(x[r * stride + h * dim + i], a * std::cos(angle) - b * std::sin(angle), 1e-5);
        EXPECT_NEAR(x[r * stride + h * dim + half + i], b * std::cos(angle) + a * std::sin(angle),
                    1e-5);
      }
    }
    // Padding past the heads is untouched.
    for (int i = heads * dim; i < stride; ++i)
      EXPECT_EQ(x[r * stride + i], original[r * stride + i]);
  }
}

TEST_P(ElementwiseTest, ConvertToBf16IsExactRoundToNearestEven) {
  std::vector<float> x = Normal(100003, 1e3f);
  x[0] = std::numeric_limits<float>::quiet_NaN();
  x[1] = std::numeric_limits<float>::infinity();
  x[2] = 1.0f + 1.0f / 256;  // tie: rounds to even
  std::vector<uint16_t> out(x.size());
  ConvertToBf16(x.size(), x.data(), out.data());
  EXPECT_TRUE(std::isnan(Bf16ToFloat(out[0])));
  for (size_t i = 1; i < x.size(); ++i) ASSERT_EQ(out[i], FloatToBf16(x[i])) << i;
}

// Against the scalar FloatToF16 (common/base/bfloat16.h), on normal values, ties, values
// that round to subnormals or to zero, overflow, infinities and NaNs, at a length that
// leaves a tail for every vector width.
TEST_P(ElementwiseTest, ConvertToF16IsExactRoundToNearestEven) {
  std::vector<float> x = Normal(100003, 1e3f);
  const std::vector<float> edges = {std::numeric_limits<float>::quiet_NaN(),
                                    -std::numeric_limits<float>::quiet_NaN(),
                                    std::numeric_limits<float>::infinity(),
                                    -std::numeric_limits<float>::infinity(),
                                    1.0f + 1.0f / 2048,  // tie: rounds to even
                                    1.0f + 3.0f / 2048,  // tie: rounds up to even
                                    65504.0f,
                                    65519.0f,
                                    65520.0f,
                                    -1e6f,
                                    6.1e-5f,
                                    3.0e-6f,
                                    5.96e-8f,
                                    2.98e-8f,
                                    2.9802322e-8f,
                                    1e-9f,
                                    -0.0f,
                                    0.0f};
  std::copy(edges.begin(), edges.end(), x.begin());
  for (size_t i = edges.size(); i < 3000; ++i) x[i] = x[i] * 1e-9f;  // subnormal results
  std::vector<uint16_t> out(x.size());
  ConvertToF16(x.size(), x.data(), out.data());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(out[i], FloatToF16(x[i])) << i << " " << x[i];
}

TEST_P(ElementwiseTest, ExpShiftedMatchesLibm) {
  std::vector<float> x = Normal(1003, 20.0f);
  x[0] = -std::numeric_limits<float>::infinity();
  std::vector<float> out(x.size());
  const float shift = 5.0f, scale = 0.8f;
  const double sum = ExpShifted(x.size(), x.data(), shift, scale, out.data());
  double want_sum = 0;
  EXPECT_EQ(out[0], 0.0f);
  for (size_t i = 1; i < x.size(); ++i) {
    // The kernel's argument is computed in float; the exp itself must be within 2e-6.
    const float arg = (x[i] - shift) * scale;
    const double want = std::exp(static_cast<double>(arg));
    want_sum += want;
    if (want < 1e-37) continue;  // below float's normal range: may flush to zero
    ASSERT_NEAR(out[i], want, want * 2e-6) << x[i];
  }
  EXPECT_NEAR(sum, want_sum, want_sum * 2e-6);
}

// The first-largest loop the kernel must answer like, ties, NaNs and infinities included:
// it starts at the first element that is not NaN (all NaN: 0).
int64_t SequentialArgmax(const std::vector<float>& x) {
  size_t best = 0;
  while (best < x.size() && std::isnan(x[best])) ++best;
  if (best == x.size()) return 0;
  for (size_t i = best + 1; i < x.size(); ++i) {
    if (x[i] > x[best]) best = i;
  }
  return static_cast<int64_t>(best);
}

TEST_P(ElementwiseTest, ArgmaxIsTheFirstLargestAsALoopFindsIt) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::uniform_int_distribution<int> small(-3, 3);  // many ties
  for (size_t n : {1, 2, 15, 16, 17, 63, 64, 65, 130, 1000, 32000}) {
    for (int variant = 0; variant < 11; ++variant) {
      std::vector<float> x = Normal(n, 4.0f);
      switch (variant) {
        case 1:  // small integers: the maximum repeats
          for (auto& v : x) v = static_cast<float>(small(rng_));
          break;
        case 2:  // NaNs scattered, one of them on the largest value's index
          for (size_t i = 1; i < n; i += 7) x[i] = nan;
          if (n > 1) x[SequentialArgmax(x) == 0 ? n - 1 : SequentialArgmax(x)] = nan;
          break;
        case 3:  // a NaN first: the search starts after it
          x[0] = nan;
          break;
        case 4:  // every value -inf, or -inf and NaN
          for (size_t i = 0; i < n; ++i) x[i] = i % 3 == 2 ? nan : -inf;
          break;
        case 5:  // +inf twice, late
          x[n - 1] = inf;
          x[n / 2] = inf;
          break;
        case 6:  // signed zeros for the largest
          for (auto& v : x) v = -std::abs(v) - 1.0f;
          x[n - 1] = 0.0f;
          x[n / 3] = -0.0f;
          break;
        case 7:  // the largest in the tail after the last whole block
          x[n - 1] = 100.0f;
          break;
        case 8:  // all equal
          for (auto& v : x) v = 1.5f;
          break;
        case 9:  // a run of leading NaNs past the first vector block
          for (size_t i = 0; i < std::min<size_t>(n - 1, 70); ++i) x[i] = nan;
          break;
        case 10:  // every value NaN: 0
          for (auto& v : x) v = nan;
          break;
      }
      ASSERT_EQ(Argmax(static_cast<int64_t>(n), x.data()), SequentialArgmax(x))
          << "n " << n << " variant " << variant;
    }
  }
  EXPECT_EQ(Argmax(0, nullptr), 0);
}

INSTANTIATE_TEST_SUITE_P(AllIsas, ElementwiseTest, ::testing::ValuesIn(SupportedIsas()),
                         [](const auto& info) { return CpuIsaName(info.param); });

}  // namespace
}  // namespace strata::kernels
