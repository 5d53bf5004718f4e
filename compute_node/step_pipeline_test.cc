// The pipeline driver on its own, over a scripted lane engine: which plans run side by side,
// in what order stages run, and in what order results come back. (The real engine under
// the driver is tested by //server:disaggregated_test.)
#include "compute_node/step_pipeline.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

// Each plan's forward pass takes `step_id % 10` stages (0: answered at Begin). Records
// every call.
class ScriptedLanes : public LaneEngine {
 public:
  explicit ScriptedLanes(int lanes) : lanes_(lanes), left_(lanes, 0), step_(lanes, 0) {}
  int num_lanes() const override {
    EXPECT_FALSE(gone.load()) << "the engine was asked after it was gone";
    return lanes_;
  }
  std::optional<StepResult> Begin(int lane, const StepPlan& plan) override {
    log.push_back(absl::StrCat("begin ", plan.step_id, "@", lane));
    EXPECT_EQ(left_[lane], 0) << "lane " << lane << " begun while busy";
    int busy = 0;
    for (int l = 0; l < lanes_; ++l) busy += left_[l] > 0;
    max_busy = std::max(max_busy, busy + 1);
    if (plan.step_id % 10 == 0) {
      StepResult r;
      r.step_id = plan.step_id;
      return r;
    }
    left_[lane] = static_cast<int>(plan.step_id % 10);
    step_[lane] = plan.step_id;
    return std::nullopt;
  }
  bool Advance(int lane) override {
    log.push_back(absl::StrCat("advance ", step_[lane], "@", lane));
    std::this_thread::sleep_for(stage_time);
    return --left_[lane] == 0;
  }
  StepResult Finish(int lane) override {
    log.push_back(absl::StrCat("finish ", step_[lane], "@", lane));
    StepResult r;
    r.step_id = step_[lane];
    return r;
  }

  std::vector<std::string> log;
  std::chrono::milliseconds stage_time{0};  // each stage sleeps so long
  int max_busy = 0;
  std::atomic<bool> gone{false};

 private:
  int lanes_;
  std::vector<int> left_;
  std::vector<uint64_t> step_;
};

StepPlan Plan(uint64_t id, bool last_sampled = false) {
  StepPlan p;
  p.step_id = id;
  SequenceChunk c;
  c.tokens = {last_sampled ? kLastSampledToken : 5};
  p.chunks.push_back(c);
  return p;
}

// Queues `plans` up front, closes the queue, runs the pipeline; returns result ids in the
// order handed on.
std::vector<uint64_t> RunAll(LaneEngine& engine, std::vector<StepPlan> plans, bool abort = false) {
  PlanQueue queue;
  std::vector<uint64_t> results;
  for (StepPlan& p : plans) {
    queue.Push(
        {std::move(p), std::nullopt, [&results](StepResult r) { results.push_back(r.step_id); }});
  }
  if (abort) {
    queue.Abort();
  } else {
    queue.Close();
  }
  RunPipeline(engine, queue);
  return results;
}

// A poll that delivers a plan while it progresses (as the step channel's transport runs
// its handler on the waiting thread) ends the wait without sleeping, on the thread that
// polls, and counts as polled.
TEST(PlanQueueTest, APollThatDeliversAPlanEndsTheWait) {
  PlanQueue queue;
  std::thread::id polled_on;
  int rounds = 0;
  queue.SetPoll(
      [&](absl::FunctionRef<bool()> ready, absl::Time deadline) {
        polled_on = std::this_thread::get_id();
        EXPECT_FALSE(ready());
        EXPECT_GT(deadline, absl::Now());
        while (!ready()) {
          // The third round "receives" the plan, as a transport's Deliver would.
          if (++rounds == 3) queue.Push({Plan(7), std::nullopt, [](StepResult) {}});
        }
        return true;
      },
      absl::Seconds(10));
  const std::optional<QueuedPlan> plan = queue.Pop(/*wait=*/true);
  ASSERT_TRUE(plan.has_value());
  EXPECT_EQ(plan->plan.step_id, 7u);
  EXPECT_EQ(polled_on, std::this_thread::get_id());
  EXPECT_EQ(rounds, 3);
  EXPECT_EQ(queue.polled(), 1u);
}

// A poll that finds nothing by its deadline leaves the wait to the queue's own sleep: a
// plan pushed later from another thread still wakes it, and the wait is not counted.
// With a plan already queued the poll is not called at all, nor without `wait`.
TEST(PlanQueueTest, APollThatFindsNothingSleepsAsBefore) {
  PlanQueue queue;
  int polls = 0;
  std::thread pusher;
  queue.SetPoll(
      [&](absl::FunctionRef<bool()> ready, absl::Time deadline) {
        ++polls;
        EXPECT_FALSE(ready());
        EXPECT_GT(deadline, absl::Now());
        // The plan comes only after the poll has given up.
        pusher = std::thread([&] {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
          queue.Push({Plan(9), std::nullopt, [](StepResult) {}});
        });
        return false;
      },
      absl::Seconds(10));
  EXPECT_FALSE(queue.Pop(/*wait=*/false).has_value());
  EXPECT_EQ(polls, 0);
  const std::optional<QueuedPlan> plan = queue.Pop(/*wait=*/true);
  pusher.join();
  ASSERT_TRUE(plan.has_value());
  EXPECT_EQ(plan->plan.step_id, 9u);
  EXPECT_EQ(polls, 1);
  EXPECT_EQ(queue.polled(), 0u);
  queue.Push({Plan(10), std::nullopt, [](StepResult) {}});
  ASSERT_TRUE(queue.Pop(/*wait=*/true).has_value());
  EXPECT_EQ(polls, 1);
  // A queue closed while the poll runs ends it too: Pop then returns nothing.
  queue.SetPoll(
      [&](absl::FunctionRef<bool()> ready, absl::Time) {
        queue.Close();
        return ready();
      },
      absl::Seconds(10));
  EXPECT_FALSE(queue.Pop(/*wait=*/true).has_value());
}

TEST(StepPipelineTest, TwoLanesAlternateAndResultsKeepPlanOrder) {
  ScriptedLanes lanes(2);
  // Plan 3 takes three stages, plan 1 one: plan 1 finishes first but is handed on after 3.
  const auto results = RunAll(lanes, {Plan(3), Plan(1), Plan(2)});
  EXPECT_EQ(results, (std::vector<uint64_t>{3, 1, 2}));
  EXPECT_EQ(lanes.max_busy, 2);
  const std::vector<std::string> want = {
      "begin 3@0",   "begin 1@1",                  // both lanes start
      "advance 3@0", "advance 1@1", "finish 1@1",  // oldest first; 1 is done
      "begin 2@1",                                 // lane 1 takes the next plan at once
      "advance 3@0", "advance 2@1", "advance 3@0", "finish 3@0", "advance 2@1", "finish 2@1"};
  EXPECT_EQ(lanes.log, want);
}

TEST(StepPipelineTest, OneLaneRunsPlansOneAfterAnother) {
  ScriptedLanes lanes(1);
  const auto results = RunAll(lanes, {Plan(2), Plan(10), Plan(1)});
  EXPECT_EQ(results, (std::vector<uint64_t>{2, 10, 1}));
  EXPECT_EQ(lanes.max_busy, 1);
}

TEST(StepPipelineTest, APlanNamingTheLastSampledTokenNeverOverlaps) {
  ScriptedLanes lanes(2);
  const auto results = RunAll(lanes, {Plan(2), Plan(3, /*last_sampled=*/true), Plan(1)});
  EXPECT_EQ(results, (std::vector<uint64_t>{2, 3, 1}));
  // Plan 3 waits for plan 2 to finish; plan 1 may then run beside it.
  const auto begin3 = std::find(lanes.log.begin(), lanes.log.end(), "begin 3@0");
  const auto finish2 = std::find(lanes.log.begin(), lanes.log.end(), "finish 2@0");
  ASSERT_NE(begin3, lanes.log.end());
  EXPECT_LT(finish2, begin3);
}

TEST(StepPipelineTest, AnAbortedQueueAnswersItsPlansCancelledWithoutRunningThem) {
  ScriptedLanes lanes(2);
  PlanQueue queue;
  std::vector<absl::StatusCode> codes;
  for (uint64_t id : {1, 2}) {
    queue.Push({Plan(id), std::nullopt, [&](StepResult r) { codes.push_back(r.status.code()); }});
  }
  queue.Abort();
  RunPipeline(lanes, queue);
  EXPECT_EQ(codes, (std::vector<absl::StatusCode>{absl::StatusCode::kCancelled,
                                                  absl::StatusCode::kCancelled}));
  EXPECT_TRUE(lanes.log.empty());
}

TEST(StepPipelineTest, UnreadablePlansTakeTheirTurnInTheOrder) {
  ScriptedLanes lanes(2);
  PlanQueue queue;
  std::vector<uint64_t> results;
  auto done = [&](StepResult r) { results.push_back(r.step_id); };
  queue.Push({Plan(2), std::nullopt, done});
  StepResult refused;
  refused.step_id = 7;
  refused.status = absl::InvalidArgumentError("malformed");
  queue.Push({StepPlan(), refused, done});
  queue.Push({Plan(1), std::nullopt, done});
  queue.Close();
  RunPipeline(lanes, queue);
  EXPECT_EQ(results, (std::vector<uint64_t>{2, 7, 1}));
}

TEST(StepPipelineTest, AnIdlePipelineEndsWithoutTouchingTheEngine) {
  ScriptedLanes lanes(2);
  PlanQueue queue;
  std::atomic<bool> back{false};
  std::thread runner([&] { RunPipeline(lanes, queue); });
  queue.Push({Plan(1), std::nullopt, [&](StepResult) { back.store(true); }});
  while (!back.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // The runner now waits for a plan; the engine goes before the queue closes (an executor
  // outliving its engine at shutdown).
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  lanes.gone.store(true);
  queue.Close();
  runner.join();
}

// A plan started on an idle node after an earlier one reports how long it was queued
// before the node was free (positive) or how long the free node waited for it (negative);
// the first plan, and a plan started beside a busy lane, report nothing.
TEST(StepPipelineTest, PlansStartedIdleReportTheirSlack) {
  ScriptedLanes lanes(1);
  lanes.stage_time = std::chrono::milliseconds(40);
  PlanQueue queue;
  std::mutex mu;
  std::map<uint64_t, std::optional<int64_t>> slack;
  auto done = [&](StepResult r) {
    std::lock_guard<std::mutex> lock(mu);
    slack[r.step_id] = r.timing.plan_slack_us;
  };
  auto back = [&](uint64_t id) {
    while (true) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (slack.count(id) > 0) return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  };
  queue.Push({Plan(1), std::nullopt, done});  // one stage of 40 ms
  queue.Push({Plan(2), std::nullopt, done});  // queued all through plan 1
  std::thread runner([&] { RunPipeline(lanes, queue); });
  back(2);
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  queue.Push({Plan(3), std::nullopt, done});  // the node has been free for 60 ms
  back(3);
  queue.Close();
  runner.join();
  EXPECT_FALSE(slack[1].has_value()) << "the first plan has no earlier step";
  ASSERT_TRUE(slack[2].has_value());
  EXPECT_GE(*slack[2], 30'000) << "plan 2 waited in the queue through plan 1's 40 ms";
  ASSERT_TRUE(slack[3].has_value());
  EXPECT_LE(*slack[3], -50'000) << "the node waited 60 ms for plan 3";

  // Two lanes: plan 1 starts beside plan 3, and plan 2 on the lane plan 1 left while plan 3
  // still runs; neither started on an idle node.
  ScriptedLanes two(2);
  PlanQueue both;
  slack.clear();
  for (uint64_t id : {3, 1, 2}) both.Push({Plan(id), std::nullopt, done});
  both.Close();
  RunPipeline(two, both);
  ASSERT_EQ(slack.size(), 3u);
  for (const auto& [id, s] : slack) EXPECT_FALSE(s.has_value()) << "plan " << id;
}

}  // namespace
}  // namespace strata
