#include "server/step_clock.h"

#include <cmath>

#include "gtest/gtest.h"

namespace strata {
namespace {

// The balance point written out the other way round: the smallest M' with
// t_a * M / M' <= t_m / (n - 1), found by counting up.
int SmallestBalancingCount(double t_m, double t_a, int m, int n) {
  const int others = n < 2 ? 1 : n - 1;
  for (int candidate = 1;; ++candidate) {
    if (t_a * m / candidate <= t_m / others + 1e-9) return candidate;
  }
}

TEST(AdviseMemoryNodesTest, MatchesTheBalancePointFoundByCounting) {
  for (double t_m : {0.004, 0.010, 0.031}) {
    for (double t_a : {0.0005, 0.003, 0.012, 0.090}) {
      for (int m : {1, 2, 3, 8}) {
        for (int n : {1, 2, 3, 4, 7}) {
          EXPECT_EQ(AdviseMemoryNodes(t_m, t_a, m, n), SmallestBalancingCount(t_m, t_a, m, n))
              << "t_m " << t_m << " t_a " << t_a << " m " << m << " n " << n;
        }
      }
    }
  }
}

TEST(AdviseMemoryNodesTest, Examples) {
  // Attention twice as long as the GEMMs on 2 nodes, two batches: 4 nodes halve it.
  EXPECT_EQ(AdviseMemoryNodes(0.010, 0.020, 2, 2), 4);
  // Rotational with n = 4 batches wants t_a = t_m / 3: three times the nodes of t_a = t_m.
  EXPECT_EQ(AdviseMemoryNodes(0.010, 0.010, 2, 4), 6);
  // Far more memory than needed still advises one node, never zero.
  EXPECT_EQ(AdviseMemoryNodes(0.010, 0.0001, 4, 2), 1);
  // Nothing measured, or co-located (no memory nodes): no advice.
  EXPECT_EQ(AdviseMemoryNodes(0.0, 0.010, 2, 2), 0);
  EXPECT_EQ(AdviseMemoryNodes(0.010, 0.010, 0, 2), 0);
}

StepTiming Timing(uint64_t gemm_us, uint64_t attention_us) {
  StepTiming t;
  t.gemm_us = gemm_us;
  t.attention_us = attention_us;
  return t;
}

TEST(StepClockTest, SmoothsThePeriodAndSplitsTheStagger) {
  StepClock clock;
  EXPECT_EQ(clock.period(), absl::ZeroDuration());
  EXPECT_EQ(clock.StaggerGap(2), absl::ZeroDuration());
  clock.Observe(absl::Milliseconds(40), Timing(30000, 10000), true, false);
  EXPECT_EQ(clock.period(), absl::Milliseconds(40));  // the first step sets it
  EXPECT_EQ(clock.StaggerGap(4), absl::Milliseconds(10));
  EXPECT_EQ(clock.StaggerGap(1), absl::ZeroDuration());  // one replica: nothing to stagger
  // Later steps move it a fifth of the way each.
  clock.Observe(absl::Milliseconds(90), Timing(30000, 10000), true, false);
  EXPECT_NEAR(absl::ToDoubleMilliseconds(clock.period()), 40 + 0.2 * 50, 1e-6);
  double expected = 50;
  for (int i = 0; i < 40; ++i) {
    clock.Observe(absl::Milliseconds(20), Timing(30000, 10000), true, false);
    expected = 0.8 * expected + 0.2 * 20;
  }
  EXPECT_NEAR(absl::ToDoubleMilliseconds(clock.period()), expected, 1e-6);
  EXPECT_NEAR(absl::ToDoubleMilliseconds(clock.StaggerGap(2)), expected / 2, 1e-6);
}

TEST(StepClockTest, SizesFromDecodeStepsOnly) {
  StepClock clock;
  clock.Observe(absl::Milliseconds(200), Timing(150000, 40000), /*decode_only=*/false, false);
  EXPECT_EQ(clock.compute_seconds(), 0.0);          // a prefill step says nothing about t_m
  EXPECT_EQ(clock.period(), absl::ZeroDuration());  // nor about the decode period
  clock.Observe(absl::Milliseconds(12), Timing(8000, 3000), true, false);
  EXPECT_NEAR(clock.compute_seconds(), 0.008, 1e-12);
  EXPECT_NEAR(clock.attention_seconds(), 0.003, 1e-12);
}

TEST(StepClockTest, UnderTwoLanesTheWaitIsWhatAttentionTookBeyondTheOtherBatch) {
  StepClock clock;
  // Waited 2 ms after 8 ms of the other batch's GEMMs: attention took about 10 ms.
  clock.Observe(absl::Milliseconds(20), Timing(8000, 2000), true, /*overlapped=*/true);
  EXPECT_NEAR(clock.attention_seconds(), 0.010, 1e-12);
}

}  // namespace
}  // namespace strata
