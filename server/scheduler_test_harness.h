// The scheduler tests' world: a real forward pass (a generated tiny model) behind an
// in-process compute node (CountingExecutor), or behind a step channel on the data plane,
// a harness that submits requests and collects their outcomes, and the fixture the
// scheduler's tests share (scheduler_test.cc, scheduler_async_test.cc). Test-only.
#ifndef STRATA_SERVER_SCHEDULER_TEST_HARNESS_H_
#define STRATA_SERVER_SCHEDULER_TEST_HARNESS_H_

#include <algorithm>
#include <condition_variable>
#include <limits>
#include <optional>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/grammar/grammar.h"
#include "compute_node/attention_backend.h"
#include "compute_node/model_runner.h"
#include "compute_node/model_weights.h"
#include "compute_node/step_channel.h"
#include "compute_node/step_engine.h"
#include "compute_node/testing/generated_weights.h"
#include "gtest/gtest.h"
#include "server/data_plane_executor.h"
#include "server/scheduler.h"
#include "server/testing/in_process_executor.h"

namespace strata::scheduler_testing {

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
inline const GrammarVocabulary& GrammarVocab(int64_t vocab_size) {
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
  // Config() with asynchronous scheduling: two plans in flight, the next one naming the
  // token the running one samples.
  static SchedulerConfig AsyncConfig() {
    SchedulerConfig c = Config();
    c.async_scheduling = true;
    c.max_plans_in_flight = 2;
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

  static inline ModelWeights* weights_ = nullptr;
};

}  // namespace strata::scheduler_testing

#endif  // STRATA_SERVER_SCHEDULER_TEST_HARNESS_H_
