#include "server/truncation.h"

#include <cmath>

#include "gtest/gtest.h"

namespace strata {
namespace {

// The fewest whole blocks are dropped right after the kept start (whole blocks too), and the
// result fits with its output.
TEST(Truncation, DropsTheFewestWholeBlocksAfterTheKeptStart) {
  for (int64_t prompt = 100; prompt < 400; prompt += 7) {
    for (int64_t max_tokens : {1, 16, 50}) {
      const int64_t len = 256;
      if (prompt + max_tokens <= len) {
        EXPECT_FALSE(PlanTruncation(prompt, max_tokens, len, 4, 16)) << "nothing overflows";
        continue;
      }
      const auto t = PlanTruncation(prompt, max_tokens, len, 4, 16);
      ASSERT_TRUE(t) << prompt << " + " << max_tokens;
      EXPECT_EQ(t->keep_first, 16);
      EXPECT_EQ(t->dropped % 16, 0);
      EXPECT_LE(prompt - t->dropped + max_tokens, len);
      EXPECT_GT(prompt - (t->dropped - 16) + max_tokens, len) << "one block fewer would fit";
      EXPECT_GT(prompt - t->dropped, t->keep_first);
    }
  }
  // The output alone leaves no room for the kept start and one more token.
  EXPECT_FALSE(PlanTruncation(300, 240, 256, 16, 16));
  EXPECT_TRUE(PlanTruncation(300, 200, 256, 16, 16));
  EXPECT_EQ(PlanTruncation(300, 10, 256, 0, 16)->keep_first, 0);
  EXPECT_EQ(PlanTruncation(300, 10, 256, 17, 16)->keep_first, 32);
}

TEST(Truncation, KeepsTheStartAndTheEnd) {
  std::vector<int32_t> tokens(40);
  for (int i = 0; i < 40; ++i) tokens[i] = i;
  const std::vector<int32_t> cut = Truncate(tokens, {8, 16});
  ASSERT_EQ(cut.size(), 24u);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(cut[i], i);
  for (int i = 8; i < 24; ++i) EXPECT_EQ(cut[i], i + 16);
}

TEST(Truncation, ShiftAnglesAreThoseOfTheShift) {
  const std::vector<double> inv_freq = {1.0, 0.01, 1e-5};
  std::vector<float> cos, sin;
  ShiftAngles(inv_freq, -300, &cos, &sin);
  ASSERT_EQ(cos.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_FLOAT_EQ(cos[i], static_cast<float>(std::cos(-300.0 * inv_freq[i])));
    EXPECT_FLOAT_EQ(sin[i], static_cast<float>(std::sin(-300.0 * inv_freq[i])));
  }
  EXPECT_LT(sin[1], 0.0f);  // moving earlier turns backwards
}

TEST(Truncation, ParsesItsFlag) {
  ContextOverflow c = ContextOverflow::kError;
  std::string error;
  EXPECT_TRUE(AbslParseFlag("truncate", &c, &error));
  EXPECT_EQ(c, ContextOverflow::kTruncate);
  EXPECT_EQ(AbslUnparseFlag(c), "truncate");
  EXPECT_TRUE(AbslParseFlag("error", &c, &error));
  EXPECT_EQ(c, ContextOverflow::kError);
  EXPECT_FALSE(AbslParseFlag("shift", &c, &error));
  EXPECT_FALSE(error.empty());
}

}  // namespace
}  // namespace strata
