// Several plans in flight per compute node and asynchronous scheduling, on the real
// forward pass: their outputs equal one plan at a time and synchronous scheduling bit for
// bit, over an in-process node and over a step channel on the data plane; stops, timeouts
// and cancellations are acted on one step late at most; plans ahead go out when the
// running step is about to end.
#include "server/scheduler.h"
#include "server/scheduler_test_harness.h"

namespace strata {
namespace {

using scheduler_testing::Carrier;
using scheduler_testing::Harness;
using scheduler_testing::SchedulerTest;

// Two plans per compute node: the second (of other sequences) waits at the node while the
// first runs. Outputs are those of one plan at a time, greedy and seeded, with chunked
// prefill, n > 1, prefix reuse and preemption in the mix.
TEST_F(SchedulerTest, TwoPlansInFlightGiveTheOutputsOfOne) {
  std::vector<GenerateRequest> requests;
  for (int i = 0; i < 8; ++i) requests.push_back(Greedy(Prompt(20 + 29 * i, 40 + i), 10));
  GenerateRequest seeded = Greedy(Prompt(50, 7), 12);
  seeded.sampling.temperature = 0.8f;
  seeded.sampling.seed = 1234;
  seeded.has_seed = true;
  seeded.n = 2;
  requests.push_back(seeded);
  GenerateRequest shared = Greedy(Prompt(40, 40), 8);  // shares request 0's prompt
  shared.prompt_tokens.push_back(99);
  requests.push_back(shared);
  SchedulerConfig one = Config();
  one.max_num_seqs = 3;  // several batches, so a second plan has sequences to take
  SchedulerConfig two = one;
  two.max_plans_in_flight = 2;
  // Roomy, then tight enough to preempt.
  for (int64_t slots : {int64_t{4096}, int64_t{420}}) {
    SchedulerStats stats_one, stats_two;
    int held_one = 0, held_two = 0;
    const auto a = Run(one, slots, requests, &stats_one, &held_one);
    const auto b = Run(two, slots, requests, &stats_two, &held_two);
    ASSERT_EQ(a.size(), requests.size());
    ASSERT_EQ(b.size(), requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_TRUE(b[i]->error.ok()) << b[i]->error;
      EXPECT_EQ(a[i]->tokens, b[i]->tokens) << "request " << i << ", " << slots << " slots";
      EXPECT_EQ(a[i]->finish, b[i]->finish) << "request " << i;
    }
    EXPECT_EQ(held_one, 1);
    EXPECT_EQ(held_two, 2) << "the second plan never went out while the first ran";
    if (slots == 420) EXPECT_GT(stats_two.num_preemptions_total, 0) << "no preemption";
  }
}

// Asynchronous scheduling against synchronous: the same outputs bit for bit, greedy and
// seeded with penalties, with stops seen one step late (a stop token, min_tokens holding
// it back, max_tokens), n > 1, prefix reuse, and preemption in a tight pool. The token
// sampled past a stop is discarded: never streamed, and its KV freed (Run checks no leak).
TEST_F(SchedulerTest, AsyncSchedulingIsBitIdenticalToSync) {
  SchedulerConfig sync = Config();
  SchedulerConfig async = AsyncConfig();
  // `late` plans ahead with the default lead; `async` as soon as a step starts, so that
  // every row that can go ahead does (with the default lead, this model's steps of a
  // millisecond or two often come back before the plan ahead is due).
  SchedulerConfig late = async;
  async.plan_ahead_lead = 1;

  const std::vector<GenerateRequest> requests = AsyncCases();
  const size_t kStopped = requests.size() - 2;

  // Roomy, then tight enough to preempt.
  for (int64_t slots : {int64_t{4096}, int64_t{300}}) {
    SCOPED_TRACE(absl::StrCat(slots, " slots"));
    SchedulerStats stats_sync, stats_async;
    int held_sync = 0, held_async = 0;
    const auto a = Run(sync, slots, requests, &stats_sync, &held_sync);
    const auto b = Run(async, slots, requests, &stats_async, &held_async);
    const auto c = Run(late, slots, requests);
    ASSERT_EQ(a.size(), requests.size());
    ASSERT_EQ(b.size(), requests.size());
    ASSERT_EQ(c.size(), requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_TRUE(a[i]->error.ok()) << a[i]->error;
      EXPECT_TRUE(b[i]->error.ok()) << b[i]->error;
      EXPECT_EQ(a[i]->tokens, b[i]->tokens) << "request " << i;
      EXPECT_EQ(a[i]->finish, b[i]->finish) << "request " << i;
      EXPECT_EQ(b[i]->late_updates, 0) << "request " << i;
      EXPECT_EQ(a[i]->tokens, c[i]->tokens) << "request " << i << ", planned ahead late";
      EXPECT_EQ(a[i]->finish, c[i]->finish) << "request " << i << ", planned ahead late";
    }
    EXPECT_EQ(a[kStopped]->finish[0], FinishReason::kStop) << "the stop token never stopped it";
    EXPECT_LE(a[kStopped]->tokens[0].size(), 6u);
    EXPECT_GT(a[kStopped + 1]->tokens[0].size(), 8u - 1) << "min_tokens did not hold the stop";
    EXPECT_EQ(held_sync, 1);
    EXPECT_EQ(held_async, 2) << "no plan went out while the previous one ran";
    EXPECT_EQ(stats_sync.async_rows_total, 0);
    EXPECT_GT(stats_async.async_rows_total, 0) << "no row was planned ahead of its token";
    // In the tight pool a row ahead may find no room and wait for its token instead.
    if (slots == 4096) {
      EXPECT_GT(stats_async.discarded_tokens_total, 0) << "no stop was seen one step late";
    }
    EXPECT_EQ(stats_sync.discarded_tokens_total, 0);
    EXPECT_EQ(stats_async.generation_tokens_total, stats_sync.generation_tokens_total)
        << "a discarded token was billed";
    if (slots == 300) {
      EXPECT_GT(stats_sync.num_preemptions_total, 0) << "no preemption";
      EXPECT_GT(stats_async.num_preemptions_total, 0) << "no preemption";
    }
  }
}

// Plans and results over a step channel on the data plane (UCX over loopback tcp, as between
// a scheduler and a compute node process) give the in-process node's outputs bit for bit,
// with synchronous and asynchronous scheduling, in a roomy pool and one that preempts.
TEST_F(SchedulerTest, StepsOverTheDataPlaneGiveTheInProcessNodesOutputs) {
  SchedulerConfig async = AsyncConfig();
  async.plan_ahead_lead = 1;
  const std::vector<GenerateRequest> requests = AsyncCases();
  for (int64_t slots : {int64_t{4096}, int64_t{300}}) {
    for (const SchedulerConfig& config : {Config(), async}) {
      SCOPED_TRACE(absl::StrCat(slots, " slots, ", config.async_scheduling ? "async" : "sync"));
      const auto direct = Run(config, slots, requests);
      SchedulerStats stats;
      int held = 0;
      const auto carried = Run(config, slots, requests, &stats, &held, Carrier::kStepChannel);
      ASSERT_EQ(direct.size(), requests.size());
      ASSERT_EQ(carried.size(), requests.size());
      for (size_t i = 0; i < requests.size(); ++i) {
        EXPECT_TRUE(carried[i]->error.ok()) << carried[i]->error;
        EXPECT_EQ(direct[i]->tokens, carried[i]->tokens) << "request " << i;
        EXPECT_EQ(direct[i]->finish, carried[i]->finish) << "request " << i;
        EXPECT_EQ(carried[i]->late_updates, 0) << "request " << i;
      }
      EXPECT_EQ(held, config.async_scheduling ? 2 : 1);
      if (slots == 300) EXPECT_GT(stats.num_preemptions_total, 0) << "no preemption";
    }
  }
}

// With asynchronous scheduling a timeout or cancellation is acted on one step late at most:
// the output so far is a prefix of the full output, nothing follows the final update, and
// every KV slot comes back.
TEST_F(SchedulerTest, AsyncSchedulingEndsTimedOutAndCancelledRequestsCleanly) {
  SchedulerConfig async = AsyncConfig();
  // Long enough that no machine writes it all in the 150 ms the timed copy gets (200 tokens
  // took less on a Zen 5).
  const GenerateRequest full_request = Greedy(Prompt(30, 3), 900);
  const auto full = Run(Config(), 4096, {full_request});
  Harness h(weights_, async, 4096);
  GenerateRequest slow = full_request;
  slow.timeout = absl::Milliseconds(150);
  auto timed = *h.Submit(slow);
  auto cancelled = *h.Submit(Greedy(Prompt(30, 4), 900));
  auto bystander = *h.Submit(Greedy(Prompt(25, 5), 30));
  absl::SleepFor(absl::Milliseconds(30));
  h.scheduler().Cancel(h.ids_[1]);
  h.Wait({timed, cancelled, bystander});
  EXPECT_EQ(timed->finish[0], FinishReason::kTimeout);
  EXPECT_EQ(timed->error.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(cancelled->finish[0], FinishReason::kAbort);
  const auto& got = timed->tokens[0];
  ASSERT_LT(got.size(), full[0]->tokens[0].size());
  EXPECT_TRUE(std::equal(got.begin(), got.end(), full[0]->tokens[0].begin()))
      << "the timed-out output is not a prefix of the full one";
  const auto alone = Run(Config(), 4096, {Greedy(Prompt(25, 5), 30)});
  EXPECT_EQ(bystander->tokens, alone[0]->tokens);
  for (const auto& o : {timed, cancelled, bystander}) EXPECT_EQ(o->late_updates, 0);
  h.ExpectNoLeak();
}

// Asynchronous scheduling builds the plan ahead shortly before the running step is expected
// to end (from the node's own step times), not when it starts: a request that arrives
// meanwhile joins the next step instead of the one after.
TEST_F(SchedulerTest, AsyncSchedulingPlansAheadLate) {
  constexpr absl::Duration kStep = absl::Milliseconds(300);
  SchedulerConfig async = AsyncConfig();
  Harness h(weights_, async, 4096);
  h.executor().set_step_delay(kStep);
  auto first = *h.Submit(Greedy(Prompt(20, 7), 10));
  h.Wait({first});
  const auto ahead = h.executor().ahead_after();
  // The first plans ahead go out at once (no step time known yet); the later ones must wait
  // for most of the running step (the lead is a quarter of it).
  ASSERT_GE(ahead.size(), 4u) << "too few plans went out ahead of their token";
  for (size_t i = 2; i < ahead.size(); ++i) {
    EXPECT_GE(ahead[i], kStep / 2) << "plan ahead " << i << " went out early";
  }
  const auto alone = Run(Config(), 4096, {Greedy(Prompt(20, 7), 10)});
  EXPECT_EQ(first->tokens, alone[0]->tokens);
  h.ExpectNoLeak();
}

// A node that reports it waited for each plan ahead (negative slack) gets the next ones
// earlier, by what it waited, until they go out as soon as the running step starts.
TEST_F(SchedulerTest, AsyncSchedulingPlansAheadEarlierWhereTheNodeWaitedForPlans) {
  constexpr absl::Duration kStep = absl::Milliseconds(200);
  SchedulerConfig async = AsyncConfig();
  Harness h(weights_, async, 4096);
  h.executor().set_step_delay(kStep);
  h.executor().set_slack_us(-80'000);
  auto first = *h.Submit(Greedy(Prompt(20, 7), 12));
  h.Wait({first});
  const auto ahead = h.executor().ahead_after();
  ASSERT_GE(ahead.size(), 8u) << "too few plans went out ahead of their token";
  // The margin grows by 80 ms with each plan ahead back, to the whole step: the last plans
  // ahead go out at once, where without the waits they would wait for most of the step
  // (AsyncSchedulingPlansAheadLate).
  for (size_t i = ahead.size() - 3; i < ahead.size(); ++i) {
    EXPECT_LT(ahead[i], kStep / 4) << "plan ahead " << i << " still went out late";
  }
  EXPECT_GT(h.scheduler().Stats().plan_ahead_margin_seconds, absl::ToDoubleSeconds(kStep) / 2);
  const auto alone = Run(Config(), 4096, {Greedy(Prompt(20, 7), 12)});
  EXPECT_EQ(first->tokens, alone[0]->tokens);
  h.ExpectNoLeak();
}

// Steps that end long before the scheduler expects (its estimate still remembers slower
// ones) come back before the timer that was to plan ahead of them fires: the next plan then
// goes at once and counts as a plan ahead that was late, so its slack is learnt too.
TEST_F(SchedulerTest, AsyncSchedulingLearnsFromPlansAheadThatTheResultBeat) {
  SchedulerConfig async = AsyncConfig();
  Harness h(weights_, async, 4096);
  h.executor().set_step_delay(absl::Milliseconds(300));
  h.executor().set_later_steps(4, absl::Milliseconds(10));
  h.executor().set_slack_us(-3'000);
  auto first = *h.Submit(Greedy(Prompt(20, 7), 14));
  h.Wait({first});
  EXPECT_GT(h.scheduler().Stats().plan_ahead_margin_seconds, 0.005)
      << "the late plans' waits were not learnt";
  const auto alone = Run(Config(), 4096, {Greedy(Prompt(20, 7), 14)});
  EXPECT_EQ(first->tokens, alone[0]->tokens);
  h.ExpectNoLeak();
}

TEST_F(SchedulerTest, AsyncSchedulingNeedsTwoPlansInFlight) {
  SchedulerConfig c = Config();
  c.async_scheduling = true;
  c.max_plans_in_flight = 1;
  EXPECT_EQ(Scheduler::ValidateConfig(c).code(), absl::StatusCode::kInvalidArgument);
  c.max_plans_in_flight = 2;
  EXPECT_TRUE(Scheduler::ValidateConfig(c).ok());
}
}  // namespace
}  // namespace strata
