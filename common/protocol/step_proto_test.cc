#include "common/protocol/step_proto.h"

#include "gtest/gtest.h"

namespace strata {
namespace {

TEST(StepProto, PlanRoundTrip) {
  StepPlan plan;
  plan.step_id = 7;
  plan.epoch = 3;
  RequestSetup setup;
  setup.request_id = SequenceId(11);
  setup.prompt_len = 5;
  setup.sampling.temperature = 0.5f;
  setup.sampling.top_k = 40;
  setup.sampling.logit_bias = {{3, -1.5f}, {9, 2.0f}};
  setup.sampling.seed = 99;
  setup.sampling.num_logprobs = 2;
  plan.setups.push_back(setup);
  plan.releases.push_back({SequenceId(4), PoolIndex(1)});
  plan.assignments.push_back({SequenceId(11), PoolIndex(1), 0, {10, 11, 12, 13, 14}});
  plan.assignments[0].shifts.push_back({2, -32, {40, 41}, {1.0f, 0.5f}, {0.0f, -0.25f}});
  plan.chunks.push_back(
      {SequenceId(11), PoolIndex(1), 0, {1, 2, 3, 4, 5}, {{SequenceId(11), 0, 0, {2}}}, 0x5eed});
  control::StepPlan wire;
  ToProto(plan, &wire);
  // Through bytes, as on the network.
  control::StepPlan parsed;
  ASSERT_TRUE(parsed.ParseFromString(wire.SerializeAsString()));
  auto back = FromProto(parsed);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->step_id, 7u);
  EXPECT_EQ(back->epoch, 3u);
  ASSERT_EQ(back->setups.size(), 1u);
  EXPECT_EQ(back->setups[0].sampling.top_k, 40);
  EXPECT_EQ(back->setups[0].sampling.logit_bias, setup.sampling.logit_bias);
  EXPECT_EQ(back->releases[0].request_id, SequenceId(4));
  EXPECT_EQ(back->releases[0].pool, PoolIndex(1));
  EXPECT_EQ(back->assignments[0].request_id, SequenceId(11));
  EXPECT_EQ(back->assignments[0].pool, PoolIndex(1));
  EXPECT_EQ(back->chunks[0].pool, PoolIndex(1));
  EXPECT_EQ(back->assignments[0].slots, (std::vector<int32_t>{10, 11, 12, 13, 14}));
  ASSERT_EQ(back->assignments[0].shifts.size(), 1u);
  const KvShift& shift = back->assignments[0].shifts[0];
  EXPECT_EQ(shift.position, 2);
  EXPECT_EQ(shift.shift, -32);
  EXPECT_EQ(shift.from, (std::vector<int32_t>{40, 41}));
  EXPECT_EQ(shift.cos, (std::vector<float>{1.0f, 0.5f}));
  EXPECT_EQ(shift.sin, (std::vector<float>{0.0f, -0.25f}));
  EXPECT_EQ(back->chunks[0].samples[0].banned_tokens, (std::vector<int32_t>{2}));
  EXPECT_EQ(back->chunks[0].load_ticket, 0x5eedu);
  EXPECT_EQ(back->num_rows(), 5);
}

TEST(StepProto, MalformedPlansAreRejected) {
  control::StepPlan wire;
  auto* chunk = wire.add_chunks();
  chunk->set_request_id(1);  // no tokens
  EXPECT_FALSE(FromProto(wire).ok());
  control::StepPlan negative;
  auto* a = negative.add_assignments();
  a->set_start(-4);
  EXPECT_FALSE(FromProto(negative).ok());
  // A shift with no slots, or with more cosines than sines.
  control::StepPlan empty_shift;
  empty_shift.add_assignments()->add_shifts()->set_position(3);
  EXPECT_FALSE(FromProto(empty_shift).ok());
  control::StepPlan uneven;
  auto* shift = uneven.add_assignments()->add_shifts();
  shift->add_from(1);
  shift->add_cos(1.0f);
  EXPECT_FALSE(FromProto(uneven).ok());
  // Truncated bytes do not parse.
  control::StepPlan good;
  good.add_chunks()->add_tokens(5);
  const std::string bytes = good.SerializeAsString();
  control::StepPlan cut;
  EXPECT_FALSE(cut.ParseFromString(bytes.substr(0, bytes.size() - 1)));
}

TEST(StepProto, ResultRoundTrip) {
  StepResult r;
  r.step_id = 2;
  r.tokens.push_back({SequenceId(5), 42, -0.25f, {{42, -0.25f}, {7, -2.0f}}});
  r.failed.emplace_back(SequenceId(6), absl::UnavailableError("memory node 1 died"));
  r.status = absl::ResourceExhaustedError("no room");
  r.dead_pools = {PoolIndex(1)};
  r.timing.total_us = 1234;
  r.timing.plan_slack_us = -830;  // the node waited for the plan
  control::StepResult wire;
  ToProto(r, &wire);
  StepResult back = FromProto(wire);
  EXPECT_EQ(back.tokens[0].top_logprobs, r.tokens[0].top_logprobs);
  EXPECT_EQ(back.failed, r.failed);
  EXPECT_EQ(back.dead_pools, r.dead_pools);
  EXPECT_EQ(back.timing.total_us, 1234u);
  EXPECT_EQ(back.timing.plan_slack_us, std::optional<int64_t>(-830));
  // Codes survive the hop.
  EXPECT_EQ(back.failed[0].second.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(back.status, r.status);
  StepResult ok;
  control::StepResult ok_wire;
  ToProto(ok, &ok_wire);
  EXPECT_TRUE(FromProto(ok_wire).status.ok());
  EXPECT_FALSE(FromProto(ok_wire).timing.plan_slack_us.has_value()) << "unset stays unset";
  // A code this build does not know keeps its message.
  control::Status odd;
  odd.set_code(1234);
  odd.set_message("from the future");
  EXPECT_EQ(FromProto(odd), absl::UnknownError("from the future"));
}

}  // namespace
}  // namespace strata
