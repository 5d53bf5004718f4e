#include "common/base/bfloat16.h"

#include <immintrin.h>

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace strata {
namespace {

TEST(Bfloat16, KnownValues) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(-2.0f), 0xc000);
  EXPECT_EQ(FloatToBf16(0.0f), 0x0000);
  EXPECT_FLOAT_EQ(Bf16ToFloat(0x3f80), 1.0f);
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties to even (1.0).
  EXPECT_EQ(FloatToBf16(1.0f + 1.0f / 256), 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 1.0078125 (odd) and 1.015625 (even).
  EXPECT_EQ(FloatToBf16(1.0f + 3.0f / 256), 0x3f82);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(Bf16ToFloat(FloatToBf16(std::numeric_limits<float>::infinity()))));
}

TEST(Bfloat16, RoundTripIsIdentityOnBf16Values) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = Bf16ToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToBf16(f), h);
  }
}

// The hardware F16C conversion is the independent reference for the scalar code.
TEST(Float16, MatchesF16cOnEveryHalfValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float expected = _cvtsh_ss(static_cast<uint16_t>(h));
    const float got = F16ToFloat(static_cast<uint16_t>(h));
    if (std::isnan(expected)) {
      ASSERT_TRUE(std::isnan(got));
      continue;
    }
    ASSERT_EQ(got, expected) << std::hex << h;
  }
}

TEST(Float16, FloatToF16MatchesF16cRounding) {
  uint32_t state = 12345;
  for (int i = 0; i < 2000000; ++i) {
    state = state * 1664525u + 1013904223u;
    float f;
    std::memcpy(&f, &state, sizeof(f));
    if (std::isnan(f)) continue;
    const uint16_t expected = _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
    ASSERT_EQ(FloatToF16(f), expected) << f;
  }
}

}  // namespace
}  // namespace strata
