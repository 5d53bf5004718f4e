// The planner's test fixture: the scheduler runs its work on the test's thread
// (StartManual, RunPending), plans go to compute nodes that hold them, and the test answers
// each plan with the tokens it chooses (scheduler_planning_test.cc,
// scheduler_release_test.cc). Test-only.
#ifndef STRATA_SERVER_SCHEDULER_PLANNER_FIXTURE_H_
#define STRATA_SERVER_SCHEDULER_PLANNER_FIXTURE_H_

#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "server/scheduler.h"

namespace strata::planner_testing {

// A compute node that runs nothing: it keeps each plan until the test answers it.
class HeldExecutor final : public StepExecutor {
 public:
  std::string name() const override { return "held"; }
  void Submit(std::shared_ptr<const StepPlan> plan, StepResultSink sink) override {
    held.emplace_back(std::move(plan), std::move(sink));
  }
  bool Reachable() override { return reachable; }
  std::deque<std::pair<std::shared_ptr<const StepPlan>, StepResultSink>> held;
  bool reachable = true;  // false: the data plane has lost it (StepResult::node_unreachable)
};

class PlannerTest : public ::testing::Test {
 protected:
  // `replicas` compute nodes share one pool (disaggregated); executor_ is the first.
  void Start(bool async, int64_t slots = 64, Pipelining pipelining = Pipelining::kOff,
             int replicas = 1) {
    SchedulerConfig c;
    c.max_model_len = 256;
    c.max_num_batched_tokens = 64;
    c.max_prefill_tokens = 64;
    c.prefill_chunk_tokens = 32;
    c.block_tokens = 16;
    c.vocab_size = 1000;
    c.async_scheduling = async;
    // The loop runs by hand here and never fires a timer that is not yet due: plan ahead
    // at once rather than on the step-time timer (Scheduler::AheadPlanDue).
    c.plan_ahead_lead = 1;
    // Likewise a plan of releases alone goes again at once after a failure.
    c.release_retry_backoff = absl::ZeroDuration();
    c.pipelining = pipelining;
    c.max_plans_in_flight = async || pipelining == Pipelining::kTwo ? 2 : 1;
    if (configure_) configure_(c);
    ASSERT_TRUE(Scheduler::ValidateConfig(c).ok());
    scheduler_ = std::make_unique<Scheduler>(c, nullptr);
    scheduler_->StartManual();
    const PoolIndex pool = scheduler_->AddPool(replicas > 1 ? "memory" : "local", slots);
    for (int i = 0; i < replicas; ++i) {
      auto executor = std::make_unique<HeldExecutor>();
      replicas_.push_back(executor.get());
      if (replicas > 1) {
        scheduler_->AddExecutor(std::move(executor), std::nullopt);
      } else {
        scheduler_->AddExecutor(std::move(executor), pool);
      }
    }
    executor_ = replicas_.front();
    scheduler_->RunPending();
  }
  void TearDown() override {
    if (scheduler_) scheduler_->Stop();
  }

  // Queues a request; with `run`, lets the scheduler plan at once.
  void Submit(std::vector<int32_t> prompt, int max_tokens, std::vector<int32_t> stop_ids = {},
              bool run = true) {
    GenerateRequest r;
    r.prompt_tokens = std::move(prompt);
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    r.stop_token_ids = std::move(stop_ids);
    r.sampling.temperature = 0.0f;
    const absl::StatusOr<uint64_t> id =
        scheduler_->Submit(r, [this](const RequestUpdate& u) { updates_.push_back(u); });
    ASSERT_TRUE(id.ok());
    last_id_ = *id;
    if (run) scheduler_->RunPending();
  }

  // Answers the oldest plan: `token` for each sample it asks for (or the failure).
  void Answer(int32_t token, absl::Status status = absl::OkStatus()) {
    AnswerOn(*executor_, token, status);
  }
  // Answers the oldest plan `node` holds; a failure with `unreachable` says the data plane
  // lost the node.
  void AnswerOn(HeldExecutor& node, int32_t token, absl::Status status = absl::OkStatus(),
                bool unreachable = false) {
    ASSERT_FALSE(node.held.empty()) << "no plan to answer";
    auto [plan, sink] = std::move(node.held.front());
    node.held.pop_front();
    StepResult result;
    result.step_id = plan->step_id;
    result.status = status;
    result.node_unreachable = unreachable;
    if (status.ok()) {
      for (const SequenceChunk& c : plan->chunks) {
        for (const SampleTarget& t : c.samples) result.tokens.push_back({t.request_id, token});
      }
    }
    sink(std::move(result));
    scheduler_->RunPending();
  }

  const StepPlan& Held(size_t i) { return *executor_->held.at(i).first; }
  // The sequences a held plan decodes or prefills.
  std::set<SequenceId> Sequences(size_t i) {
    std::set<SequenceId> ids;
    for (const SequenceChunk& c : Held(i).chunks) ids.insert(c.request_id);
    return ids;
  }
  // How many requests have finished, each checked to have finished without an error.
  int FinishedWithoutError() {
    int finished = 0;
    for (const RequestUpdate& u : updates_) {
      if (!u.finished) continue;
      ++finished;
      EXPECT_TRUE(u.error.ok()) << u.error;
    }
    return finished;
  }
  int64_t UsedSlots() { return scheduler_->Stats().pools.at(0).stats.used_slots; }
  std::vector<int32_t> Streamed() {
    std::vector<int32_t> tokens;
    for (const RequestUpdate& u : updates_) {
      for (const SequenceUpdate& s : u.sequences) {
        tokens.insert(tokens.end(), s.tokens.begin(), s.tokens.end());
      }
    }
    return tokens;
  }

  std::function<void(SchedulerConfig&)> configure_;  // Start's last word on the config
  std::unique_ptr<Scheduler> scheduler_;
  HeldExecutor* executor_ = nullptr;
  std::vector<HeldExecutor*> replicas_;
  std::vector<RequestUpdate> updates_;
  uint64_t last_id_ = 0;  // of the request Submit queued last
};

}  // namespace strata::planner_testing

#endif  // STRATA_SERVER_SCHEDULER_PLANNER_FIXTURE_H_
