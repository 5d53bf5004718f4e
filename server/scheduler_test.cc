// Scheduler tests on the real forward pass (a generated tiny model, in-process compute
// node). Outputs are compared between runs that must agree bit for bit: alone vs batched,
// chunked vs whole prefill, with vs without preemption, with vs without prefix reuse.
// Plans in flight and asynchronous scheduling: scheduler_async_test.cc.
#include "server/scheduler.h"

#include <algorithm>

#include "common/grammar/json_schema.h"
#include "server/scheduler_test_harness.h"

namespace strata {
namespace {

using scheduler_testing::GrammarVocab;
using scheduler_testing::Harness;
using scheduler_testing::Outcome;
using scheduler_testing::SchedulerTest;

TEST_F(SchedulerTest, BatchedGreedyOutputsEqualRunningAlone) {
  std::vector<GenerateRequest> requests;
  for (int i = 0; i < 5; ++i) requests.push_back(Greedy(Prompt(10 + 37 * i, i), 12));
  const auto together = Run(Config(), 4096, requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto alone = Run(Config(), 4096, {requests[i]});
    ASSERT_EQ(together[i]->tokens[0].size(), 12u);
    EXPECT_EQ(together[i]->tokens[0], alone[0]->tokens[0]) << "request " << i;
    EXPECT_EQ(together[i]->finish[0], FinishReason::kLength);
  }
}

TEST_F(SchedulerTest, FifoFinishesInArrivalOrder) {
  SchedulerConfig c = Config();
  c.max_num_seqs = 1;  // one sequence at a time: strict FIFO
  Harness h(weights_, c, 4096);
  std::vector<std::shared_ptr<Outcome>> outcomes;
  for (int i = 0; i < 4; ++i) outcomes.push_back(*h.Submit(Greedy(Prompt(20, 10 + i), 6)));
  h.Wait(outcomes);
  EXPECT_EQ(h.finished_order(), h.ids_);
  h.ExpectNoLeak();
}

TEST_F(SchedulerTest, ChunkedPrefillRidesAlongWithDecode) {
  SchedulerConfig c = Config();
  c.prefill_chunk_tokens = 32;
  c.max_num_batched_tokens = 64;
  c.max_prefill_tokens = 64;
  Harness h(weights_, c, 4096);
  std::mutex mu;
  int mixed_steps = 0, long_prefill_chunks = 0;
  h.observer_.on_step = [&](const StepPlan& plan, const StepResult&, absl::Duration) {
    bool decode = false, prefill = false;
    for (const SequenceChunk& chunk : plan.chunks) {
      if (chunk.tokens.size() == 1) decode = true;
      if (chunk.tokens.size() > 1) prefill = true;
      if (chunk.tokens.size() == 32) ++long_prefill_chunks;
    }
    std::lock_guard<std::mutex> lock(mu);
    if (decode && prefill) ++mixed_steps;
  };
  h.scheduler().SetObserver(h.observer_);
  // The short request decodes for longer than the long prompt takes to prefill in 32-token
  // chunks, so the two must share steps.
  auto shortr = *h.Submit(Greedy(Prompt(8, 1), 100));
  auto longr = *h.Submit(Greedy(Prompt(300, 2), 5));
  h.Wait({shortr, longr});
  h.ExpectNoLeak();
  EXPECT_GT(mixed_steps, 0) << "prefill chunks never shared a step with decode rows";
  EXPECT_GE(long_prefill_chunks, 4) << "the long prompt was not chunked";
  // Chunking does not change the output.
  SchedulerConfig whole = Config();
  whole.prefill_chunk_tokens = 0;
  whole.max_num_batched_tokens = 1024;
  whole.max_prefill_tokens = 1024;
  const auto unchunked = Run(whole, 4096, {Greedy(Prompt(300, 2), 5)});
  EXPECT_EQ(longr->tokens[0], unchunked[0]->tokens[0]);
}

TEST_F(SchedulerTest, PreemptionResumesWithIdenticalOutputs) {
  std::vector<GenerateRequest> requests;
  for (int i = 0; i < 4; ++i) {
    GenerateRequest r = Greedy(Prompt(20 + i, 100 + i), 40);
    if (i % 2 == 1) {  // seeded sampling survives preemption too
      r.sampling.temperature = 0.9f;
      r.sampling.top_p = 0.95f;
      r.sampling.seed = 1234 + i;
      r.has_seed = true;
    }
    requests.push_back(r);
  }
  SchedulerStats tight_stats;
  // 130 slots for 4 requests that each grow to ~62 tokens: they cannot all fit.
  const auto tight = Run(Config(), 130, requests, &tight_stats);
  const auto roomy = Run(Config(), 4096, requests);
  EXPECT_GT(tight_stats.num_preemptions_total, 0) << "the test did not force a preemption";
  EXPECT_EQ(tight_stats.planner_shortfalls_total, 0);
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(tight[i]->error.ok()) << tight[i]->error;
    EXPECT_EQ(tight[i]->tokens[0], roomy[i]->tokens[0]) << "request " << i;
  }
}

TEST_F(SchedulerTest, PrefixReuseGivesIdenticalOutputsWithFewerPrefillRows) {
  const std::vector<int32_t> shared = Prompt(64, 7);
  std::vector<int32_t> a = shared, b = shared;
  for (int32_t t : Prompt(10, 8)) a.push_back(t);
  for (int32_t t : Prompt(12, 9)) b.push_back(t);

  Harness h(weights_, Config(), 4096);
  auto first = *h.Submit(Greedy(a, 8));
  h.Wait({first});
  const int64_t rows_before = h.scheduler().Stats().prefill_rows_total;
  auto second = *h.Submit(Greedy(b, 8));
  h.Wait({second});
  const SchedulerStats s = h.scheduler().Stats();
  const int64_t rows_for_b = s.prefill_rows_total - rows_before;
  EXPECT_EQ(second->cached_prompt_tokens, 64);
  EXPECT_EQ(rows_for_b, static_cast<int64_t>(b.size()) - 64);
  EXPECT_GE(s.prefix_hit_tokens_total, 64);
  h.ExpectNoLeak();

  SchedulerConfig no_cache = Config();
  no_cache.enable_prefix_caching = false;
  const auto fresh = Run(no_cache, 4096, {Greedy(b, 8)});
  EXPECT_EQ(second->tokens[0], fresh[0]->tokens[0]);
}

TEST_F(SchedulerTest, OverloadIsRefusedAndTheRestCompletes) {
  SchedulerConfig c = Config();
  c.max_waiting = 3;
  Harness h(weights_, c, 4096);
  std::vector<std::shared_ptr<Outcome>> accepted;
  int refused = 0;
  for (int i = 0; i < 12; ++i) {
    auto o = h.Submit(Greedy(Prompt(30, 50 + i), 4));
    if (o.ok()) {
      accepted.push_back(*o);
    } else {
      EXPECT_EQ(o.status().code(), absl::StatusCode::kResourceExhausted) << o.status();
      ++refused;
    }
  }
  EXPECT_GT(refused, 0);
  h.Wait(accepted);
  for (const auto& o : accepted) EXPECT_EQ(o->tokens[0].size(), 4u);
  EXPECT_EQ(h.scheduler().Stats().rejected_total, refused);
  // Once the queue drained, requests are accepted again.
  auto later = h.Submit(Greedy(Prompt(5, 99), 2));
  ASSERT_TRUE(later.ok());
  h.Wait({*later});
  h.ExpectNoLeak();
}

TEST_F(SchedulerTest, BadRequestsAreRejectedAtAdmission) {
  Harness h(weights_, Config(), 200);
  EXPECT_EQ(h.Submit(Greedy({}, 4)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(h.Submit(Greedy(Prompt(1000, 1), 100)).status().code(),
            absl::StatusCode::kInvalidArgument)
      << "longer than max_model_len";
  EXPECT_EQ(h.Submit(Greedy(Prompt(150, 1), 100)).status().code(),
            absl::StatusCode::kInvalidArgument)
      << "can never fit in a 200-slot pool";
  EXPECT_EQ(h.Submit(Greedy({5, 999999}, 4)).status().code(), absl::StatusCode::kInvalidArgument);
  GenerateRequest n0 = Greedy(Prompt(5, 1), 4);
  n0.n = 0;
  EXPECT_EQ(h.Submit(n0).status().code(), absl::StatusCode::kInvalidArgument);
  // The queue is not wedged.
  auto ok = h.Submit(Greedy(Prompt(10, 2), 3));
  ASSERT_TRUE(ok.ok());
  h.Wait({*ok});
  h.ExpectNoLeak();
}

TEST_F(SchedulerTest, TimeoutAndCancelEndRequestsAndFreeKv) {
  Harness h(weights_, Config(), 4096);
  GenerateRequest slow = Greedy(Prompt(30, 3), 900);
  slow.timeout = absl::Milliseconds(150);
  auto timed = *h.Submit(slow);
  auto cancelled = *h.Submit(Greedy(Prompt(30, 4), 900));
  absl::SleepFor(absl::Milliseconds(30));
  h.scheduler().Cancel(h.ids_[1]);
  h.Wait({timed, cancelled});
  EXPECT_EQ(timed->finish[0], FinishReason::kTimeout);
  EXPECT_EQ(timed->error.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(cancelled->finish[0], FinishReason::kAbort);
  EXPECT_LT(timed->tokens[0].size(), 900u);
  h.ExpectNoLeak();
}

TEST_F(SchedulerTest, NSamplesShareThePromptAndAreSeededDeterministically) {
  GenerateRequest r = Greedy(Prompt(40, 5), 10);
  r.n = 3;
  r.sampling.temperature = 1.0f;
  r.sampling.seed = 77;
  r.has_seed = true;
  SchedulerStats stats;
  const auto first = Run(Config(), 4096, {r}, &stats);
  const auto second = Run(Config(), 4096, {r});
  EXPECT_EQ(stats.prefill_rows_total, 40) << "the shared prompt was computed more than once";
  ASSERT_EQ(first[0]->tokens.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(first[0]->tokens[i].size(), 10u);
    EXPECT_EQ(first[0]->tokens[i], second[0]->tokens[i]) << "sample " << i;
  }
  EXPECT_NE(first[0]->tokens[0], first[0]->tokens[1]) << "samples should differ";
  // n > 1 also survives preemption exactly.
  std::vector<GenerateRequest> crowd = {r, Greedy(Prompt(30, 6), 30), Greedy(Prompt(30, 7), 30)};
  SchedulerStats tight_stats;
  const auto tight = Run(Config(), 110, crowd, &tight_stats);
  EXPECT_GT(tight_stats.num_preemptions_total, 0);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(tight[0]->tokens[i], first[0]->tokens[i]) << "sample " << i;
}

TEST_F(SchedulerTest, PriorityPolicyAdmitsUrgentRequestsFirst) {
  SchedulerConfig c = Config();
  c.policy = PolicyKind::kPriority;
  c.max_num_seqs = 1;
  Harness h(weights_, c, 4096);
  GenerateRequest low = Greedy(Prompt(20, 1), 6);
  low.priority = 5;
  GenerateRequest urgent = Greedy(Prompt(20, 2), 6);
  urgent.priority = 0;
  auto a = *h.Submit(low);
  auto b = *h.Submit(low);
  auto c2 = *h.Submit(urgent);
  h.Wait({a, b, c2});
  const auto order = h.finished_order();
  const auto pos = [&](uint64_t id) {
    return std::find(order.begin(), order.end(), id) - order.begin();
  };
  EXPECT_LT(pos(h.ids_[2]), pos(h.ids_[1])) << "the urgent request waited behind a low one";
  h.ExpectNoLeak();
}

// Structured output through the scheduler: every output follows its grammar and ends with
// the end token, and the grammar state (a cache on the compute node, rebuilt from tokens)
// gives the same outputs with two plans in flight, asynchronous scheduling (rows that name
// the last sampled token) and preemption in a tight pool.
TEST_F(SchedulerTest, StructuredOutputFollowsItsGrammarThroughAsyncAndPreemption) {
  auto gbnf = grammar::JsonSchemaGrammar(
      R"({"type":"object","properties":{"k":{"enum":["ab","cd"]},)"
      R"("n":{"type":"integer","minimum":0,"maximum":99},"s":{"type":"string","maxLength":5}},)"
      R"("required":["k","n","s"]})");
  ASSERT_TRUE(gbnf.ok()) << gbnf.status();
  auto g = grammar::Grammar::Parse(*gbnf);
  ASSERT_TRUE(g.ok()) << g.status();
  const GrammarVocabulary& vocab = GrammarVocab(weights_->config.vocab_size);
  std::vector<GenerateRequest> requests;
  for (int i = 0; i < 6; ++i) {
    GenerateRequest r = Greedy(Prompt(60 + 10 * i, 70 + i), 90);
    r.ignore_eos = false;
    r.sampling.temperature = 1.0f;
    r.sampling.seed = 100 + i;
    r.has_seed = true;
    r.n = i == 0 ? 2 : 1;
    r.grammar = *gbnf;
    requests.push_back(r);
  }
  SchedulerConfig sync = Config();
  sync.max_num_seqs = 3;
  sync.eos_token_ids = {2};
  SchedulerConfig async = sync;
  async.max_plans_in_flight = 2;
  async.async_scheduling = true;
  SchedulerStats tight_stats;
  const auto reference = Run(sync, 4096, requests);
  const auto with_async = Run(async, 4096, requests);
  SchedulerConfig wide = sync;
  wide.max_num_seqs = 6;
  const auto tight = Run(wide, 245, requests, &tight_stats);
  EXPECT_GT(tight_stats.num_preemptions_total, 0) << "no preemption";
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(reference[i]->error.ok()) << reference[i]->error;
    for (size_t k = 0; k < reference[i]->tokens.size(); ++k) {
      EXPECT_EQ(reference[i]->finish[k], FinishReason::kStop) << "request " << i;
      std::string text;
      for (int32_t t : reference[i]->tokens[k]) text += vocab.vocabulary.token(t);
      EXPECT_TRUE(grammar::State::Start(**g).Advance(**g, text).accepting())
          << "request " << i << " sample " << k << ": " << text;
    }
    EXPECT_EQ(with_async[i]->tokens, reference[i]->tokens) << "request " << i;
    EXPECT_EQ(tight[i]->tokens, reference[i]->tokens) << "request " << i;
  }
}

TEST_F(SchedulerTest, FixedPipeliningGivesEachComputeNodeOneSynchronousPlan) {
  SchedulerConfig c = Config();
  c.pipelining = Pipelining::kFixed;
  EXPECT_TRUE(Scheduler::ValidateConfig(c).ok());
  c.max_plans_in_flight = 2;
  EXPECT_EQ(Scheduler::ValidateConfig(c).code(), absl::StatusCode::kInvalidArgument);
  c.async_scheduling = true;
  EXPECT_EQ(Scheduler::ValidateConfig(c).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata
