// Scheduler tests on the real forward pass (a generated tiny model, in-process compute
// node). Outputs are compared between runs that must agree bit for bit: alone vs batched,
// chunked vs whole prefill, with vs without preemption, with vs without prefix reuse.
#include "server/scheduler.h"

#include <algorithm>
#include <condition_variable>
#include <limits>
#include <optional>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/grammar/grammar.h"
#include "common/grammar/json_schema.h"
#include "compute_node/attention_backend.h"
#include "compute_node/model_runner.h"
#include "compute_node/model_weights.h"
#include "compute_node/step_channel.h"
#include "compute_node/step_engine.h"
#include "compute_node/testing/generated_weights.h"
#include "gtest/gtest.h"
#include "server/data_plane_executor.h"
#include "server/testing/in_process_executor.h"

namespace strata {
namespace {

// The harness's compute node, counting the plans it holds at once (the scheduler may hand it
// up to max_plans_in_flight). With a step delay, every step takes that much longer (the
// node's worker sleeps before it answers, and reports the time in the step's timing), and
// each plan that arrives while another is held records how long that one had been running.
// The delay is outside the node's pipeline, so the slack that reports is replaced by the one
// the test sets (none by default).
class CountingExecutor final : public StepExecutor {
 public:
  explicit CountingExecutor(std::unique_ptr<StepExecutor> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name(); }
  void Submit(std::shared_ptr<const StepPlan> plan, StepResultSink sink) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (outstanding_ > 0) ahead_after_.push_back(absl::Now() - running_since_);
      if (outstanding_ == 0) running_since_ = absl::Now();
      ++outstanding_;
      max_outstanding_ = std::max(max_outstanding_, outstanding_);
    }
    inner_->Submit(std::move(plan), [this, sink = std::move(sink)](StepResult result) {
      const int index = results_++;
      const absl::Duration delay = index >= later_after_ ? later_delay_ : step_delay_;
      if (delay > absl::ZeroDuration()) {
        absl::SleepFor(delay);
        result.timing.total_us += absl::ToInt64Microseconds(delay);
        result.timing.plan_slack_us =
            !slack_only_later_ || index > later_after_ ? slack_us_ : std::nullopt;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        --outstanding_;
        running_since_ = absl::Now();  // the next plan held, if any, starts now
      }
      sink(std::move(result));
    });
  }
  int max_outstanding() {
    std::lock_guard<std::mutex> lock(mu_);
    return max_outstanding_;
  }
  // For each plan submitted while another was held: how long that one had been running.
  std::vector<absl::Duration> ahead_after() {
    std::lock_guard<std::mutex> lock(mu_);
    return ahead_after_;
  }
  void set_step_delay(absl::Duration d) { step_delay_ = d; }
  void set_slack_us(int64_t slack_us) { slack_us_ = slack_us; }  // with a step delay
  // From result `after` on, steps take `delay` instead; only those after the first of them
  // (whose plan went out ahead of a slow step) report the slack.
  void set_later_steps(int after, absl::Duration delay) {
    later_after_ = after;
    later_delay_ = delay;
    slack_only_later_ = true;
  }

 private:
  std::unique_ptr<StepExecutor> inner_;
  absl::Duration step_delay_;        // set before the first plan
  std::optional<int64_t> slack_us_;  // likewise
  int results_ = 0;                  // the node's worker's alone
  int later_after_ = std::numeric_limits<int>::max();
  absl::Duration later_delay_;
  bool slack_only_later_ = false;
  std::mutex mu_;
  int outstanding_ = 0, max_outstanding_ = 0;
  absl::Time running_since_;
  std::vector<absl::Duration> ahead_after_;
};

struct Outcome {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<FinishReason> finish;
  absl::Status error;
  bool done = false;
  int late_updates = 0;  // updates after the final one (there must be none)
  int64_t cached_prompt_tokens = 0;
};

// A vocabulary for grammars on the tokenizer-less test model: token t is one or two
// printable ASCII characters; token 2 is the end token (no text).
const GrammarVocabulary& GrammarVocab(int64_t vocab_size) {
  static const GrammarVocabulary* vocab = [vocab_size] {
    std::vector<std::string> pieces(vocab_size);
    for (int64_t t = 0; t < vocab_size; ++t) {
      if (t == 2) continue;
      pieces[t] = std::string(1, static_cast<char>(32 + t % 95));
      if (t >= 95) pieces[t].push_back(static_cast<char>(32 + (t / 95) % 95));
    }
    return new GrammarVocabulary{grammar::Vocabulary(std::move(pieces)), {2}};
  }();
  return *vocab;
}

// How plans reach the harness's compute node: directly, or through a step channel on the
// data plane (UCX over loopback tcp), as a compute node process takes them.
enum class Carrier { kInProcess, kStepChannel };

class Harness {
 public:
  Harness(const ModelWeights* weights, SchedulerConfig config, int64_t pool_slots,
          Carrier carrier = Carrier::kInProcess)
      : runner_(weights, config.max_model_len) {
    auto attention = LocalAttention::Create(weights->config, pool_slots, /*prefault=*/false);
    EXPECT_TRUE(attention.ok());
    attention_ = std::move(*attention);
    engine_ = std::make_unique<StepEngine>(
        &runner_, attention_.get(),
        StepEngineOptions{config.max_num_batched_tokens, config.max_model_len, nullptr,
                          &GrammarVocab(weights->config.vocab_size)});
    config.vocab_size = static_cast<int32_t>(weights->config.vocab_size);
    scheduler_ = std::make_unique<Scheduler>(config, nullptr);
    scheduler_->AddPool("local", pool_slots);
    std::unique_ptr<StepExecutor> node;
    if (carrier == Carrier::kInProcess) {
      node = std::make_unique<InProcessExecutor>("compute-0", engine_.get());
    } else {
      transport::TransportConfig tcp;
      tcp.ucx_options = {{"TLS", "tcp"}, {"NET_DEVICES", "lo"}};
      tcp.auth_key = "0123456789abcdef0123456789abcdef";
      StepChannelOptions channel;
      channel.transport = tcp;
      channel.run = [engine = engine_.get()](PlanQueue& queue) { RunPipeline(*engine, queue); };
      auto made = StepChannel::Create(std::move(channel));
      EXPECT_TRUE(made.ok()) << made.status();
      channel_ = std::move(*made);
      DataPlaneExecutorOptions o;
      o.name = "compute-0";
      o.address = channel_->address();
      o.transport = tcp;
      auto executor = DataPlaneExecutor::Create(std::move(o));
      EXPECT_TRUE(executor.ok()) << executor.status();
      node = std::move(*executor);
    }
    auto executor = std::make_unique<CountingExecutor>(std::move(node));
    executor_ = executor.get();
    scheduler_->AddExecutor(std::move(executor), PoolIndex(0));
    scheduler_->SetObserver(observer_);
    scheduler_->Start();
  }
  ~Harness() { scheduler_->Stop(); }

  absl::StatusOr<std::shared_ptr<Outcome>> Submit(GenerateRequest req) {
    auto outcome = std::make_shared<Outcome>();
    outcome->tokens.resize(req.n);
    outcome->finish.resize(req.n, FinishReason::kNone);
    auto id = scheduler_->Submit(std::move(req), [this, outcome](const RequestUpdate& u) {
      std::lock_guard<std::mutex> lock(mu_);
      if (outcome->done) ++outcome->late_updates;
      for (const SequenceUpdate& s : u.sequences) {
        auto& t = outcome->tokens[s.index];
        t.insert(t.end(), s.tokens.begin(), s.tokens.end());
        if (s.finish != FinishReason::kNone) outcome->finish[s.index] = s.finish;
      }
      outcome->cached_prompt_tokens = u.cached_prompt_tokens;
      if (u.finished) {
        outcome->done = true;
        outcome->error = u.error;
        finished_order_.push_back(u.request_id);
        cv_.notify_all();
      }
    });
    if (!id.ok()) return id.status();
    ids_.push_back(*id);
    return outcome;
  }

  void Wait(const std::vector<std::shared_ptr<Outcome>>& outcomes) {
    std::unique_lock<std::mutex> lock(mu_);
    ASSERT_TRUE(cv_.wait_for(lock, absl::ToChronoNanoseconds(absl::Seconds(120)), [&] {
      for (const auto& o : outcomes) {
        if (!o->done) return false;
      }
      return true;
    })) << "requests did not finish";
  }

  // All KV is back: nothing used by a request (cached prefix blocks are reclaimable).
  void ExpectNoLeak() {
    for (int i = 0; i < 100; ++i) {
      SchedulerStats s = scheduler_->Stats();
      if (s.num_running == 0 && s.num_waiting == 0 && !s.pools.empty() &&
          s.pools[0].stats.used_slots == 0) {
        return;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    SchedulerStats s = scheduler_->Stats();
    FAIL() << "leak: running " << s.num_running << " waiting " << s.num_waiting << " used "
           << (s.pools.empty() ? -1 : s.pools[0].stats.used_slots);
  }

  Scheduler& scheduler() { return *scheduler_; }
  CountingExecutor& executor() { return *executor_; }
  int max_plans_held() { return executor_->max_outstanding(); }
  std::vector<uint64_t> finished_order() {
    std::lock_guard<std::mutex> lock(mu_);
    return finished_order_;
  }
  std::vector<uint64_t> ids_;
  SchedulerObserver observer_;

 private:
  ModelRunner runner_;
  std::unique_ptr<LocalAttention> attention_;
  std::unique_ptr<StepEngine> engine_;
  CountingExecutor* executor_ = nullptr;  // owned by the scheduler
  std::unique_ptr<StepChannel> channel_;  // Carrier::kStepChannel: outlives the executor
  std::unique_ptr<Scheduler> scheduler_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<uint64_t> finished_order_;
};

class SchedulerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto weights = GenerateAndLoadWeights("tiny-gqa", "scheduler_model");
    ASSERT_TRUE(weights.ok()) << weights.status();
    weights_ = weights->release();
  }
  static void TearDownTestSuite() { delete weights_; }

  static SchedulerConfig Config() {
    SchedulerConfig c;
    c.max_model_len = 1024;
    c.max_num_batched_tokens = 256;
    c.max_prefill_tokens = 256;
    c.prefill_chunk_tokens = 64;
    c.max_num_seqs = 16;
    c.block_tokens = 16;
    return c;
  }

  static std::vector<int32_t> Prompt(int n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> p;
    for (int i = 0; i < n; ++i) p.push_back(3 + rng() % 31000);
    return p;
  }

  static GenerateRequest Greedy(std::vector<int32_t> prompt, int max_tokens) {
    GenerateRequest r;
    r.prompt_tokens = std::move(prompt);
    r.sampling.temperature = 0.0f;
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    return r;
  }

  // Requests that exercise what asynchronous scheduling must keep: greedy and seeded n > 1
  // sampling with penalties, a shared prefix, a stop token (the last two: without and with
  // min_tokens holding it back).
  static std::vector<GenerateRequest> AsyncCases() {
    std::vector<GenerateRequest> requests;
    for (int i = 0; i < 4; ++i) requests.push_back(Greedy(Prompt(20 + 31 * i, 200 + i), 16));
    GenerateRequest seeded = Greedy(Prompt(45, 9), 20);
    seeded.sampling.temperature = 0.9f;
    seeded.sampling.top_p = 0.95f;
    seeded.sampling.frequency_penalty = 0.5f;
    seeded.sampling.presence_penalty = 0.3f;
    seeded.sampling.seed = 99;
    seeded.has_seed = true;
    seeded.n = 3;
    requests.push_back(seeded);
    GenerateRequest shared = requests[1];  // request 1's prompt and one more token
    shared.prompt_tokens.push_back(77);
    requests.push_back(shared);
    // A stop token: the sixth token this prompt generates.
    const GenerateRequest probe = Greedy(Prompt(33, 300), 24);
    const auto probed = Run(Config(), 4096, {probe});
    GenerateRequest stopped = probe;
    stopped.stop_token_ids = {probed[0]->tokens[0][5]};
    requests.push_back(stopped);
    GenerateRequest held = stopped;  // the stop token is banned from the first 8 draws
    held.min_tokens = 8;
    requests.push_back(held);
    return requests;
  }

  // Runs requests concurrently on a fresh harness and returns their outcomes.
  static std::vector<std::shared_ptr<Outcome>> Run(SchedulerConfig config, int64_t pool_slots,
                                                   std::vector<GenerateRequest> requests,
                                                   SchedulerStats* stats = nullptr,
                                                   int* max_plans_held = nullptr,
                                                   Carrier carrier = Carrier::kInProcess) {
    Harness h(weights_, config, pool_slots, carrier);
    std::vector<std::shared_ptr<Outcome>> outcomes;
    for (auto& r : requests) {
      auto o = h.Submit(r);
      EXPECT_TRUE(o.ok()) << o.status();
      if (o.ok()) outcomes.push_back(*o);
    }
    h.Wait(outcomes);
    h.ExpectNoLeak();
    if (stats) *stats = h.scheduler().Stats();
    if (max_plans_held) *max_plans_held = h.max_plans_held();
    return outcomes;
  }

  static ModelWeights* weights_;
};

ModelWeights* SchedulerTest::weights_ = nullptr;

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
  SchedulerConfig async = sync;
  async.async_scheduling = true;
  async.max_plans_in_flight = 2;
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
  SchedulerConfig async = Config();
  async.async_scheduling = true;
  async.max_plans_in_flight = 2;
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
  SchedulerConfig async = Config();
  async.async_scheduling = true;
  async.max_plans_in_flight = 2;
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
  SchedulerConfig async = Config();
  async.async_scheduling = true;
  async.max_plans_in_flight = 2;
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
  SchedulerConfig async = Config();
  async.async_scheduling = true;
  async.max_plans_in_flight = 2;
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
  SchedulerConfig async = Config();
  async.async_scheduling = true;
  async.max_plans_in_flight = 2;
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
