// The step engine's "last sampled token" input (asynchronous scheduling): a decode row that
// names kLastSampledToken computes exactly what the same row with the literal token does,
// and the engine refuses it wherever it has no token sampled for that position: that
// sequence alone fails, and the plan's other rows run as they would without it.
#include "compute_node/step_engine.h"

#include <random>

#include "compute_node/attention_backend.h"
#include "compute_node/model_runner.h"
#include "compute_node/model_weights.h"
#include "compute_node/testing/generated_weights.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

class StepEngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto weights = GenerateAndLoadWeights("tiny-gqa", "step_engine_model");
    ASSERT_TRUE(weights.ok()) << weights.status();
    weights_ = weights->release();
  }
  static void TearDownTestSuite() { delete weights_; }

  // A compute node of its own: runner, co-located attention, engine.
  struct Node {
    explicit Node(const ModelWeights* weights) : runner(weights, 512) {
      auto a = LocalAttention::Create(weights->config, 4096, /*prefault=*/false);
      EXPECT_TRUE(a.ok());
      attention = std::move(*a);
      engine = std::make_unique<StepEngine>(&runner, attention.get(), StepEngineOptions{256, 512});
    }
    ModelRunner runner;
    std::unique_ptr<LocalAttention> attention;
    std::unique_ptr<StepEngine> engine;
  };

  static std::vector<int32_t> Prompt(int n) {
    std::mt19937 rng(5);
    std::vector<int32_t> p;
    for (int i = 0; i < n; ++i) p.push_back(3 + rng() % 31000);
    return p;
  }

  // Step `step` of sequence 1: the prompt at once (step 0, with its setup), then one row at
  // position `position` holding `token`. Seeded sampling with penalties, so that both the
  // row's logits and the penalty counts must see the same token.
  static StepPlan Plan(uint64_t step, const std::vector<int32_t>& prompt, int32_t position,
                       int32_t token, int64_t output_position, SequenceId id = SequenceId(1)) {
    StepPlan plan;
    plan.step_id = step;
    SequenceChunk chunk;
    chunk.request_id = id;
    chunk.pool = PoolIndex(0);
    SlotAssignment slots;
    slots.request_id = id;
    slots.pool = PoolIndex(0);
    if (step == 0) {
      RequestSetup setup;
      setup.request_id = id;
      setup.sampling.temperature = 0.9f;
      setup.sampling.seed = 77;
      setup.sampling.frequency_penalty = 0.5f;
      setup.prompt_len = static_cast<int32_t>(prompt.size());
      plan.setups.push_back(setup);
      chunk.start_position = 0;
      chunk.tokens = prompt;
      slots.start = 0;
      for (size_t p = 0; p < prompt.size(); ++p) slots.slots.push_back(static_cast<int32_t>(p));
    } else {
      chunk.start_position = position;
      chunk.tokens = {token};
      slots.start = position;
      slots.slots = {position};
    }
    plan.assignments.push_back(slots);
    chunk.samples.push_back({id, 0, output_position, {}});
    plan.chunks.push_back(chunk);
    return plan;
  }

  // `a` with `b`'s setups, chunks and assignments added.
  static StepPlan Merge(StepPlan a, const StepPlan& b) {
    a.setups.insert(a.setups.end(), b.setups.begin(), b.setups.end());
    a.chunks.insert(a.chunks.end(), b.chunks.begin(), b.chunks.end());
    a.assignments.insert(a.assignments.end(), b.assignments.begin(), b.assignments.end());
    return a;
  }

  // The step went through with sequence `id` refused alone: no token for it.
  static void ExpectRefusedAlone(const StepResult& r, SequenceId id) {
    EXPECT_TRUE(r.status.ok()) << r.status;
    ASSERT_EQ(r.failed.size(), 1u);
    EXPECT_EQ(r.failed[0].first, id);
    EXPECT_EQ(r.failed[0].second.code(), absl::StatusCode::kFailedPrecondition)
        << r.failed[0].second;
    for (const SampledToken& t : r.tokens) EXPECT_NE(t.request_id, id);
  }

  static ModelWeights* weights_;
};

ModelWeights* StepEngineTest::weights_ = nullptr;

TEST_F(StepEngineTest, LastSampledTokenComputesWhatTheLiteralTokenDoes) {
  const std::vector<int32_t> prompt = Prompt(21);
  const int32_t n = static_cast<int32_t>(prompt.size());
  Node literal(weights_), deferred(weights_);
  StepResult a = literal.engine->Execute(Plan(0, prompt, 0, 0, 0));
  StepResult b = deferred.engine->Execute(Plan(0, prompt, 0, 0, 0));
  ASSERT_TRUE(a.status.ok()) << a.status;
  ASSERT_TRUE(b.status.ok()) << b.status;
  ASSERT_EQ(a.tokens.size(), 1u);
  ASSERT_EQ(a.tokens[0].token, b.tokens[0].token);
  for (int32_t step = 1; step <= 6; ++step) {
    const int32_t position = n + step - 1;
    a = literal.engine->Execute(Plan(step, prompt, position, a.tokens[0].token, step));
    b = deferred.engine->Execute(Plan(step, prompt, position, kLastSampledToken, step));
    ASSERT_TRUE(a.status.ok()) << a.status;
    ASSERT_TRUE(b.status.ok()) << b.status;
    ASSERT_EQ(a.tokens.size(), 1u);
    ASSERT_EQ(b.tokens.size(), 1u);
    EXPECT_EQ(a.tokens[0].token, b.tokens[0].token) << "step " << step;
    EXPECT_EQ(a.tokens[0].logprob, b.tokens[0].logprob) << "step " << step;
  }
}

TEST_F(StepEngineTest, LastSampledTokenIsRefusedWhereThereIsNone) {
  const std::vector<int32_t> prompt = Prompt(21);
  const int32_t n = static_cast<int32_t>(prompt.size());
  Node node(weights_);
  // Before anything was sampled: no setup at all, then a setup without a sample.
  StepResult r = node.engine->Execute(Plan(0, prompt, 0, 0, 0));
  ASSERT_TRUE(r.status.ok()) << r.status;
  // The token of position n exists; position n + 1's does not yet (a step skipped or lost).
  r = node.engine->Execute(Plan(1, prompt, n + 1, kLastSampledToken, 1));
  ExpectRefusedAlone(r, SequenceId(1));
  // Nor does it stand in a chunk of several rows.
  StepPlan two = Plan(1, prompt, n, kLastSampledToken, 1);
  two.chunks[0].tokens.push_back(5);
  two.assignments[0].slots.push_back(n + 1);
  r = node.engine->Execute(two);
  EXPECT_EQ(r.status.code(), absl::StatusCode::kInvalidArgument) << r.status;
  // The refusals changed nothing: position n's token is still there to use, once.
  r = node.engine->Execute(Plan(1, prompt, n, kLastSampledToken, 1));
  EXPECT_TRUE(r.status.ok()) << r.status;
  r = node.engine->Execute(Plan(2, prompt, n, kLastSampledToken, 1));
  ExpectRefusedAlone(r, SequenceId(1));
  // A released and re-admitted sequence starts with none.
  StepPlan release;
  release.step_id = 3;
  release.releases.push_back({SequenceId(1), PoolIndex(0)});
  ASSERT_TRUE(node.engine->Execute(release).status.ok());
  StepPlan again = Plan(0, prompt, 0, 0, 0);
  again.step_id = 4;
  again.chunks.clear();
  again.assignments.clear();
  ASSERT_TRUE(node.engine->Execute(again).status.ok());
  r = node.engine->Execute(Plan(5, prompt, n + 1, kLastSampledToken, 2));
  ExpectRefusedAlone(r, SequenceId(1));
}

// A plan ahead can hold the row of a sequence whose previous row failed (its memory node
// died) beside rows that are fine. Only that sequence fails: the others sample exactly what
// they sample in a plan without it, and the refused one takes no slots (its token is still
// to come at the position it asked for).
TEST_F(StepEngineTest, ARefusedRowFailsItsSequenceAloneAndTheOthersRun) {
  const std::vector<int32_t> first = Prompt(21), second = Prompt(34);
  const int32_t n1 = static_cast<int32_t>(first.size()), n2 = static_cast<int32_t>(second.size());
  const SequenceId one(1), two(2);
  Node both(weights_), alone(weights_);
  StepPlan start = Merge(Plan(0, first, 0, 0, 0, one), Plan(0, second, 0, 0, 0, two));
  // Sequence 2's slots follow sequence 1's in the pool.
  for (int32_t& slot : start.assignments[1].slots) slot += 64;
  ASSERT_TRUE(both.engine->Execute(start).status.ok());
  ASSERT_TRUE(alone.engine->Execute(start).status.ok());
  StepPlan ahead_one = Plan(1, first, n1, kLastSampledToken, 1, one);
  StepPlan ahead_two = Plan(1, second, n2 + 1, kLastSampledToken, 1, two);  // never sampled
  ahead_two.assignments[0].slots = {64 + n2 + 1};
  StepResult mixed = both.engine->Execute(Merge(ahead_one, ahead_two));
  StepResult reference = alone.engine->Execute(ahead_one);
  ExpectRefusedAlone(mixed, two);
  ASSERT_TRUE(reference.status.ok()) << reference.status;
  ASSERT_EQ(mixed.tokens.size(), 1u);
  ASSERT_EQ(reference.tokens.size(), 1u);
  EXPECT_EQ(mixed.tokens[0].request_id, one);
  EXPECT_EQ(mixed.tokens[0].token, reference.tokens[0].token);
  EXPECT_EQ(mixed.tokens[0].logprob, reference.tokens[0].logprob);
  // Sequence 2's own next row still finds its token.
  StepPlan next_two = Plan(2, second, n2, kLastSampledToken, 1, two);
  next_two.assignments[0].slots = {64 + n2};
  const StepResult later = both.engine->Execute(next_two);
  ASSERT_TRUE(later.status.ok()) << later.status;
  EXPECT_TRUE(later.failed.empty());
  ASSERT_EQ(later.tokens.size(), 1u);
  EXPECT_EQ(later.tokens[0].request_id, two);
}

// A chunk samples for its own sequence or its n > 1 children, never for another set-up
// sequence: that draw would come from the chunk's logits and move the other's last sampled
// token to the chunk's position (it used to be accepted).
TEST_F(StepEngineTest, AChunkSamplesOnlyForItsSequenceAndItsChildren) {
  Node node(weights_);
  const std::vector<int32_t> prompt = Prompt(6);
  StepResult r = node.engine->Execute(Plan(0, prompt, 0, 0, 0));
  ASSERT_TRUE(r.status.ok()) << r.status;
  // Sequence 2: set up alone (not a child of 1), with a chunk of its own.
  StepPlan other = Plan(0, prompt, 0, 0, 0);
  other.step_id = 1;
  for (RequestSetup& s : other.setups) s.request_id = SequenceId(2);
  for (SlotAssignment& a : other.assignments) {
    a.request_id = SequenceId(2);
    for (int32_t& slot : a.slots) slot += 100;
  }
  for (SequenceChunk& c : other.chunks) {
    c.request_id = SequenceId(2);
    for (SampleTarget& t : c.samples) t.request_id = SequenceId(2);
  }
  r = node.engine->Execute(other);
  ASSERT_TRUE(r.status.ok()) << r.status;
  // Sequence 1's next row, sampling for 2: refused.
  const int32_t n = static_cast<int32_t>(prompt.size());
  StepPlan stray = Plan(2, prompt, n, r.tokens.at(0).token, 1);
  stray.chunks.at(0).samples.at(0).request_id = SequenceId(2);
  r = node.engine->Execute(stray);
  EXPECT_EQ(r.status.code(), absl::StatusCode::kInvalidArgument) << r.status;
  // A child of 1 may be sampled from 1's chunk.
  StepPlan fork = Plan(3, prompt, n, r.tokens.empty() ? 5 : r.tokens[0].token, 1);
  RequestSetup child;
  child.request_id = SequenceId(3);
  child.parent_request_id = SequenceId(1);
  child.prompt_len = n;
  fork.setups.push_back(child);
  fork.chunks.at(0).samples.push_back({SequenceId(3), 0, 1, {}});
  r = node.engine->Execute(fork);
  EXPECT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.tokens.size(), 2u);
}

}  // namespace
}  // namespace strata
