// Determinism of the co-located forward pass (docs/architecture.md, "Determinism"): the logits of
// a row are bit-identical whatever else is in the batch, however the prompt is chunked, at
// any thread count, and whether a position is reached by prefill or by decode.
#include "compute_node/model_runner.h"

#include <omp.h>

#include <cstring>
#include <random>

#include "common/base/stopwatch.h"
#include "compute_node/attention_backend.h"
#include "compute_node/testing/generated_weights.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

class Fixture : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto weights = GenerateAndLoadWeights("tiny-gqa", "runner_model");
    ASSERT_TRUE(weights.ok()) << weights.status();
    weights_ = weights->release();
  }
  static void TearDownTestSuite() { delete weights_; }

  struct Sequence {
    uint64_t id;
    std::vector<int32_t> tokens;
  };

  // Runs one step: each sequence contributes rows [start, start + count), with slots equal
  // to id * 1000 + position. Returns the logits of every row. `profile`, if given, is
  // attached to the step's buffers.
  std::vector<float> Step(ModelRunner& runner, LocalAttention& attention,
                          const std::vector<std::tuple<Sequence*, int, int>>& parts,
                          OpProfile* profile = nullptr) {
    StepKvPlan plan;
    std::vector<int32_t> tokens;
    for (auto& [seq, start, count] : parts) {
      SlotAssignment a;
      a.request_id = SequenceId(seq->id);
      a.start = start;
      for (int p = start; p < start + count; ++p) {
        a.slots.push_back(static_cast<int32_t>(seq->id * 1000 + p));
        plan.rows.push_back({SequenceId(seq->id), PoolIndex(0), p, -1});
        tokens.push_back(seq->tokens[p]);
      }
      plan.assignments.push_back(a);
    }
    BatchBuffers b(runner.config(), static_cast<int64_t>(tokens.size()));
    b.profile = profile;
    absl::Status s = ForwardLayers(runner, attention, b, plan, tokens.data());
    EXPECT_TRUE(s.ok()) << s;
    std::vector<int32_t> rows(tokens.size());
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int32_t>(i);
    std::vector<float> logits(RowsCapacity(rows.size()) * runner.config().vocab_size);
    runner.Logits(b, rows, logits.data());
    logits.resize(rows.size() * runner.config().vocab_size);
    return logits;
  }

  std::unique_ptr<LocalAttention> NewAttention() {
    auto a = LocalAttention::Create(weights_->config, 8000, false);
    EXPECT_TRUE(a.ok());
    return std::move(*a);
  }

  static Sequence RandomSequence(uint64_t id, int n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int32_t> dist(3, 31999);
    Sequence s{id, {}};
    for (int i = 0; i < n; ++i) s.tokens.push_back(dist(rng));
    return s;
  }

  static ModelWeights* weights_;
};

ModelWeights* Fixture::weights_ = nullptr;

int64_t Vocab(const ModelRunner& r) { return r.config().vocab_size; }

TEST_F(Fixture, PrefillChunkingAndBatchCompositionDoNotChangeBits) {
  ModelRunner runner(weights_, 1000);
  const int64_t vocab = Vocab(runner);
  Sequence a = RandomSequence(1, 150, 1), b = RandomSequence(2, 90, 2), c = RandomSequence(3, 7, 3);

  // Reference: each prompt alone, whole.
  auto attn = NewAttention();
  const std::vector<float> a_alone = Step(runner, *attn, {{&a, 0, 150}});
  const std::vector<float> b_alone = Step(runner, *attn, {{&b, 0, 90}});

  // All three together, a in chunks of 64 (a tile multiple) and 50 (not one).
  for (int chunk : {64, 50}) {
    auto attn2 = NewAttention();
    std::vector<float> a_rows;
    Step(runner, *attn2, {{&c, 0, 7}});
    for (int start = 0; start < 150; start += chunk) {
      const int count = std::min(chunk, 150 - start);
      const int b_count = start < 90 ? std::min(chunk, 90 - start) : 0;
      std::vector<std::tuple<Sequence*, int, int>> parts = {{&a, start, count}};
      if (b_count > 0) parts.push_back({&b, start, b_count});
      const std::vector<float> logits = Step(runner, *attn2, parts);
      a_rows.insert(a_rows.end(), logits.begin(), logits.begin() + count * vocab);
      if (b_count > 0) {
        ASSERT_EQ(std::memcmp(logits.data() + count * vocab, b_alone.data() + start * vocab,
                              b_count * vocab * sizeof(float)),
                  0)
            << "b rows changed, chunk " << chunk << " start " << start;
      }
    }
    ASSERT_EQ(a_rows, a_alone) << "chunk " << chunk;
  }
}

TEST_F(Fixture, DecodeAtPositionEqualsPrefillRow) {
  ModelRunner runner(weights_, 1000);
  const int64_t vocab = Vocab(runner);
  Sequence a = RandomSequence(4, 130, 4);
  auto whole = NewAttention();
  const std::vector<float> prefill = Step(runner, *whole, {{&a, 0, 130}});
  for (int p : {1, 64, 65, 129}) {
    auto attn = NewAttention();
    Step(runner, *attn, {{&a, 0, p}});
    const std::vector<float> decode = Step(runner, *attn, {{&a, p, 1}});
    ASSERT_EQ(std::memcmp(decode.data(), prefill.data() + p * vocab, vocab * sizeof(float)), 0)
        << "position " << p;
  }
}

TEST_F(Fixture, ThreadCountDoesNotChangeBits) {
  ModelRunner runner(weights_, 1000);
  Sequence a = RandomSequence(5, 200, 5), b = RandomSequence(6, 33, 6);
  const int saved = omp_get_max_threads();
  std::vector<float> reference;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    auto attn = NewAttention();
    Step(runner, *attn, {{&a, 0, 199}, {&b, 0, 32}});
    const std::vector<float> decode = Step(runner, *attn, {{&a, 199, 1}, {&b, 32, 1}});
    if (reference.empty()) {
      reference = decode;
    } else {
      ASSERT_EQ(decode, reference) << threads << " threads";
    }
  }
  omp_set_num_threads(saved);
}

// The benchmarks' per-operation profile (step_profile) times every operation of the step
// and changes no bit of it.
TEST_F(Fixture, AProfileTimesEveryOperationAndChangesNoBit) {
  ModelRunner runner(weights_, 1000);
  Sequence a = RandomSequence(7, 40, 7);
  auto plain_attn = NewAttention();
  const std::vector<float> plain = Step(runner, *plain_attn, {{&a, 0, 40}});
  auto profiled_attn = NewAttention();
  OpProfile profile;
  const Stopwatch watch;
  const std::vector<float> profiled = Step(runner, *profiled_attn, {{&a, 0, 40}}, &profile);
  const double step_seconds = watch.ElapsedSeconds();
  ASSERT_EQ(profiled, plain);
  double timed = 0;
  for (int op = 0; op < kForwardOps; ++op) {
    EXPECT_GT(profile.seconds[op], 0.0) << ForwardOpName(static_cast<ForwardOp>(op));
    timed += profile.seconds[op];
  }
  // Each operation is timed once: the parts fit in the step.
  EXPECT_LE(timed, step_seconds);
  // The GEMMs are the linear layers and the LM head.
  int gemms = 0;
  for (int op = 0; op < kForwardOps; ++op) gemms += IsGemm(static_cast<ForwardOp>(op)) ? 1 : 0;
  EXPECT_EQ(gemms, 5);
}

TEST_F(Fixture, BadPlansAreRejectedWithoutSideEffects) {
  ModelRunner runner(weights_, 1000);
  auto attn = NewAttention();
  Sequence a = RandomSequence(7, 10, 7);
  Step(runner, *attn, {{&a, 0, 10}});
  StepKvPlan bad;
  bad.rows.push_back({SequenceId(7), PoolIndex(0), 12, -1});  // beyond the 10 assigned slots
  BatchBuffers b(runner.config(), 1);
  const int32_t token = 5;
  EXPECT_EQ(ForwardLayers(runner, *attn, b, bad, &token).code(),
            absl::StatusCode::kInvalidArgument);
  StepKvPlan out_of_store;
  out_of_store.assignments.push_back({SequenceId(7), PoolIndex(0), 10, {999999}});
  out_of_store.rows.push_back({SequenceId(7), PoolIndex(0), 10, -1});
  EXPECT_EQ(ForwardLayers(runner, *attn, b, out_of_store, &token).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(attn->engine().num_assigned_positions(), 10) << "a rejected plan changed the tables";
  StepKvPlan unknown;
  unknown.rows.push_back({SequenceId(99), PoolIndex(0), 0, -1});
  EXPECT_EQ(ForwardLayers(runner, *attn, b, unknown, &token).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata
