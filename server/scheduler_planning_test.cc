// The planner without threads (scheduler_planner_fixture.h). What is checked is what the
// planner sends: rows, positions, draws, literal tokens against kLastSampledToken, the
// ledger's slots, and what reaches the client. Releases are scheduler_release_test.cc's.
#include <random>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/scheduler.h"
#include "server/scheduler_planner_fixture.h"

namespace strata {
namespace {

using planner_testing::PlannerTest;

TEST_F(PlannerTest, SynchronousPlansOneStepAtATimeWithLiteralTokens) {
  Start(/*async=*/false);
  Submit({1, 2, 3, 4, 5}, 3);
  ASSERT_EQ(executor_->held.size(), 1u);
  ASSERT_EQ(Held(0).chunks.size(), 1u);
  EXPECT_EQ(Held(0).chunks[0].tokens, (std::vector<int32_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(Held(0).chunks[0].start_position, 0);
  EXPECT_EQ(Held(0).chunks[0].samples.at(0).output_position, 0);
  EXPECT_EQ(UsedSlots(), 5);
  Answer(10);
  ASSERT_EQ(executor_->held.size(), 1u);
  EXPECT_EQ(Held(0).chunks.at(0).tokens, (std::vector<int32_t>{10}));  // the literal token
  EXPECT_EQ(Held(0).chunks[0].start_position, 5);
  EXPECT_EQ(Held(0).chunks[0].samples.at(0).output_position, 1);
  EXPECT_EQ(UsedSlots(), 6);
}

// The scheduler keeps the plan it sent, to apply the result against: the very object the
// executor got, not a copy of it.
TEST_F(PlannerTest, AResultIsAppliedAgainstThePlanTheExecutorGot) {
  Start(/*async=*/true);
  std::vector<const StepPlan*> applied;
  SchedulerObserver observer;
  observer.on_step = [&](const StepPlan& plan, const StepResult&, absl::Duration) {
    applied.push_back(&plan);
  };
  scheduler_->SetObserver(observer);
  Submit({1, 2, 3, 4, 5}, 3);
  std::vector<const StepPlan*> sent;
  for (int step = 0; step < 3; ++step) {
    ASSERT_FALSE(executor_->held.empty());
    sent.push_back(executor_->held.front().first.get());
    Answer(7);
  }
  ASSERT_EQ(applied.size(), 3u);
  EXPECT_EQ(applied, sent);
}

// The next row goes out before the token it decodes is known; the ledger holds the slots of
// both plans; a stop is seen one step late and the token drawn past it is discarded, its
// slot held until the plan that wrote it is back, then released in the next plan.
TEST_F(PlannerTest, AsynchronousPlansAheadAndDiscardsTheTokenPastAStop) {
  Start(/*async=*/true);
  Submit({1, 2, 3, 4, 5}, 8, /*stop_ids=*/{99});
  ASSERT_EQ(executor_->held.size(), 2u) << "the second plan did not go out with the first";
  EXPECT_EQ(Held(0).chunks.at(0).tokens, (std::vector<int32_t>{1, 2, 3, 4, 5}));
  const SequenceChunk& ahead = Held(1).chunks.at(0);
  EXPECT_EQ(ahead.tokens, (std::vector<int32_t>{kLastSampledToken}));
  EXPECT_EQ(ahead.start_position, 5);
  EXPECT_EQ(ahead.samples.at(0).output_position, 1);
  EXPECT_TRUE(Held(1).setups.empty()) << "the node already has the sequence";
  EXPECT_EQ(UsedSlots(), 6) << "the ledger must count the slot the second plan claims";

  Answer(10);  // step 1's token: streamed, and the third plan goes out
  EXPECT_EQ(Streamed(), (std::vector<int32_t>{10}));
  ASSERT_EQ(executor_->held.size(), 2u);
  EXPECT_EQ(Held(1).chunks.at(0).tokens, (std::vector<int32_t>{kLastSampledToken}));
  EXPECT_EQ(Held(1).chunks[0].start_position, 6);
  EXPECT_EQ(Held(1).chunks[0].samples.at(0).output_position, 2);
  EXPECT_EQ(UsedSlots(), 7);

  Answer(99);  // the stop token: the request finishes; plan 3 is still out
  EXPECT_EQ(Streamed(), (std::vector<int32_t>{10, 99}));
  ASSERT_FALSE(updates_.empty());
  EXPECT_TRUE(updates_.back().finished);
  EXPECT_EQ(updates_.back().sequences.at(0).finish, FinishReason::kStop);
  ASSERT_EQ(executor_->held.size(), 1u) << "nothing more may be planned for it";
  EXPECT_EQ(UsedSlots(), 7) << "plan 3 still writes the last slot";

  const size_t before = updates_.size();
  Answer(11);  // drawn past the stop
  EXPECT_EQ(updates_.size(), before) << "an update followed the final one";
  const SchedulerStats stats = scheduler_->Stats();
  EXPECT_EQ(stats.discarded_tokens_total, 1);
  EXPECT_EQ(stats.generation_tokens_total, 2) << "the discarded token was billed";
  EXPECT_EQ(UsedSlots(), 0);
  ASSERT_EQ(executor_->held.size(), 1u) << "the node must be told to drop the sequence";
  EXPECT_TRUE(Held(0).chunks.empty());
  EXPECT_EQ(Held(0).releases.size(), 1u);
}

// the pool's death preempts them, and the failed step does not preempt them again.
TEST_F(PlannerTest, AStepThatFailedForADeadPoolPreemptsItsRequestsOnce) {
  Start(/*async=*/false, 64, Pipelining::kOff, /*replicas=*/2);
  scheduler_->AddPool("other", 64);
  scheduler_->RunPending();
  Submit({1, 2, 3}, 4);
  ASSERT_EQ(executor_->held.size(), 1u);
  ASSERT_EQ(Held(0).chunks.size(), 1u);
  const PoolIndex pool = Held(0).chunks[0].pool;
  auto [plan, sink] = std::move(executor_->held.front());
  executor_->held.pop_front();
  StepResult result;
  result.step_id = plan->step_id;
  result.status = absl::UnavailableError("memory node died");
  result.dead_pools = {pool};
  sink(std::move(result));
  scheduler_->RunPending();
  EXPECT_EQ(scheduler_->Stats().num_preemptions_total, 1);
  ASSERT_EQ(executor_->held.size(), 1u) << "the request runs again";
  EXPECT_NE(Held(0).chunks.at(0).pool, pool) << "on the pool that is alive";
  while (!executor_->held.empty()) Answer(12);
  EXPECT_EQ(Streamed(), (std::vector<int32_t>{12, 12, 12, 12}));
}

TEST_F(PlannerTest, AsynchronousStopsPlanningAheadAtMaxTokens) {
  Start(/*async=*/true);
  Submit({7, 8, 9}, 2);
  ASSERT_EQ(executor_->held.size(), 2u);
  Answer(20);
  EXPECT_EQ(executor_->held.size(), 1u) << "a row was planned past max_tokens";
  Answer(21);
  EXPECT_EQ(Streamed(), (std::vector<int32_t>{20, 21}));
  EXPECT_EQ(updates_.back().sequences.at(0).finish, FinishReason::kLength);
  EXPECT_EQ(scheduler_->Stats().discarded_tokens_total, 0);
  EXPECT_EQ(UsedSlots(), 0);
}

// A failed step takes the plan ahead down with it: the request is recomputed once, from
// literal tokens, and the second failure is not counted against it.
TEST_F(PlannerTest, AFailedStepRecomputesFromLiteralTokens) {
  Start(/*async=*/true);
  Submit({1, 2, 3, 4, 5}, 8);
  Answer(10);  // one token known
  ASSERT_EQ(executor_->held.size(), 2u);
  Answer(0, absl::InternalError("the node failed"));
  EXPECT_EQ(executor_->held.size(), 1u) << "planned again before the plan ahead was back";
  EXPECT_EQ(scheduler_->Stats().num_preemptions_total, 0);
  Answer(0, absl::FailedPreconditionError("no token sampled for position 6"));
  EXPECT_EQ(scheduler_->Stats().num_preemptions_total, 1);
  ASSERT_EQ(executor_->held.size(), 2u);
  const StepPlan& again = Held(0);
  ASSERT_EQ(again.chunks.size(), 1u);
  EXPECT_EQ(again.chunks[0].tokens, (std::vector<int32_t>{1, 2, 3, 4, 5, 10}));
  EXPECT_EQ(again.chunks[0].start_position, 0);
  ASSERT_EQ(again.setups.size(), 1u) << "the sequence is set up again";
  EXPECT_EQ(again.releases.size(), 1u) << "and its old state released first";
  EXPECT_EQ(Held(1).chunks.at(0).tokens, (std::vector<int32_t>{kLastSampledToken}));
  EXPECT_EQ(Held(1).chunks[0].start_position, 6);
  EXPECT_EQ(Held(1).chunks[0].samples.at(0).output_position, 2);
  EXPECT_TRUE(updates_.empty() || !updates_.back().finished) << "the request was failed";
}

// A cancellation or timeout that comes while the request's plans are out is acted on when
// they are back, also when they fail: a failed step must not put the request back in the
// queue, where admission skips it for its pending finish and it would wait for ever.
TEST_F(PlannerTest, ACancelOrTimeoutDuringAFailedStepStillEndsTheRequest) {
  for (const bool timeout : {false, true}) {
    for (const bool async : {false, true}) {
      SCOPED_TRACE(absl::StrCat(timeout ? "timeout" : "cancel", async ? ", async" : ", sync"));
      configure_ = [&](SchedulerConfig& c) {
        c.default_timeout = timeout ? absl::Milliseconds(50) : absl::ZeroDuration();
      };
      replicas_.clear();
      Start(async);
      updates_.clear();
      Submit({1, 2, 3, 4, 5}, 8);
      ASSERT_FALSE(executor_->held.empty());
      if (timeout) {
        absl::SleepFor(absl::Milliseconds(80));
      } else {
        scheduler_->Cancel(last_id_);
      }
      scheduler_->RunPending();
      ASSERT_TRUE(updates_.empty() || !updates_.back().finished) << "ended with its plan out";
      while (!executor_->held.empty()) Answer(0, absl::InternalError("the node failed"));
      ASSERT_FALSE(updates_.empty()) << "the request never ended";
      EXPECT_TRUE(updates_.back().finished);
      EXPECT_EQ(updates_.back().error.code(),
                timeout ? absl::StatusCode::kDeadlineExceeded : absl::StatusCode::kCancelled);
      EXPECT_EQ(scheduler_->Stats().num_waiting, 0);
      EXPECT_EQ(scheduler_->Stats().num_preemptions_total, 0) << "it ends, it is not requeued";
      EXPECT_EQ(UsedSlots(), 0);
      scheduler_->Stop();
      scheduler_.reset();
    }
  }
}

// With asynchronous scheduling, a request whose draw fails alone (a lost grammar state, its
// memory node's attention lost) has a row ahead in the plan already out, which the node
// refuses alone: it has no token to feed (StepEngine, compute_node/step_engine.cc). The
// plan's other rows run: an innocent request in both plans is neither recomputed nor charged
// with a failure, through three such events, and finishes cleanly under its first id.
TEST_F(PlannerTest, AnotherRequestsFailedDrawLeavesTheRestOfThePlanAheadRunning) {
  // A recomputation would start at position 0 with the prompt's first token, which is how
  // the test would see the innocent request take a new id (a cached prefix would start it
  // later).
  configure_ = [](SchedulerConfig& c) { c.enable_prefix_caching = false; };
  Start(/*async=*/true);
  Submit({1, 2, 3, 4, 5}, 24);
  const uint64_t innocent = last_id_;
  ASSERT_FALSE(executor_->held.empty());
  // The innocent request's sequence ids: the first, and any it takes when recomputed (a
  // chunk of its prompt from position 0).
  std::set<SequenceId> b = {Held(0).chunks.at(0).request_id};
  // Answers the oldest plan: every draw succeeds but those of sequences other than b, which
  // fail alone; with `refuse_others`, the node refuses the others' rows ahead alone, as it
  // does where the row before failed.
  auto answer = [&](bool fail_others, bool refuse_others) {
    auto [plan, sink] = std::move(executor_->held.front());
    executor_->held.pop_front();
    for (const SequenceChunk& c : plan->chunks) {
      if (c.start_position == 0 && c.tokens.at(0) == 1) b.insert(c.request_id);
    }
    StepResult result;
    result.step_id = plan->step_id;
    for (const SequenceChunk& c : plan->chunks) {
      if (refuse_others && !b.contains(c.request_id)) {
        result.failed.emplace_back(
            c.request_id, absl::FailedPreconditionError("no token sampled for that position"));
        continue;
      }
      for (const SampleTarget& t : c.samples) {
        if (fail_others && !b.contains(t.request_id)) {
          result.failed.emplace_back(t.request_id, absl::InternalError("grammar state lost"));
        } else {
          result.tokens.push_back({t.request_id, 7});
        }
      }
    }
    sink(std::move(result));
    scheduler_->RunPending();
  };
  for (int event = 0; event < 3; ++event) {
    SCOPED_TRACE(event);
    Submit({9, 8, 7}, 4);
    // Until a plan that holds both has a plan behind it that also holds the other.
    bool failed = false;
    for (int i = 0; i < 20 && !failed; ++i) {
      ASSERT_FALSE(executor_->held.empty());
      bool both =
          Held(0).chunks.size() == 2 && executor_->held.size() == 2 && Held(1).chunks.size() == 2;
      if (!both) {
        answer(false, false);
        continue;
      }
      answer(/*fail_others=*/true, false);    // the other request's draw fails alone
      answer(false, /*refuse_others=*/true);  // its row ahead is refused alone
      failed = true;
    }
    ASSERT_TRUE(failed) << "no two plans in flight held both requests";
  }
  for (int i = 0; i < 200 && !executor_->held.empty(); ++i) answer(false, false);
  ASSERT_FALSE(updates_.empty());
  EXPECT_TRUE(updates_.back().finished);
  EXPECT_TRUE(updates_.back().error.ok()) << updates_.back().error;
  EXPECT_EQ(updates_.back().request_id, innocent);
  EXPECT_EQ(b.size(), 1u) << "the innocent request was recomputed";
}

// the newest): it is preempted and released in the same plan, and the older one decodes.
TEST_F(PlannerTest, AFullPoolPreemptsTheNewestRequest) {
  Start(/*async=*/false, /*slots=*/24);
  Submit({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 10, {}, /*run=*/false);
  Submit({11, 12, 13, 14, 15, 16, 17, 18, 19, 20}, 10);
  ASSERT_EQ(executor_->held.size(), 1u);
  ASSERT_EQ(Held(0).chunks.size(), 2u) << "both prompts fit in the first step";
  const SequenceId older = Held(0).chunks[0].request_id;
  const SequenceId newer = Held(0).chunks[1].request_id;
  EXPECT_EQ(UsedSlots(), 20);
  Answer(30);  // decode rows at positions 10: 22 slots
  EXPECT_EQ(UsedSlots(), 22);
  Answer(31);  // positions 11: 24 slots, the pool is full
  EXPECT_EQ(UsedSlots(), 24);
  EXPECT_EQ(scheduler_->Stats().num_preemptions_total, 0);
  Answer(32);  // positions 12 need two more slots
  EXPECT_EQ(scheduler_->Stats().num_preemptions_total, 1);
  ASSERT_EQ(executor_->held.size(), 1u);
  ASSERT_EQ(Held(0).chunks.size(), 1u);
  EXPECT_EQ(Held(0).chunks[0].request_id, older);
  EXPECT_EQ(Held(0).chunks[0].start_position, 12);
  ASSERT_EQ(Held(0).releases.size(), 1u);
  EXPECT_EQ(Held(0).releases[0].request_id, newer);
  EXPECT_EQ(UsedSlots(), 13) << "the newer request's 12 slots came back";
  EXPECT_EQ(scheduler_->Stats().num_waiting, 1);
  EXPECT_EQ(scheduler_->Stats().planner_shortfalls_total, 0);
}

// between two plans of different sequences, half each, and stays split as they land.
TEST_F(PlannerTest, TwoBatchesSplitEqualDecodeWorkInHalves) {
  Start(/*async=*/false, /*slots=*/256, Pipelining::kTwo);
  for (int i = 0; i < 4; ++i) Submit({1, 2, 3, 4, 5, 6, 7, 8}, 10, {}, /*run=*/false);
  scheduler_->RunPending();
  ASSERT_EQ(executor_->held.size(), 1u);  // all four prompts in one plan; nothing for a second
  EXPECT_EQ(Sequences(0).size(), 4u);
  Answer(10);
  ASSERT_EQ(executor_->held.size(), 2u);
  EXPECT_EQ(Sequences(0).size(), 2u);
  EXPECT_EQ(Sequences(1).size(), 2u);
  for (SequenceId id : Sequences(0)) EXPECT_EQ(Sequences(1).count(id), 0u);  // never shared
  // The older plan lands: its two sequences decode on, beside the other two still out.
  const std::set<SequenceId> first = Sequences(0), second = Sequences(1);
  Answer(11);
  ASSERT_EQ(executor_->held.size(), 2u);
  EXPECT_EQ(Sequences(0), second);
  EXPECT_EQ(Sequences(1), first);
}

// Balance counts the KV positions a row reads as well as rows: a long context weighs as
// much as several short ones, so it decodes alone while the short ones share the other plan.
TEST_F(PlannerTest, TwoBatchesBalanceKvReadAsWellAsRows) {
  Start(/*async=*/false, /*slots=*/256, Pipelining::kTwo);
  std::vector<int32_t> longer(100, 7);
  Submit(longer, 10, {}, /*run=*/false);
  for (int i = 0; i < 3; ++i) Submit({1, 2, 3, 4}, 10, {}, /*run=*/false);
  scheduler_->RunPending();
  // Prefill: the 64-row budget takes the long prompt in chunks. Answer until the four
  // requests decode (one row each) in two plans.
  auto decoding = [&] {
    if (executor_->held.size() != 2) return false;
    size_t rows = 0;
    for (size_t p = 0; p < 2; ++p) {
      for (const SequenceChunk& c : Held(p).chunks) {
        if (c.tokens.size() != 1) return false;
        ++rows;
      }
    }
    return rows == 4;
  };
  for (int i = 0; i < 10 && !decoding(); ++i) Answer(10);
  ASSERT_TRUE(decoding());
  Answer(10);  // and once more: the balance holds as plans land
  ASSERT_TRUE(decoding());
  ASSERT_EQ(executor_->held.size(), 2u);
  std::vector<size_t> sizes = {Held(0).chunks.size(), Held(1).chunks.size()};
  std::sort(sizes.begin(), sizes.end());
  EXPECT_EQ(sizes, (std::vector<size_t>{1, 3}));
  for (size_t p = 0; p < 2; ++p) {
    if (Held(p).chunks.size() == 1) EXPECT_GE(Held(p).chunks[0].start_position, 100);
  }
}

TEST_F(PlannerTest, FixedPipeliningSharesABurstOfRequestsBetweenReplicas) {
  Start(/*async=*/false, /*slots=*/256, Pipelining::kFixed, /*replicas=*/2);
  for (int i = 0; i < 5; ++i) Submit({1, 2, 3, static_cast<int32_t>(10 + i)}, 4, {}, false);
  scheduler_->RunPending();
  // Each replica owns one batch: the burst is split, not all taken by the first to plan.
  ASSERT_EQ(replicas_[0]->held.size(), 1u);
  ASSERT_EQ(replicas_[1]->held.size(), 1u);
  EXPECT_EQ(replicas_[0]->held.front().first->chunks.size(), 3u);
  EXPECT_EQ(replicas_[1]->held.front().first->chunks.size(), 2u);
}

// Scheduler-aware eviction: the look-ahead window holds the next waiting requests whose
// cached blocks fit in the DRAM that the running requests leave (less a block per running
// sequence), not a fixed number of them regardless of DRAM.
TEST_F(PlannerTest, TheLookAheadWindowEndsWhereDramDoes) {
  for (const bool fits_dram : {true, false}) {
    SCOPED_TRACE(fits_dram ? "sized by DRAM" : "a fixed count");
    configure_ = [&](SchedulerConfig& c) {
      c.kv_eviction = KvEviction::kSchedulerAware;
      c.lookahead_fits_dram = fits_dram;
      c.max_num_seqs = 1;  // one request runs, the others wait
      c.prefill_chunk_tokens = 128;
      c.max_num_batched_tokens = c.max_prefill_tokens = 128;
    };
    Start(/*async=*/false, /*slots=*/256);
    // Three conversations whose prompts (3 blocks each) stay cached, idle: 144 slots.
    auto prompt = [](int i, int length) {
      std::vector<int32_t> p;
      for (int k = 0; k < length; ++k) p.push_back(k == 0 ? 10 + i : 100 + (7 * k) % 800);
      return p;
    };
    for (int i = 0; i < 3; ++i) {
      Submit(prompt(i, 48), 1);
      while (!executor_->held.empty()) Answer(7);  // its step, then its release
    }
    // A long request takes 102 of the 112 free slots and keeps running; its prompt's 6
    // blocks are cached (held by it) once its prefill is back.
    Submit(prompt(9, 100), 4);
    Answer(7);
    ASSERT_EQ(executor_->held.size(), 1u);
    // A request continuing the running one's prompt waits first: its 6 blocks in DRAM are
    // the running request's, not the room's, and cost the window nothing. Then the three
    // conversations' next turns. Room: 10 free + 144 idle - 16 (the running sequence's
    // next block) = 138 slots, for two turns of 48 but not three.
    Submit(prompt(9, 112), 1);
    for (int i = 0; i < 3; ++i) Submit(prompt(i, 64), 1);
    EXPECT_EQ(scheduler_->Stats().num_waiting, 4);
    EXPECT_EQ(scheduler_->Stats().lookahead_window_requests, fits_dram ? 3 : 4);
    while (!executor_->held.empty()) Answer(7);
    EXPECT_EQ(scheduler_->Stats().num_waiting, 0);
    scheduler_->Stop();
    scheduler_.reset();
    replicas_.clear();
    updates_.clear();
  }
}

// A reserve for the look-ahead window (kv_prefetch_reserve): a request is admitted beside
// a running one only if the room it leaves holds the reserve; alone, it always is.
TEST_F(PlannerTest, APrefetchReserveKeepsRoomBesideTheRunningBatch) {
  for (const double reserve : {0.25, 0.0}) {
    SCOPED_TRACE(reserve > 0 ? "with a reserve" : "without");
    configure_ = [&](SchedulerConfig& c) {
      c.kv_eviction = KvEviction::kSchedulerAware;
      c.kv_prefetch_reserve = reserve;  // 64 of 256 slots
    };
    Start(/*async=*/false, /*slots=*/256);
    auto prompt = [](int i) {
      std::vector<int32_t> p;
      for (int k = 0; k < 100; ++k) p.push_back(k == 0 ? 10 + i : 100 + (7 * k + i) % 800);
      return p;
    };
    Submit(prompt(0), 4);  // alone: admitted, 100 slots
    EXPECT_EQ(scheduler_->Stats().num_waiting, 0);
    Submit(prompt(1), 4);  // would leave 56 slots: waits behind the reserve
    Answer(7);             // the first request's first chunk; the next plan is built
    EXPECT_EQ(scheduler_->Stats().num_waiting, reserve > 0 ? 1 : 0);
    while (!executor_->held.empty()) Answer(7);
    EXPECT_EQ(scheduler_->Stats().num_waiting, 0);
    EXPECT_EQ(Streamed().size(), 8u) << "both requests ran to the end";
    scheduler_->Stop();
    scheduler_.reset();
    replicas_.clear();
    updates_.clear();
  }
}

// Random workloads on a pool too small for all of them: shared prefixes (cached blocks that
// several requests hold), n > 1, stop tokens, prompts that need several chunks. The batch
// planner preempts against what the ledger says a preemption frees; whatever it orders,
// every request must finish, no preemption may free less than the planner counted on, and
// every slot must be back at the end.
TEST_F(PlannerTest, RandomWorkloadsOnATightPoolFinishWithNoShortfall) {
  int64_t preemptions_seen = 0;
  for (int seed = 0; seed < 24; ++seed) {
    std::mt19937 rng(seed);
    auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    const bool async = seed % 2 == 1;
    // Room for any one request (prompt up to 64, 3 x 16 outputs), not for all of them.
    Start(async, /*slots=*/uniform(120, 192));
    std::vector<int32_t> shared;
    for (int i = 0; i < 40; ++i) shared.push_back(uniform(1, 999));
    int finished = 0;
    const int requests = uniform(6, 12);
    for (int r = 0; r < requests; ++r) {
      GenerateRequest req;
      if (uniform(0, 1) == 1) {
        req.prompt_tokens.assign(shared.begin(), shared.begin() + uniform(16, 40));
      }
      for (int i = uniform(1, 24); i > 0; --i) req.prompt_tokens.push_back(uniform(1, 999));
      req.n = uniform(1, 3);
      req.max_tokens = uniform(2, 16);
      req.ignore_eos = true;
      if (uniform(0, 2) == 0) req.stop_token_ids = {uniform(1, 20)};
      req.sampling.temperature = 0.0f;
      const auto id = scheduler_->Submit(req, [&finished](const RequestUpdate& u) {
        EXPECT_TRUE(u.error.ok()) << u.error;
        finished += u.finished ? 1 : 0;
      });
      ASSERT_TRUE(id.ok()) << "seed " << seed << ": " << id.status();
    }
    scheduler_->RunPending();
    for (int steps = 0; !executor_->held.empty(); ++steps) {
      ASSERT_LT(steps, 5000) << "seed " << seed << ": the workload does not finish";
      auto [plan, sink] = std::move(executor_->held.front());
      executor_->held.pop_front();
      StepResult result;
      result.step_id = plan->step_id;
      for (const SequenceChunk& c : plan->chunks) {
        for (const SampleTarget& t : c.samples)
          result.tokens.push_back({t.request_id, uniform(1, 999)});
      }
      sink(std::move(result));
      scheduler_->RunPending();
    }
    const SchedulerStats stats = scheduler_->Stats();
    EXPECT_EQ(finished, requests) << "seed " << seed;
    EXPECT_EQ(stats.planner_shortfalls_total, 0) << "seed " << seed;
    EXPECT_EQ(UsedSlots(), 0) << "seed " << seed;
    preemptions_seen += stats.num_preemptions_total;
    scheduler_->Stop();
    scheduler_.reset();
    replicas_.clear();
  }
  EXPECT_GT(preemptions_seen, 10) << "the pools never ran short";
}

}  // namespace
}  // namespace strata
