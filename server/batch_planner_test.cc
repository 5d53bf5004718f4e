// The batch planner alone: views written by hand, and random views whose plans are checked
// by applying them to a ledger model of their own.
#include "server/batch_planner.h"

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace strata {
namespace {

using Kind = PlannerAction::Kind;

// A sequence that decodes next: `tokens` known, all but the last computed.
PlannerSequence Decoding(int64_t tokens, int64_t table) {
  PlannerSequence s;
  s.tokens = tokens;
  s.computed = tokens - 1;
  s.table = table;
  s.num_outputs = 1;
  return s;
}

// Appends a running request with `seqs` to the view; returns it.
PlannerRequest& Running(PlannerInput* in, const std::vector<PlannerSequence>& seqs, int pool = 0) {
  PlannerRequest& r = in->requests.emplace_back();
  r.pool = pool;
  r.prompt_len = seqs.empty() ? 0 : seqs[0].tokens - 1;
  r.max_tokens = 100;
  r.eligible = true;
  r.owner = 0;
  r.first_seq = static_cast<int>(in->seqs.size());
  r.num_seqs = static_cast<int>(seqs.size());
  in->seqs.insert(in->seqs.end(), seqs.begin(), seqs.end());
  return r;
}

PlannerInput Input(int64_t available) {
  PlannerInput in;
  in.budgets = {64, 64, 64};
  in.chunk_limit = 16;
  in.chunked = true;
  in.pools = {{available, 0}};
  in.freed = [](int) { return PreemptionFrees{}; };
  return in;
}

std::vector<std::pair<int, int>> Chunked(const PlannerOutput& out) {
  std::vector<std::pair<int, int>> rows;
  for (const PlannerAction& a : out.actions) {
    if (a.kind == Kind::kChunk) rows.emplace_back(a.request, a.seq);
  }
  return rows;
}

TEST(BatchPlannerTest, DecodesInRankOrderWhileTheBudgetLasts) {
  PlannerInput in = Input(10);
  in.budgets.seqs = 2;
  for (int r = 0; r < 3; ++r) Running(&in, {Decoding(8, 7)});
  const PlannerOutput out = PlanRunning(in);
  EXPECT_EQ(Chunked(out), (std::vector<std::pair<int, int>>{{0, 0}, {1, 0}}));
  EXPECT_EQ(out.actions[0].begin, 7);
  EXPECT_EQ(out.actions[0].end, 8);
  EXPECT_EQ(out.actions[0].allocate, 1);
  EXPECT_EQ(out.budgets.seqs, 0);
  EXPECT_EQ(out.budgets.rows, 62);
  EXPECT_EQ(out.planned, (std::vector<bool>{true, true, false}));
}

TEST(BatchPlannerTest, AFullPoolPreemptsTheLowestRankedRequestNotInFlight) {
  PlannerInput in = Input(0);
  Running(&in, {Decoding(8, 7)});
  Running(&in, {Decoding(8, 8)});
  Running(&in, {Decoding(8, 8)});
  in.requests[2].in_flight = true;  // its plan has not landed: it cannot give slots up now
  in.requests[2].eligible = false;
  std::vector<int> asked;
  in.freed = [&](int r) {
    asked.push_back(r);
    return PreemptionFrees{8, 0};
  };
  const PlannerOutput out = PlanRunning(in);
  ASSERT_GE(out.actions.size(), 2u);
  EXPECT_EQ(out.actions[0].kind, Kind::kPreempt);
  EXPECT_EQ(out.actions[0].request, 1);
  EXPECT_EQ(asked, std::vector<int>{1});  // the ledger is asked about the victim only
  EXPECT_EQ(Chunked(out), (std::vector<std::pair<int, int>>{{0, 0}}));
  EXPECT_EQ(out.preempted, (std::vector<bool>{false, true, false}));
}

TEST(BatchPlannerTest, ARequestWithNothingBelowItYieldsItsOwnSlots) {
  PlannerInput in = Input(0);
  Running(&in, {Decoding(8, 8)});
  Running(&in, {Decoding(8, 7)});
  in.freed = [](int r) { return PreemptionFrees{r == 1 ? 7 : 100, 0}; };
  const PlannerOutput out = PlanRunning(in);
  // Request 0 decodes into a slot it has; request 1 needs one and ranks last.
  EXPECT_EQ(Chunked(out), (std::vector<std::pair<int, int>>{{0, 0}}));
  ASSERT_EQ(out.actions.size(), 2u);
  EXPECT_EQ(out.actions[1].kind, Kind::kPreempt);
  EXPECT_EQ(out.actions[1].request, 1);
}

TEST(BatchPlannerTest, SavesInFlightThatFreeEnoughMakeARequestWaitInsteadOfPreempting) {
  PlannerInput in = Input(0);
  in.pools[0].saving = 16;
  Running(&in, {Decoding(8, 7)});
  Running(&in, {Decoding(8, 8)});
  in.freed = [](int) { return PreemptionFrees{8, 0}; };
  const PlannerOutput out = PlanRunning(in);
  // Request 1 has its slot; request 0 waits for the saves rather than take request 1's.
  EXPECT_EQ(Chunked(out), (std::vector<std::pair<int, int>>{{1, 0}}));
  EXPECT_EQ(out.preempted, (std::vector<bool>{false, false}));
}

TEST(BatchPlannerTest, AsynchronousRowsAheadStopBeforeTheLastDraw) {
  PlannerInput in = Input(10);
  in.async = true;
  PlannerSequence s = Decoding(8, 8);
  s.in_flight = 1;
  s.in_flight_samples = true;
  s.num_outputs = 3;
  Running(&in, {s});
  Running(&in, {s});
  in.requests[1].max_tokens = 4;  // the draw in flight is its last
  const PlannerOutput out = PlanRunning(in);
  ASSERT_EQ(Chunked(out), (std::vector<std::pair<int, int>>{{0, 0}}));
  EXPECT_TRUE(out.actions[0].ahead);
  EXPECT_EQ(out.actions[0].begin, 8);  // the row of the token the plan in flight samples
  EXPECT_EQ(out.actions[0].allocate, 1);
  in.async = false;
  EXPECT_TRUE(PlanRunning(in).actions.empty());
}

TEST(BatchPlannerTest, PromptsGoInChunksWithinThePrefillBudget) {
  PlannerInput in = Input(1000);
  in.budgets.prefill = 20;
  PlannerSequence prompt;
  prompt.tokens = 40;
  Running(&in, {prompt});
  Running(&in, {prompt});
  const PlannerOutput out = PlanRunning(in);
  ASSERT_EQ(Chunked(out), (std::vector<std::pair<int, int>>{{0, 0}, {1, 0}}));
  EXPECT_EQ(out.actions[0].end, 16);  // chunk_limit
  EXPECT_EQ(out.actions[1].end, 4);   // what is left of the prefill budget
  EXPECT_EQ(out.budgets.prefill, 0);
  // Unchunked, a prompt that does not fit whole waits.
  in.chunked = false;
  in.chunk_limit = 1000;
  EXPECT_TRUE(PlanRunning(in).actions.empty());
}

TEST(BatchPlannerTest, ASampleWithOutputsOfItsOwnSharesTheOwnersPromptFirst) {
  PlannerInput in = Input(100);
  PlannerSequence owner = Decoding(11, 10);  // prompt 10, one output
  owner.in_flight = 1;                       // the owner is busy this step
  PlannerSequence sample;                    // preempted earlier: 3 outputs to recompute
  sample.tokens = 13;
  sample.waiting_for_owner = true;
  Running(&in, {owner, sample}).prompt_len = 10;
  const PlannerOutput out = PlanRunning(in);
  ASSERT_EQ(out.actions.size(), 2u);
  EXPECT_EQ(out.actions[0].kind, Kind::kShare);
  EXPECT_EQ(out.actions[1].kind, Kind::kChunk);
  EXPECT_EQ(out.actions[1].begin, 10);
  EXPECT_EQ(out.actions[1].end, 13);  // through its last token, whose logits it samples
  EXPECT_EQ(out.actions[1].allocate, 3);
}

TEST(BatchPlannerTest, TwoBatchesTakeHalfOfTheDecodeWork) {
  PlannerInput in = Input(100);
  in.balance = true;
  for (int r = 0; r < 4; ++r) Running(&in, {Decoding(8, 8)});
  EXPECT_EQ(Chunked(PlanRunning(in)).size(), 2u);
  // With those two in flight, the next plan takes the other two.
  in.in_flight_rows = 2;
  in.in_flight_kv = 2 * (7 + 1);
  in.requests[0].eligible = in.requests[1].eligible = false;  // theirs went to the other lane
  EXPECT_EQ(Chunked(PlanRunning(in)).size(), 2u);
}

StepBudgets Budgets(int64_t rows, int64_t seqs, int64_t prefill) { return {rows, seqs, prefill}; }

AdmissionLimits Limits(int64_t chunk_limit, bool chunked, int64_t largest_pool = 1000) {
  AdmissionLimits l;
  l.chunk_limit = chunk_limit;
  l.chunked = chunked;
  l.largest_pool = largest_pool;
  return l;
}

TEST(AdmissionTest, AdmitsInChunksUntilABudgetRunsOut) {
  Admission a(Budgets(40, 3, 30), Limits(16, true));
  using V = Admission::Verdict;
  ASSERT_EQ(a.Consider(50, true, false), V::kPlace);
  EXPECT_EQ(a.Admit(0, 50), 16);  // chunk_limit
  ASSERT_EQ(a.Consider(20, true, false), V::kPlace);
  EXPECT_EQ(a.Admit(8, 20), 12);  // a cached prefix of 8: the rest
  ASSERT_EQ(a.Consider(20, true, false), V::kPlace);
  EXPECT_EQ(a.Admit(0, 20), 2);  // what is left of the prefill budget (30 - 16 - 12)
  EXPECT_EQ(a.Consider(5, true, false), V::kStop);
}

TEST(AdmissionTest, SkipsFinishingRequestsAndFailsOnesNoPoolHolds) {
  Admission a(Budgets(64, 8, 64), Limits(16, true, /*largest_pool=*/100));
  using V = Admission::Verdict;
  EXPECT_EQ(a.Consider(10, true, /*finishing=*/true), V::kSkip);
  EXPECT_EQ(a.Consider(0, /*has_owner=*/false, false), V::kSkip);
  EXPECT_EQ(a.Consider(101, true, false), V::kFail);
  EXPECT_EQ(a.Consider(100, true, false), V::kPlace);
  Admission none(Budgets(64, 8, 64), Limits(16, true, /*largest_pool=*/0));
  EXPECT_EQ(none.Consider(1, true, false), V::kStop);  // no live pool at all
}

TEST(AdmissionTest, UnchunkedPromptsRunWholeOrStopAdmission) {
  Admission a(Budgets(64, 8, 64), Limits(1000, false));
  using V = Admission::Verdict;
  ASSERT_EQ(a.Consider(40, true, false), V::kPlace);
  EXPECT_EQ(a.Admit(0, 40), 40);
  EXPECT_EQ(a.Consider(30, true, false), V::kStop);  // 24 rows left: nobody overtakes it
}

TEST(AdmissionTest, FixedPipeliningCapsTheReplicasShare) {
  AdmissionLimits limits = Limits(16, true);
  limits.admit_cap = 1;
  Admission a(Budgets(64, 8, 64), limits);
  ASSERT_EQ(a.Consider(4, true, false), Admission::Verdict::kPlace);
  a.AdmitLoading(/*over_loads=*/false);
  EXPECT_EQ(a.Consider(4, true, false), Admission::Verdict::kStop);
}

TEST(AdmissionTest, ChunksOverLoadsTakeRowsOnlyWhereSlotsAndBudgetsAllow) {
  Admission a(Budgets(20, 2, 20), Limits(16, true));
  EXPECT_EQ(a.PreloadRows(30, 30), 16);
  EXPECT_EQ(a.PreloadRows(30, 10), 0);  // the chunk would run past the slots it has
  a.Take(16);
  EXPECT_EQ(a.PreloadRows(30, 30), 4);
  a.Take(4);
  EXPECT_EQ(a.PreloadRows(30, 30), 0);
  Admission whole(Budgets(20, 2, 20), Limits(1000, false));
  EXPECT_EQ(whole.PreloadRows(30, 30), 0);  // unchunked: all 30 or nothing
  EXPECT_EQ(whole.PreloadRows(12, 30), 12);
  // A loading admission without rows still holds a sequence of the budget.
  whole.AdmitLoading(/*over_loads=*/false);
  whole.AdmitLoading(/*over_loads=*/false);
  EXPECT_EQ(whole.PreloadRows(12, 30), 0);
}

TEST(PlacementTest, TheLongestPrefixGoesFirstThenDramThenFreeSlots) {
  std::vector<PlacementCandidate> pools(5);
  pools[0] = {.dram_blocks = 0, .disk_blocks = 0, .move_blocks = 0, .available = 900};
  pools[1] = {.dram_blocks = 2, .disk_blocks = 3, .move_blocks = 0, .available = 10};
  pools[2] = {.dram_blocks = 4, .disk_blocks = 0, .move_blocks = 0, .available = 10};
  pools[3] = {.dram_blocks = 1, .disk_blocks = 0, .move_blocks = 4, .available = 50};
  pools[4] = {.dram_blocks = 0, .disk_blocks = 0, .move_blocks = 0, .available = 1000};
  // Pools 1 and 3 hold 5 blocks; 3 has all of them in DRAM or moving, 1 only 2. Pool 2
  // holds 4, then the empty pools by free slots.
  // Blocks of 64 tokens: only a pool with the longest prefix is near enough for load.
  EXPECT_EQ(RankPlacements(pools, 64), (std::vector<int>{3, 1, 2, 4, 0}));
  // Ties keep the given order.
  std::vector<PlacementCandidate> same(3, {.dram_blocks = 1, .available = 7});
  EXPECT_EQ(RankPlacements(same, 16), (std::vector<int>{0, 1, 2}));
  EXPECT_TRUE(RankPlacements({}, 16).empty());
}

TEST(PlacementTest, APrefixShorterThanATileDoesNotOutweighLoad) {
  // Blocks of 16 tokens. Pool 0 holds the shared prompt's 3 blocks (48 tokens) and serves
  // 900 slots of running requests; pool 1 holds none and serves 100. 48 tokens are less
  // than a tile: the less used pool goes first.
  std::vector<PlacementCandidate> pools(2);
  pools[0] = {.dram_blocks = 3, .available = 5000, .used = 900};
  pools[1] = {.dram_blocks = 0, .available = 5000, .used = 100};
  EXPECT_EQ(RankPlacements(pools, 16), (std::vector<int>{1, 0}));
  // At 4 blocks (a tile) the prefix wins, however busy its pool.
  pools[0].dram_blocks = 4;
  EXPECT_EQ(RankPlacements(pools, 16), (std::vector<int>{0, 1}));
  // Among pools near the longest prefix, the least used first; then the rest by prefix,
  // whatever their load.
  std::vector<PlacementCandidate> three(4);
  three[0] = {.dram_blocks = 10, .available = 100, .used = 500};
  three[1] = {.dram_blocks = 8, .available = 100, .used = 50};
  three[2] = {.dram_blocks = 2, .available = 100, .used = 0};
  three[3] = {.dram_blocks = 5, .available = 100, .used = 10};
  EXPECT_EQ(RankPlacements(three, 16), (std::vector<int>{1, 0, 3, 2}));
  // Equal loads: the longer prefix first.
  three[0].used = three[1].used = 50;
  EXPECT_EQ(RankPlacements(three, 16), (std::vector<int>{0, 1, 3, 2}));
}

TEST(PlacementTest, TheReserveMakesARequestWaitForItsPrefixOrMoveOn) {
  // 100 slots available, a reserve of 20: 80 fresh slots leave it, 81 do not.
  EXPECT_EQ(PrefetchReserve(100, 80, 20, false, false), ReserveVerdict::kPlace);
  EXPECT_EQ(PrefetchReserve(100, 81, 20, false, false), ReserveVerdict::kNextPool);
  EXPECT_EQ(PrefetchReserve(100, 81, 20, false, true), ReserveVerdict::kWait);
  // Alone in the pool, or with no reserve, it goes ahead whatever it takes.
  EXPECT_EQ(PrefetchReserve(100, 200, 20, true, true), ReserveVerdict::kPlace);
  EXPECT_EQ(PrefetchReserve(100, 200, -1, false, true), ReserveVerdict::kPlace);
  // A reserve of 0 still asks for the slots.
  EXPECT_EQ(PrefetchReserve(100, 101, 0, false, false), ReserveVerdict::kNextPool);
}

// Random views. The plan is applied to a ledger model: preemptions add what the view says
// they free, chunks take their slots, and what the planner promised must hold.
TEST(BatchPlannerTest, RandomViewsGivePlansThatFitTheLedgerAndTheBudgets) {
  std::mt19937 rng(7);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int plans_with_preemption = 0, plans_with_chunks = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    PlannerInput in;
    in.budgets.rows = uniform(1, 48);
    in.budgets.seqs = uniform(1, 12);
    in.budgets.prefill = uniform(1, 48);
    in.chunk_limit = uniform(1, 24);
    in.chunked = uniform(0, 3) > 0;
    in.async = uniform(0, 1) == 1;
    const int num_pools = uniform(1, 2);
    for (int p = 0; p < num_pools; ++p) in.pools.push_back({uniform(0, 24), uniform(0, 8)});
    std::vector<PreemptionFrees> frees;
    const int num_requests = uniform(0, 8);
    for (int r = 0; r < num_requests; ++r) {
      PlannerRequest req;
      req.first_seq = static_cast<int>(in.seqs.size());
      req.pool = uniform(0, num_pools - 1);
      req.prompt_len = uniform(1, 30);
      req.max_tokens = uniform(1, 20);
      req.eligible = uniform(0, 4) > 0;
      req.in_flight = uniform(0, 3) == 0;
      const int n = uniform(1, 3);
      req.num_seqs = n;
      for (int s = 0; s < n; ++s) {
        PlannerSequence seq;
        seq.num_outputs = uniform(0, req.max_tokens - 1);
        seq.tokens = req.prompt_len + seq.num_outputs;
        seq.computed = uniform(0, static_cast<int>(seq.tokens) - 1);
        seq.table = seq.computed + uniform(0, static_cast<int>(seq.tokens - seq.computed));
        seq.finished = uniform(0, 5) == 0;
        seq.waiting_for_owner = s > 0 && uniform(0, 2) == 0;
        if (seq.waiting_for_owner) seq.computed = seq.table = 0;
        seq.in_flight = req.in_flight && uniform(0, 1) == 1 ? 1 : 0;
        seq.in_flight_samples = seq.in_flight > 0 && uniform(0, 1) == 1;
        in.seqs.push_back(seq);
      }
      int64_t held = 0;
      for (int s = n - 1; s >= 0; --s) {
        const PlannerSequence& seq = in.seqs[req.first_seq + s];
        if (!seq.finished) req.owner = s;
        held += seq.table;
      }
      frees.push_back({uniform(0, static_cast<int>(held)), uniform(0, 4)});
      in.requests.push_back(std::move(req));
    }
    in.freed = [&](int r) { return frees[r]; };
    const PlannerOutput out = PlanRunning(in);

    std::vector<int64_t> available, saving;
    for (const PlannerPool& p : in.pools) {
      available.push_back(p.available);
      saving.push_back(p.saving);
    }
    const std::vector<PlannerRequest>& reqs = in.requests;
    std::vector<PlannerSequence> seqs_now = in.seqs;
    std::set<std::pair<int, int>> chunked;
    std::vector<bool> preempted(reqs.size(), false), planned(reqs.size(), false);
    int64_t rows = 0, prefill = 0, seqs = 0;
    for (const PlannerAction& a : out.actions) {
      const PlannerRequest& req = reqs.at(a.request);
      ASSERT_LT(a.seq, req.num_seqs);
      auto seq_of = [&](int s) -> PlannerSequence& { return seqs_now.at(req.first_seq + s); };
      ASSERT_FALSE(preempted[a.request]) << "trial " << trial;
      switch (a.kind) {
        case Kind::kPreempt:
          ASSERT_FALSE(planned[a.request]) << "trial " << trial;
          preempted[a.request] = true;
          ++plans_with_preemption;
          EXPECT_EQ(a.frees, req.in_flight ? 0 : frees[a.request].available);
          if (!req.in_flight) {
            available[req.pool] += frees[a.request].available;
            saving[req.pool] += frees[a.request].saving;
          }
          break;
        case Kind::kShare: {
          PlannerSequence& seq = seq_of(a.seq);
          ASSERT_TRUE(seq.waiting_for_owner);
          ASSERT_GE(seq_of(req.owner).computed, req.prompt_len);
          ASSERT_GT(seq.tokens, req.prompt_len);
          seq.computed = seq.table = req.prompt_len;
          seq.waiting_for_owner = false;
          break;
        }
        case Kind::kChunk: {
          ASSERT_TRUE(req.eligible) << "trial " << trial;
          ASSERT_TRUE(chunked.insert({a.request, a.seq}).second) << "a sequence twice";
          PlannerSequence& seq = seq_of(a.seq);
          ASSERT_FALSE(seq.finished);
          ASSERT_LT(a.begin, a.end);
          if (a.ahead) {
            ASSERT_TRUE(in.async);
            ASSERT_EQ(seq.in_flight, 1);
            ASSERT_TRUE(seq.in_flight_samples);
            ASSERT_EQ(a.begin, seq.tokens);
            ASSERT_EQ(a.end, seq.tokens + 1);
            ASSERT_LT(seq.num_outputs + 1, req.max_tokens);
          } else {
            ASSERT_EQ(seq.in_flight, 0);
            ASSERT_FALSE(seq.waiting_for_owner);
            ASSERT_EQ(a.begin, seq.computed);
            ASSERT_LE(a.end, seq.tokens);
            ASSERT_LE(a.end - a.begin, std::max<int64_t>(1, in.chunk_limit));
            if (a.begin < seq.tokens - 1) prefill += a.end - a.begin;  // not a decode row
          }
          // Exactly the slots the rows need, and never more than the pool has.
          ASSERT_EQ(a.allocate, std::max<int64_t>(0, a.end - seq.table)) << "trial " << trial;
          seq.table += a.allocate;
          available[req.pool] -= a.allocate;
          ASSERT_GE(available[req.pool], 0) << "trial " << trial;
          rows += a.end - a.begin;
          ++seqs;
          planned[a.request] = true;
          break;
        }
      }
    }
    plans_with_chunks += seqs > 0 ? 1 : 0;
    EXPECT_LE(rows, in.budgets.rows) << "trial " << trial;
    EXPECT_LE(seqs, in.budgets.seqs) << "trial " << trial;
    EXPECT_LE(prefill, in.budgets.prefill) << "trial " << trial;
    EXPECT_EQ(out.budgets.seqs, in.budgets.seqs - seqs) << "trial " << trial;
    EXPECT_EQ(out.planned, planned);
    EXPECT_EQ(out.preempted, preempted);
    // A preempted request that this compute node may not run can only have been taken as a
    // victim, so it was not in flight (that it was not planned is checked above).
    for (size_t r = 0; r < reqs.size(); ++r) {
      if (!preempted[r] || reqs[r].eligible) continue;
      EXPECT_FALSE(reqs[r].in_flight) << "trial " << trial;
    }
  }
  // The random views exercise both.
  EXPECT_GT(plans_with_preemption, 100);
  EXPECT_GT(plans_with_chunks, 1000);
}

}  // namespace
}  // namespace strata
