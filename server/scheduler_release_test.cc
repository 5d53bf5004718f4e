// Releases: the messages that drop a sequence's slot table on the memory node and its state
// on the compute node, once the sequence has finished or been preempted (and placed again
// under a new id). What is checked is that each such table is named by some plan that goes
// out, however the plan that carried it first fared (refused, lost with its node), and that
// no release ever names a table in use. The fixture is scheduler_planner_fixture.h.
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/scheduler.h"
#include "server/scheduler_planner_fixture.h"

namespace strata {
namespace {

using planner_testing::HeldExecutor;
using planner_testing::PlannerTest;

// The sequences the plans `node` holds release.
std::set<SequenceId> Released(const HeldExecutor& node) {
  std::set<SequenceId> ids;
  for (const auto& [plan, sink] : node.held) {
    for (const TableRelease& r : plan->releases) ids.insert(r.request_id);
  }
  return ids;
}

// Two replicas, one plan out: the index of the replica that holds it (the other is 1 - it).
int HolderOfTheOnlyPlan(const std::vector<HeldExecutor*>& replicas) {
  EXPECT_EQ(replicas.at(0)->held.size() + replicas.at(1)->held.size(), 1u);
  return replicas[0]->held.empty() ? 1 : 0;
}

// A plan that fails may carry the release of a request that finished before it; it may not
// have reached the memory node, so the next plan carries that release again (it used to be
// lost, and the sequence's KV tables stayed on the node for good).
TEST_F(PlannerTest, AFailedPlansReleasesAreSentAgain) {
  Start(/*async=*/false);
  Submit({1, 2, 3}, 1, {}, /*run=*/false);
  Submit({4, 5, 6}, 5);
  ASSERT_EQ(executor_->held.size(), 1u);
  ASSERT_EQ(Held(0).chunks.size(), 2u);
  SequenceId done;
  for (const SequenceChunk& c : Held(0).chunks) {
    if (c.tokens == std::vector<int32_t>{1, 2, 3}) done = c.request_id;
  }
  ASSERT_NE(done, SequenceId());
  auto releases = [&](size_t i) {
    std::set<SequenceId> ids;
    for (const TableRelease& r : Held(i).releases) ids.insert(r.request_id);
    return ids;
  };
  Answer(10);  // the first request is done after one token
  ASSERT_EQ(executor_->held.size(), 1u);
  ASSERT_TRUE(releases(0).contains(done)) << "the finished request is released";
  Answer(0, absl::FailedPreconditionError("the node refused the plan"));
  ASSERT_EQ(executor_->held.size(), 1u) << "the other request runs again";
  EXPECT_TRUE(releases(0).contains(done)) << "the refused plan's release was lost";
  Answer(11);
  while (!executor_->held.empty()) Answer(12);
  EXPECT_EQ(UsedSlots(), 0);
}

// A release-only plan that fails is sent again, but not for ever: after three more tries the
// release waits, and goes with the node's next plan once one of its plans has landed (it
// used to be given up, and the memory node kept the table). So is the release of an n > 1
// sample that finished while its siblings run.
TEST_F(PlannerTest, ReleasesOfFinishedSequencesSurviveFailedPlansUntilOneLands) {
  Start(/*async=*/false);
  Submit({1, 2, 3}, 1);
  Answer(10);  // done: its release goes in a plan of its own
  ASSERT_EQ(executor_->held.size(), 1u);
  ASSERT_EQ(Held(0).releases.size(), 1u);
  const SequenceId finished = Held(0).releases[0].request_id;
  int resent = 0;
  while (!executor_->held.empty()) {
    ASSERT_TRUE(Held(0).chunks.empty());
    ASSERT_EQ(Held(0).releases.size(), 1u);
    ++resent;
    Answer(0, absl::UnavailableError("the node failed the plan"));
    ASSERT_LE(resent, 10) << "sent for ever";
  }
  EXPECT_EQ(resent, 4) << "the release and three more tries";
  // The node works again: its first plan that lands brings the parked release back.
  Submit({7, 8, 9}, 2);
  ASSERT_EQ(executor_->held.size(), 1u);
  EXPECT_FALSE(Released(*executor_).contains(finished)) << "sent before a plan landed";
  Answer(10);
  ASSERT_EQ(executor_->held.size(), 1u);
  EXPECT_TRUE(Released(*executor_).contains(finished)) << "the release was lost";
  while (!executor_->held.empty()) Answer(12);
  EXPECT_EQ(UsedSlots(), 0);

  // Two samples: the first stops at once, the second runs on.
  GenerateRequest r;
  r.prompt_tokens = {4, 5, 6};
  r.max_tokens = 4;
  r.n = 2;
  r.ignore_eos = true;
  r.stop_token_ids = {11};
  r.sampling.temperature = 0.0f;
  ASSERT_TRUE(scheduler_->Submit(r, [](const RequestUpdate&) {}).ok());
  scheduler_->RunPending();
  // The prefill draws both samples' first tokens: the first sample's is its stop token.
  ASSERT_EQ(executor_->held.size(), 1u);
  ASSERT_EQ(Held(0).chunks.size(), 1u);
  ASSERT_EQ(Held(0).chunks[0].samples.size(), 2u);
  const SequenceId stops = Held(0).chunks[0].samples[0].request_id;
  auto answer = [&](absl::Status status) {
    auto [plan, sink] = std::move(executor_->held.front());
    executor_->held.pop_front();
    StepResult result;
    result.step_id = plan->step_id;
    result.status = status;
    for (const SequenceChunk& c : plan->chunks) {
      for (const SampleTarget& t : c.samples) {
        if (status.ok()) result.tokens.push_back({t.request_id, t.request_id == stops ? 11 : 12});
      }
    }
    sink(std::move(result));
    scheduler_->RunPending();
  };
  auto released = [&](size_t i) {
    std::set<SequenceId> ids;
    for (const TableRelease& x : Held(i).releases) ids.insert(x.request_id);
    return ids;
  };
  answer(absl::OkStatus());
  ASSERT_EQ(executor_->held.size(), 1u);
  ASSERT_TRUE(released(0).contains(stops)) << "the stopped sample is released";
  answer(absl::UnavailableError("the node failed the plan"));
  ASSERT_EQ(executor_->held.size(), 1u) << "the other sample runs again";
  EXPECT_TRUE(released(0).contains(stops)) << "the failed plan's release was lost";
  while (!executor_->held.empty()) answer(absl::OkStatus());
  EXPECT_EQ(UsedSlots(), 0);
}

// A release parked after failed plans names a table of its pool's old ledger once the pool
// has died: it is dropped with the pool, and no plan of the pool that came back carries it.
TEST_F(PlannerTest, AParkedReleaseGoesWithItsPool) {
  Start(/*async=*/false);
  Submit({1, 2, 3}, 1);
  Answer(10);
  ASSERT_EQ(executor_->held.size(), 1u);
  ASSERT_EQ(Held(0).releases.size(), 1u);
  const SequenceId finished = Held(0).releases[0].request_id;
  while (!executor_->held.empty()) Answer(0, absl::UnavailableError("the node failed the plan"));
  scheduler_->SetPoolAlive(PoolIndex(0), false);
  scheduler_->RunPending();
  scheduler_->SetPoolAlive(PoolIndex(0), true);
  scheduler_->RunPending();
  Submit({7, 8, 9}, 3);
  bool released = false;
  for (int steps = 0; !executor_->held.empty() && steps < 10; ++steps) {
    released = released || Released(*executor_).contains(finished);
    Answer(12);
  }
  EXPECT_TRUE(executor_->held.empty());
  EXPECT_FALSE(released) << "a dead pool's table was released on the pool that came back";
}

// A request that finished with a plan still out releases its slots when that plan lands.
// If its pool died and came back meanwhile, those slots went with the old ledger: the new
// one's slots, now another request's, must not be released for it.
TEST_F(PlannerTest, AFinishedRequestsLateReleaseSparesAPoolThatCameBack) {
  Start(/*async=*/true);
  Submit({1, 2, 3, 4, 5}, 40, /*stop_ids=*/{11});
  Answer(10);  // its first token, with a plan ahead of it out
  ASSERT_EQ(executor_->held.size(), 2u);
  Answer(11);  // its stop token: finished, with the plan ahead still out
  ASSERT_EQ(executor_->held.size(), 1u);
  ASSERT_EQ(Held(0).chunks.size(), 1u) << "the plan ahead holds the finished request";
  ASSERT_FALSE(updates_.empty());
  ASSERT_TRUE(updates_.back().finished);
  scheduler_->SetPoolAlive(PoolIndex(0), false);
  scheduler_->RunPending();
  scheduler_->SetPoolAlive(PoolIndex(0), true);
  scheduler_->RunPending();
  Submit({21, 22, 23, 24, 25, 26, 27}, 4);
  const int64_t used = UsedSlots();
  ASSERT_GE(used, 7) << "the new request holds its prompt's slots";
  // The finished request's plan lands: nothing of the new ledger is released for it.
  auto [plan, sink] = std::move(executor_->held.front());
  executor_->held.pop_front();
  StepResult result;
  result.step_id = plan->step_id;
  for (const SequenceChunk& c : plan->chunks) {
    for (const SampleTarget& t : c.samples) result.tokens.push_back({t.request_id, 12});
  }
  sink(std::move(result));
  scheduler_->RunPending();
  EXPECT_GE(UsedSlots(), used);
}

// A preempted request's release goes in a plan that fails: it is sent again, and the
// request, placed again, runs under a new sequence id, so that no release (first or sent
// again, on this node or another) ever names the table it has now.
TEST_F(PlannerTest, APreemptedRequestsReleaseIsSentAgainAndNeverNamesItsNewTable) {
  Start(/*async=*/false, /*slots=*/24);
  Submit({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 10, {}, /*run=*/false);
  Submit({11, 12, 13, 14, 15, 16, 17, 18, 19, 20}, 10);
  ASSERT_EQ(executor_->held.size(), 1u);
  ASSERT_EQ(Held(0).chunks.size(), 2u);
  const SequenceId newer = Held(0).chunks[1].request_id;
  std::set<SequenceId> released;  // every id a plan has released so far
  // Answers the oldest plan (`token` for each draw, or the failure), checking that nothing
  // it runs has been released before or in it.
  auto answer = [&](int32_t token, absl::Status status) {
    for (const TableRelease& r : Held(0).releases) released.insert(r.request_id);
    for (const SequenceChunk& c : Held(0).chunks) {
      EXPECT_FALSE(released.contains(c.request_id))
          << "step " << Held(0).step_id << " runs sequence " << c.request_id.value()
          << ", whose table a release names";
    }
    Answer(token, status);
  };
  answer(30, absl::OkStatus());
  answer(31, absl::OkStatus());  // the pool is full
  answer(32, absl::OkStatus());  // positions 12 need two more slots
  ASSERT_EQ(executor_->held.size(), 1u);
  ASSERT_EQ(Held(0).releases.size(), 1u) << "the newer request is preempted for the older";
  ASSERT_EQ(Held(0).releases[0].request_id, newer);
  answer(0, absl::UnavailableError("the node failed the plan"));
  ASSERT_EQ(executor_->held.size(), 1u);
  bool sent_again = false;
  for (const TableRelease& r : Held(0).releases) sent_again = sent_again || r.request_id == newer;
  EXPECT_TRUE(sent_again) << "the failed plan's release of the preempted request was lost";
  for (int i = 0; i < 100 && !executor_->held.empty(); ++i) answer(40, absl::OkStatus());
  EXPECT_TRUE(executor_->held.empty());
  EXPECT_EQ(FinishedWithoutError(), 2);
  EXPECT_EQ(UsedSlots(), 0);
}

// After a failed plan that carried releases, a plan of releases alone waits out a backoff
// that doubles with each failure in a row, rather than going again at once; a plan with
// rows, for a request that arrives meanwhile, carries them at once.
TEST_F(PlannerTest, AFailedReleaseWaitsOutABackoffUnlessAPlanWithRowsTakesIt) {
  const absl::Duration backoff = absl::Milliseconds(20);
  configure_ = [&](SchedulerConfig& c) { c.release_retry_backoff = backoff; };
  Start(/*async=*/false);
  Submit({1, 2, 3}, 1);
  Answer(10);  // done: its release goes in a plan of its own
  ASSERT_EQ(executor_->held.size(), 1u);
  ASSERT_TRUE(Held(0).chunks.empty());
  ASSERT_EQ(Held(0).releases.size(), 1u);
  const SequenceId done = Held(0).releases[0].request_id;
  for (int failure = 0; failure < 2; ++failure) {
    const absl::Time failed = absl::Now();
    Answer(0, absl::UnavailableError("the node failed the plan"));
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    while (executor_->held.empty() && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(1));
      scheduler_->RunPending();  // runs the timers that are due
    }
    ASSERT_EQ(executor_->held.size(), 1u) << "the release is not sent again";
    EXPECT_GE(absl::Now() - failed, backoff * (1 << failure)) << "sent again too soon";
    ASSERT_TRUE(Held(0).chunks.empty());
    ASSERT_EQ(Held(0).releases.size(), 1u);
    EXPECT_EQ(Held(0).releases[0].request_id, done);
  }
  Answer(0, absl::UnavailableError("the node failed the plan"));
  ASSERT_TRUE(executor_->held.empty());
  Submit({4, 5, 6}, 1);
  ASSERT_EQ(executor_->held.size(), 1u) << "the new request waits for the backoff";
  EXPECT_EQ(Held(0).chunks.size(), 1u);
  ASSERT_EQ(Held(0).releases.size(), 1u) << "the plan with rows does not carry the release";
  EXPECT_EQ(Held(0).releases[0].request_id, done);
  Answer(11);
  while (!executor_->held.empty()) Answer(12);
  EXPECT_EQ(FinishedWithoutError(), 2);
  EXPECT_EQ(UsedSlots(), 0);
}

// A node declared dead hands the releases it had queued, unsent (waiting out the backoff),
// to a live node; it comes back as a new process, with no failed plans behind it, and the
// releases handed to it then go at once, not after the backoff its old self had earned.
TEST_F(PlannerTest, ANodeThatComesBackHasNoReleaseBackoff) {
  configure_ = [](SchedulerConfig& c) { c.release_retry_backoff = absl::Seconds(100); };
  Start(/*async=*/false, 64, Pipelining::kOff, /*replicas=*/2);
  Submit({1, 2, 3}, 1);
  const int first_index = HolderOfTheOnlyPlan(replicas_);
  HeldExecutor& first = *replicas_[first_index];
  HeldExecutor& second = *replicas_[1 - first_index];
  AnswerOn(first, 10);  // done: its release goes in a plan of its own
  ASSERT_EQ(first.held.size(), 1u);
  const SequenceId done = first.held.front().first->releases.at(0).request_id;
  AnswerOn(first, 0, absl::UnavailableError("the node failed the plan"));
  ASSERT_TRUE(first.held.empty()) << "the release waits out the backoff";
  // The first node dies (the second carries the release) and comes back.
  scheduler_->SetExecutorAlive(first_index, false);
  scheduler_->RunPending();
  ASSERT_EQ(second.held.size(), 1u);
  ASSERT_TRUE(Released(second).contains(done));
  scheduler_->SetExecutorAlive(first_index, true);
  scheduler_->RunPending();
  // Now the second dies with the release in its plan, which fails: the first carries it.
  scheduler_->SetExecutorAlive(1 - first_index, false);
  scheduler_->RunPending();
  AnswerOn(second, 0, absl::UnavailableError("the node died"));
  ASSERT_EQ(first.held.size(), 1u) << "the node that came back waits out its old backoff";
  EXPECT_TRUE(Released(first).contains(done));
}

// A compute node that the data plane loses while a request decodes on it: the request is
// preempted and placed on the other node under a new id. The lost node cannot carry the
// release of the old id, so the other one does (it used to be queued nowhere, and the old
// table stayed on the memory node for good); the lost node sends it too once it is back,
// for the state it kept.
TEST_F(PlannerTest, APreemptedRequestsReleaseOnALostNodeIsCarriedByAnother) {
  Start(/*async=*/false, 64, Pipelining::kOff, /*replicas=*/2);
  Submit({1, 2, 3}, 4);
  const int lost_index = HolderOfTheOnlyPlan(replicas_);
  HeldExecutor& lost = *replicas_[lost_index];
  HeldExecutor& other = *replicas_[1 - lost_index];
  AnswerOn(lost, 10);  // the prefill
  ASSERT_EQ(lost.held.size(), 1u);
  ASSERT_EQ(lost.held.front().first->chunks.size(), 1u);
  const SequenceId old_id = lost.held.front().first->chunks[0].request_id;
  lost.reachable = false;
  AnswerOn(lost, 0, absl::UnavailableError("the connection broke"), /*unreachable=*/true);
  ASSERT_EQ(scheduler_->Stats().num_preemptions_total, 1);
  ASSERT_EQ(other.held.size(), 1u) << "the request moves to the node that is left";
  ASSERT_EQ(other.held.front().first->chunks.size(), 1u);
  EXPECT_NE(other.held.front().first->chunks[0].request_id, old_id) << "placed under a new id";
  EXPECT_TRUE(Released(other).contains(old_id))
      << "the release of the preempted sequence's old table is sent by no node";

  lost.reachable = true;
  Submit({7, 8, 9}, 1);  // the scheduler looks at the lost node again
  EXPECT_TRUE(Released(lost).contains(old_id)) << "the node that is back keeps its state";
  for (int i = 0; i < 50 && !(lost.held.empty() && other.held.empty()); ++i) {
    AnswerOn(lost.held.empty() ? other : lost, 11);
  }
  EXPECT_EQ(FinishedWithoutError(), 2);
  EXPECT_EQ(Streamed().size(), 5u) << "four tokens and one";
  EXPECT_EQ(UsedSlots(), 0);
}

// A request whose compute node dies between two of its plans keeps its sequence id and its
// table on the memory node, for the next node to set up again. If it leaves before any node
// has, its table is still released, by a live node that reaches the pool (no release went,
// and the table stayed for good).
TEST_F(PlannerTest, ARequestThatLeavesBetweenNodesIsReleasedByALiveOne) {
  Start(/*async=*/false, 64, Pipelining::kOff, /*replicas=*/2);
  Submit({1, 2, 3}, 8);
  const int dead_index = HolderOfTheOnlyPlan(replicas_);
  HeldExecutor& dead = *replicas_[dead_index];
  HeldExecutor& live = *replicas_[1 - dead_index];
  auto [plan, sink] = std::move(dead.held.front());
  dead.held.pop_front();
  ASSERT_EQ(plan->chunks.size(), 1u);
  const SequenceId id = plan->chunks[0].request_id;
  // The prefill's result, the node's death and a cancellation, in one batch of events: the
  // request lands with no plan out, loses its node, and leaves before another plans for it.
  StepResult result;
  result.step_id = plan->step_id;
  for (const SampleTarget& t : plan->chunks[0].samples) result.tokens.push_back({t.request_id, 10});
  sink(std::move(result));
  scheduler_->SetExecutorAlive(dead_index, false);
  scheduler_->Cancel(last_id_);
  scheduler_->RunPending();
  ASSERT_EQ(live.held.size(), 1u) << "no plan carries the release";
  EXPECT_TRUE(live.held.front().first->chunks.empty());
  EXPECT_TRUE(Released(live).contains(id));
  AnswerOn(live, 0);
  EXPECT_TRUE(dead.held.empty());
  EXPECT_EQ(UsedSlots(), 0);
}

// A compute node declared dead whose plan still comes back: the request lands, and the
// node that takes it over gets its setup (it used to be taken over as set up already, and
// the new node had no state for it).
TEST_F(PlannerTest, ARequestTakenOverFromADeadNodeIsSetUpAgain) {
  Start(/*async=*/false, 64, Pipelining::kOff, /*replicas=*/2);
  Submit({1, 2, 3}, 4);
  const int dead_index = HolderOfTheOnlyPlan(replicas_);
  HeldExecutor& dead = *replicas_[dead_index];
  HeldExecutor& live = *replicas_[1 - dead_index];
  ASSERT_EQ(dead.held.front().first->setups.size(), 1u);
  const SequenceId id = dead.held.front().first->setups[0].request_id;
  scheduler_->SetExecutorAlive(dead_index, false);
  scheduler_->RunPending();
  AnswerOn(dead, 10);
  ASSERT_EQ(live.held.size(), 1u) << "the request is not taken over";
  const StepPlan& next = *live.held.front().first;
  ASSERT_EQ(next.chunks.size(), 1u);
  EXPECT_EQ(next.chunks[0].request_id, id) << "taken over under its id";
  bool setup = false;
  for (const RequestSetup& r : next.setups) setup = setup || r.request_id == id;
  EXPECT_TRUE(setup) << "the node that takes the request over gets no setup for it";
  while (!live.held.empty()) AnswerOn(live, 11);
  EXPECT_EQ(FinishedWithoutError(), 1);
  EXPECT_EQ(UsedSlots(), 0);
}

// A compute node declared dead with a plan out: the plan fails, and neither the release it
// carried (a request that finished) nor that of the request it preempts is left queued on
// the dead node, which will never send another plan: the live node carries both.
TEST_F(PlannerTest, ReleasesQueuedForADeadNodeAreCarriedByALiveOne) {
  Start(/*async=*/false, 64, Pipelining::kOff, /*replicas=*/2);
  Submit({1, 2, 3}, 1, {}, /*run=*/false);
  Submit({4, 5, 6}, 5);
  const int dead_index = HolderOfTheOnlyPlan(replicas_);
  HeldExecutor& dead = *replicas_[dead_index];
  HeldExecutor& live = *replicas_[1 - dead_index];
  ASSERT_EQ(dead.held.front().first->chunks.size(), 2u) << "both requests in one plan";
  SequenceId finished, preempted;
  for (const SequenceChunk& c : dead.held.front().first->chunks) {
    (c.tokens == std::vector<int32_t>{1, 2, 3} ? finished : preempted) = c.request_id;
  }
  AnswerOn(dead, 10);  // the first request is done after one token
  ASSERT_EQ(dead.held.size(), 1u);
  ASSERT_TRUE(Released(dead).contains(finished));
  scheduler_->SetExecutorAlive(dead_index, false);
  scheduler_->RunPending();
  AnswerOn(dead, 0, absl::UnavailableError("the node died"));
  std::set<SequenceId> released;  // by the live node's plans
  for (int i = 0; i < 50 && !live.held.empty(); ++i) {
    for (SequenceId id : Released(live)) released.insert(id);
    AnswerOn(live, 11);
  }
  EXPECT_TRUE(released.contains(finished)) << "the failed plan's release is left on the dead node";
  EXPECT_TRUE(released.contains(preempted)) << "the preempted request's release is left on it";
  EXPECT_TRUE(dead.held.empty()) << "a dead node gets no plan";
  EXPECT_EQ(UsedSlots(), 0);
}

}  // namespace
}  // namespace strata
