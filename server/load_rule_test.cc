// The swap-or-recompute rule against hand-computed costs: it loads until both sides are
// measured; it recovers a round-trip latency and a per-block cost from batches of different
// sizes; with a fixed latency it recomputes short prefixes and loads long ones; a disk slower
// per block than prefill is never worth it. The read-ahead rule (PreloadLead) is checked
// against a simulation of a step waiting on its layers.
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

// A batch that ran out of its deadline turns loading off whatever the prefix's length; once
// the last measure is old, one batch (and only one) is let through to measure the disk
// again, and a fast measure turns loading back on.
TEST(LoadRuleTest, ALateDiskIsRecomputedThenMeasuredAgainOnce) {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  LoadRule rule;
  PrefillRate prefill;
  prefill.Observe(1600, 1.0);  // 10 ms per 16-token block
  rule.ObserveLoad(8, 0.008, t0);
  EXPECT_TRUE(rule.Load(8, 16, prefill, t0 + absl::Seconds(1)));
  rule.ObserveLate(t0 + absl::Seconds(2));
  for (int n : {1, 8, 1000}) {
    EXPECT_FALSE(rule.Load(n, 16, prefill, t0 + absl::Seconds(3))) << n << " blocks";
  }
  const absl::Time stale = t0 + absl::Seconds(2) + LoadRule::kRemeasureAfter;
  EXPECT_FALSE(rule.Load(8, 16, prefill, stale - absl::Seconds(1)));
  EXPECT_TRUE(rule.Load(8, 16, prefill, stale)) << "never measured again";
  EXPECT_FALSE(rule.Load(8, 16, prefill, stale + absl::Milliseconds(1)))
      << "every request loaded while the one measuring batch was out";
  rule.ObserveLoad(8, 0.008, stale + absl::Milliseconds(10));
  EXPECT_TRUE(rule.Load(8, 16, prefill, stale + absl::Milliseconds(20)));
  // A slow measure stands for kRemeasureAfter too, then one batch measures again.
  rule.ObserveLoad(8, 8.0, stale + absl::Seconds(1));
  rule.ObserveLoad(8, 8.0, stale + absl::Seconds(1));
  EXPECT_FALSE(rule.Load(8, 16, prefill, stale + absl::Seconds(2)));
  EXPECT_TRUE(rule.Load(8, 16, prefill, stale + absl::Seconds(1) + LoadRule::kRemeasureAfter));
}

// The read-ahead rule against a direct simulation of a step that starts `lead` after its
// load: layer i is in DRAM at latency + (i + 1) t_l; the step waits for it, then computes
// it for t_c. The lead the rule gives is the least with no wait at all.
double Stall(double lead, double latency, double body, double compute, int layers) {
  double t = lead, stalled = 0;
  for (int i = 0; i < layers; ++i) {
    const double ready = latency + (i + 1) * body / layers;
    if (ready > t) {
      stalled += ready - t;
      t = ready;
    }
    t += compute / layers;
  }
  return stalled;
}

TEST(PreloadLeadTest, IsTheLeastLeadWithNoLayerWaiting) {
  struct Case {
    double latency, body, compute;
    int layers;
  };
  for (const Case& c :
       {Case{0.002, 0.010, 0.040, 18},  // disk faster than compute
        Case{0.002, 0.080, 0.040, 18},  // disk slower: read further ahead
        Case{0.0, 0.030, 0.030, 4}, Case{0.005, 0.001, 0.0, 1}, Case{0.001, 0.200, 0.010, 32}}) {
    const double lead = PreloadLead(c.latency, c.body, c.compute, c.layers);
    EXPECT_NEAR(Stall(lead, c.latency, c.body, c.compute, c.layers), 0, 1e-12)
        << c.body << " over " << c.compute;
    EXPECT_GT(Stall(lead - 1e-6, c.latency, c.body, c.compute, c.layers), 0)
        << "a shorter lead would do: " << c.body << " over " << c.compute;
  }
  // Loading everything first (today's whole load) is never needed when compute keeps up:
  EXPECT_LT(PreloadLead(0.002, 0.010, 0.040, 18), 0.002 + 0.010);
}

}  // namespace
}  // namespace strata