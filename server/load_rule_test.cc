// The swap-or-recompute rule against hand-computed costs: it loads until both sides are
// measured; it recovers a round-trip latency and a per-block cost from batches of different
// sizes; with a fixed latency it recomputes short prefixes and loads long ones; a disk slower
// per block than prefill is never worth it.
#include "server/load_rule.h"

#include "gtest/gtest.h"

namespace strata {
namespace {

TEST(LoadRuleTest, LoadsUntilBothSidesAreMeasured) {
  LoadRule rule;
  PrefillRate none, prefill;
  EXPECT_TRUE(rule.Load(1, 16, none));
  prefill.Observe(1000, 1.0);
  EXPECT_TRUE(rule.Load(1, 16, prefill)) << "the disk was never measured";
  LoadRule other;
  other.ObserveLoad(4, 10.0);
  EXPECT_TRUE(other.Load(1, 16, none)) << "prefill was never measured";
}

TEST(LoadRuleTest, FitsLatencyAndPerBlockCost) {
  LoadRule rule;
  // 20 ms per call plus 1 ms per block.
  for (int n : {2, 8, 4, 16, 1, 32}) rule.ObserveLoad(n, 0.020 + 0.001 * n);
  EXPECT_NEAR(rule.LoadSeconds(0), 0.020, 1e-9);
  EXPECT_NEAR(rule.LoadSeconds(100), 0.120, 1e-9);
}

TEST(LoadRuleTest, RecomputesShortPrefixesAndLoadsLongOnes) {
  LoadRule rule;
  for (int n : {2, 8, 4, 16}) rule.ObserveLoad(n, 0.020 + 0.001 * n);
  PrefillRate prefill;
  prefill.Observe(1600, 1.0);  // 1,600 rows/s: a 16-token block takes 10 ms
  // n blocks: load 20 + n ms, recompute 10 n ms; equal at n = 20/9.
  EXPECT_FALSE(rule.Load(1, 16, prefill));
  EXPECT_FALSE(rule.Load(2, 16, prefill));
  EXPECT_TRUE(rule.Load(3, 16, prefill));
  EXPECT_TRUE(rule.Load(60, 16, prefill));
  // The rate is smoothed: a step at 3,200 rows/s moves it a fifth of the way.
  prefill.Observe(3200, 1.0);
  EXPECT_NEAR(prefill.rows_per_second(), 1920, 1e-9);
}

TEST(LoadRuleTest, ADiskSlowerThanPrefillIsNeverWorthIt) {
  LoadRule rule;
  for (int i = 0; i < 5; ++i) rule.ObserveLoad(8, 8 * 0.050);  // 50 ms per block
  PrefillRate prefill;
  prefill.Observe(1600, 1.0);  // 10 ms per block
  for (int n : {1, 4, 64}) EXPECT_FALSE(rule.Load(n, 16, prefill)) << n;
  // Junk is ignored.
  rule.ObserveLoad(0, 1.0);
  rule.ObserveLoad(3, -1.0);
  prefill.Observe(10, 0.0);
  EXPECT_NEAR(prefill.rows_per_second(), 1600, 1e-9);
  EXPECT_NEAR(rule.LoadSeconds(1), 0.050, 1e-9);
}

}  // namespace
}  // namespace strata
