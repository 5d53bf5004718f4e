#include "deploy/planner/pipeline_model.h"

#include "gtest/gtest.h"

namespace strata::planner {
namespace {

// A model of 4 layers whose step costs 500 us of GEMMs at any batch (5 slices of 100 us),
// and whose attention costs `per_layer_us` per layer on one node.
Costs Simple(double attention_per_layer_us, double latency_us = 10.0) {
  Costs c;
  c.layers = 4;
  c.compute_us = Curve({{1, 500}, {64, 500}});
  c.attention_fixed_us = attention_per_layer_us * 4;
  c.link_latency_us = latency_us;
  c.link_bytes_per_us = 1e12;  // bandwidth out of the way
  c.step_gap_us = 50.0;
  return c;
}

TEST(CurveTest, InterpolatesAndExtends) {
  auto c = Curve::Parse("1:10,5:50,9:60");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->At(3), 30);
  EXPECT_DOUBLE_EQ(c->At(7), 55);
  EXPECT_DOUBLE_EQ(c->At(13), 70);  // past the end, along the last segment
  EXPECT_DOUBLE_EQ(c->At(0), 0);    // before the start, along the first
  EXPECT_FALSE(Curve::Parse("1:10,1:20").ok());
  EXPECT_FALSE(Curve::Parse("1-10").ok());
  EXPECT_FALSE(Curve::Parse("").ok());
}

TEST(PipelineModelTest, OneBatchIsTheSumOfItsParts) {
  for (bool async : {false, true}) {
    const Costs c = Simple(/*attention_per_layer_us=*/80.0);
    Scenario s;
    s.rows = 8;
    s.asynchronous = async;
    auto p = Simulate(c, s);
    ASSERT_TRUE(p.ok()) << p.status();
    // 5 slices, 4 attentions each with a latency out and back, and the gap unless async.
    const double step_us = 5 * 100 + 4 * (10 + 80 + 10) + (async ? 0 : 50);
    EXPECT_NEAR(p->step_ms, step_us / 1e3, 1e-9);
    EXPECT_NEAR(p->tokens_per_s, 8 / step_us * 1e6, 1e-6);
    EXPECT_NEAR(p->compute_bubble, 1 - 500 / step_us, 1e-9);
    EXPECT_NEAR(p->memory_bubble, 1 - 320 / step_us, 1e-9);
  }
}

// Serving's CPU on a shared device follows every step: with asynchronous scheduling it
// adds to the step; with synchronous scheduling it runs inside the step gap when it fits.
TEST(PipelineModelTest, ServingOnTheComputeDeviceFollowsEveryStep) {
  Costs c = Simple(/*attention_per_layer_us=*/80.0);
  c.serving_fixed_us = 20.0;
  c.serving_per_row_us = 2.0;  // 8 rows: 36 us per step
  Scenario s;
  s.rows = 8;
  for (bool async : {true, false}) {
    s.asynchronous = async;
    auto p = Simulate(c, s);
    ASSERT_TRUE(p.ok()) << p.status();
    const double step_us = 5 * 100 + 4 * (10 + 80 + 10) + (async ? 36 : 50);
    EXPECT_NEAR(p->step_ms, step_us / 1e3, 1e-9) << (async ? "async" : "sync");
    EXPECT_NEAR(p->compute_bubble, 1 - (500 + 36) / step_us, 1e-9);
  }
  // Longer than the gap: the next step waits for the device.
  c.serving_fixed_us = 84.0;  // 100 us per step
  s.asynchronous = false;
  auto p = Simulate(c, s);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_NEAR(p->step_ms, (5 * 100 + 4 * (10 + 80 + 10) + 100) / 1e3, 1e-9);
}

TEST(PipelineModelTest, TwoBatchesFillTheComputeDeviceWhenAttentionIsShort) {
  const Costs c = Simple(/*attention_per_layer_us=*/40.0, /*latency_us=*/5.0);
  Scenario off, two;
  off.rows = two.rows = 8;
  two.mode = Mode::kTwo;
  two.batches = 2;
  auto a = Simulate(c, off), b = Simulate(c, two);
  ASSERT_TRUE(a.ok() && b.ok());
  // Attention (50 us with the link) hides under the other batch's 100-us slice, so the
  // device runs back to back (the step gap hides too): 2 x 8 tokens per 2 x 500 us, where
  // one batch alone makes 8 tokens per 750 us.
  EXPECT_LT(b->compute_bubble, 0.03);
  EXPECT_NEAR(b->tokens_per_s, 2 * 8 / 1000.0 * 1e6, 0.03 * b->tokens_per_s);
  EXPECT_NEAR(a->tokens_per_s, 8 / 750.0 * 1e6, 1e-6);
  EXPECT_GT(b->tokens_per_s, 1.45 * a->tokens_per_s);
}

TEST(PipelineModelTest, WhenAttentionDominatesTheMemoryNodeSetsThePace) {
  Costs c = Simple(/*attention_per_layer_us=*/0.0, /*latency_us=*/1.0);
  c.attention_per_row_us = 400.0;  // 4 rows: 1600 us for 4 layers, 400 per layer
  Scenario two;
  two.mode = Mode::kTwo;
  two.batches = 2;
  two.rows = 4;
  auto p = Simulate(c, two);
  ASSERT_TRUE(p.ok());
  // The memory node serves both batches' 4 layers of 400 us per step, back to back.
  EXPECT_NEAR(p->tokens_per_s, 2 * 4 / (2 * 4 * 400.0) * 1e6, 0.03 * p->tokens_per_s);
  EXPECT_LT(p->memory_bubble, 0.03);
  // Four memory nodes take a quarter of the rows each: attention (100 us a layer) now hides
  // under the other batch's slices, and the compute device sets the pace.
  two.memory_nodes = 4;
  auto q = Simulate(c, two);
  ASSERT_TRUE(q.ok());
  EXPECT_NEAR(q->tokens_per_s, 2 * 4 / 1000.0 * 1e6, 0.05 * q->tokens_per_s);
  EXPECT_LT(q->compute_bubble, 0.05);
  // A fixed cost per node does not shrink with more nodes.
  Costs fixed_cost = c;
  fixed_cost.attention_per_row_us = 0;
  fixed_cost.attention_fixed_us = 1600;
  auto r = Simulate(fixed_cost, two);
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(r->tokens_per_s, p->tokens_per_s, 0.03 * p->tokens_per_s);
}

TEST(PipelineModelTest, FixedReplicasAddUpAndTakeTurnsOnMemory) {
  const Costs c = Simple(/*attention_per_layer_us=*/40.0, /*latency_us=*/5.0);
  Scenario one, fixed;
  one.rows = fixed.rows = 8;
  fixed.mode = Mode::kFixed;
  fixed.batches = 3;
  fixed.compute_devices = 3;
  auto a = Simulate(c, one), b = Simulate(c, fixed);
  ASSERT_TRUE(a.ok() && b.ok());
  // Three replicas with their own devices: three times one, as attention (160 us of a
  // 750-us step) leaves room for all three on one memory node.
  EXPECT_NEAR(b->tokens_per_s, 3 * a->tokens_per_s, 0.05 * b->tokens_per_s);
  // Sharing one device, three replicas are no faster than the device.
  fixed.compute_devices = 1;
  auto d = Simulate(c, fixed);
  ASSERT_TRUE(d.ok());
  EXPECT_LE(d->tokens_per_s, 8 / 500.0 * 1e6 * 1.001);
}

TEST(PipelineModelTest, RotationKeepsEveryReplicaBusyWhereFixedWaits) {
  // Lamina's balance point: t_a = t_m / (n - 1). Per layer, a slice takes 100 us and an
  // attention 50 us, so with n = 3 batches on 2 replicas no replica ever waits.
  Costs c = Simple(/*attention_per_layer_us=*/45.0, /*latency_us=*/2.5);
  c.step_gap_us = 0;
  Scenario fixed, rotational;
  fixed.rows = rotational.rows = 8;
  fixed.mode = Mode::kFixed;
  fixed.batches = 2;
  fixed.compute_devices = 2;
  rotational.mode = Mode::kRotational;
  rotational.batches = 3;
  rotational.compute_devices = 2;
  auto f = Simulate(c, fixed), r = Simulate(c, rotational);
  ASSERT_TRUE(f.ok() && r.ok()) << r.status();
  EXPECT_LT(r->compute_bubble, 0.05);
  EXPECT_GT(f->compute_bubble, 0.2);  // each replica waits out its batch's attention
  EXPECT_GT(r->tokens_per_s, 1.25 * f->tokens_per_s);
  // Migrating the context costs nothing while it is shorter than the attention, and shows
  // once it is longer.
  Costs slow = c;
  slow.context_bytes_per_row = 1.0;
  slow.link_bytes_per_us = 8.0 / 200.0;  // 8 rows take 200 us to move
  auto s = Simulate(slow, rotational);
  ASSERT_TRUE(s.ok());
  EXPECT_LT(s->tokens_per_s, 0.8 * r->tokens_per_s);
}

TEST(PipelineModelTest, RejectsImpossibleSetups) {
  const Costs c = Simple(10.0);
  Scenario s;
  s.mode = Mode::kRotational;
  s.batches = 1;
  EXPECT_FALSE(Simulate(c, s).ok());
  s.mode = Mode::kTwo;
  s.batches = 2;
  s.asynchronous = true;
  EXPECT_FALSE(Simulate(c, s).ok());
  s.asynchronous = false;
  s.memory_nodes = 0;
  EXPECT_FALSE(Simulate(c, s).ok());
  EXPECT_FALSE(ParseMode("sideways").ok());
}

}  // namespace
}  // namespace strata::planner
