// Rotational pipelining on real engines, real memory servers and the in-process transport:
// R compute replicas, each with a context exchange, one lane per batch slot and the
// rotation driver on its own thread, run n = R + 1 batches side by side. The sampled tokens
// must be bit-identical to one engine that runs the same plans whole (pipelining off), for
// greedy and seeded sampling, n = 3 and n = 4; plans of another epoch are refused; a memory
// node that fails, refuses or hangs fails only its sequences. (A replica lost mid-rotation:
// rotation_replica_loss_test.cc; the world of both: rotation_test_harness.h.)
#include "compute_node/rotation.h"

#include <atomic>
#include <future>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/base/logging.h"
#include "compute_node/model_runner.h"
#include "compute_node/remote_attention.h"
#include "compute_node/rotation_test_harness.h"
#include "compute_node/testing/generated_weights.h"
#include "gtest/gtest.h"
#include "memory_node/memory_server.h"

namespace strata {
namespace {

using namespace rotation_testing;  // NOLINT: the harness's replicas, memory nodes and plans

class RotationTest : public RotationFixture {
 protected:
  // Defined below, with the tests that use it.
  using FaultyShare = std::function<std::function<void()>(StepPlan& plan, MemoryPools& pools)>;
  static Failures RunWithAFaultyShare(const FaultyShare& fault);
};

TEST_P(RotationTest, BitIdenticalToPipeliningOff) {
  const auto [batches, greedy] = GetParam();
  const auto expected = Reference(batches, greedy);

  ModelRunner runner(weights_, kMaxPositions);
  MemoryPools pools(runner.config());
  std::vector<std::unique_ptr<Replica>> replicas = MakeReplicas(runner, pools, batches);
  const std::vector<Replica*> all = Pointers(replicas);
  std::atomic<uint64_t> ids{1};
  std::vector<absl::Status> errors;
  auto b = MakeBatches(batches, 11);
  const int layers = static_cast<int>(runner.config().num_layers);
  const auto got = Drive(
      b, [&](int batch, StepPlan plan) { return Broadcast(all, batch, plan, layers); }, greedy, ids,
      &errors);
  for (const absl::Status& e : errors) ASSERT_TRUE(e.ok()) << e;
  ASSERT_EQ(got.size(), expected.size());
  for (const auto& [id, tokens] : expected) {
    EXPECT_EQ(got.at(id), tokens) << "sequence " << id;
    EXPECT_EQ(tokens.size(), static_cast<size_t>(kPromptLen + kSteps));
  }
  // Contexts really moved, and answers really came before their plans some of the time or
  // not; nothing was rejected.
  uint64_t moved = 0;
  for (auto& r : replicas) {
    const ContextExchangeStats s = r->exchange->stats();
    moved += s.received;
    EXPECT_EQ(s.rejected, 0u);
    EXPECT_EQ(s.stale, 0u);
  }
  // Each step of each batch hands its context on once per slice boundary (L of them).
  EXPECT_EQ(moved, static_cast<uint64_t>(batches * kSteps * layers));
  for (auto& r : replicas) r->Stop();
}

INSTANTIATE_TEST_SUITE_P(BatchesAndSampling, RotationTest,
                         ::testing::Combine(::testing::Values(3, 4),
                                            ::testing::Values(true, false)),
                         [](const auto& info) {
                           return absl::StrCat("n", std::get<0>(info.param),
                                               std::get<1>(info.param) ? "_greedy" : "_seeded");
                         });

// A plan of another epoch (a scheduler that configured the node before, or after, the one
// whose stream runs) is refused by every replica, as the node's other paths refuse it, and
// touches nothing: the batch's next steps, of the right epoch, still match pipelining off.
// (Rotated plans used to run whatever their epoch: a stale scheduler's release of its
// sequence ids, which the new scheduler reuses, dropped the new one's slot tables.)
TEST_F(RotationTest, APlanOfAnotherEpochIsRefusedAndChangesNothing) {
  const int batches = 3;
  const auto expected = Reference(batches, /*greedy=*/true);
  ModelRunner runner(weights_, kMaxPositions);
  MemoryPools pools(runner.config());
  std::vector<std::unique_ptr<Replica>> replicas = MakeReplicas(runner, pools, batches);
  const std::vector<Replica*> all = Pointers(replicas);
  const int layers = static_cast<int>(runner.config().num_layers);
  std::atomic<uint64_t> ids{1};
  std::vector<absl::Status> errors, foreign_errors;
  auto b = MakeBatches(batches, 11);
  std::vector<std::vector<Sequence>> first = {b[0]};
  int step = 0;
  const auto got = Drive(
      first,
      [&](int batch, StepPlan plan) {
        if (++step == 3) {
          StepPlan foreign = plan;
          foreign.step_id = ids++;
          foreign.epoch = kEpoch + 1;
          for (const SequenceChunk& c : plan.chunks)
            foreign.releases.push_back({c.request_id, c.pool});
          const StepResult refused = Broadcast(all, batch, foreign, layers, &foreign_errors);
          EXPECT_EQ(refused.status.code(), absl::StatusCode::kFailedPrecondition) << refused.status;
          EXPECT_EQ(foreign_errors.size(), all.size()) << "a replica ran the foreign plan";
          for (const absl::Status& e : foreign_errors) {
            EXPECT_TRUE(absl::StrContains(e.message(), "epoch")) << e;
          }
        }
        return Broadcast(all, batch, plan, layers);
      },
      true, ids, &errors);
  for (const absl::Status& e : errors) ASSERT_TRUE(e.ok()) << e;
  EXPECT_GE(step, 3);
  for (const Sequence& s : b[0]) {
    EXPECT_EQ(got.at(s.id.value()), expected.at(s.id.value())) << "sequence " << s.id.value();
  }
  // A new scheduler configures the replicas: its plans name sequence ids the old one used,
  // and find none of the old one's requests cached (a decode needs its own setup first).
  for (Replica* r : all) r->epoch.store(kEpoch + 1);
  StepPlan next = MakePlan(ids++, first[0], /*prefill=*/false, /*greedy=*/true);
  next.epoch = kEpoch + 1;
  const StepResult fresh = Broadcast(all, 0, next, layers);
  EXPECT_EQ(fresh.status.code(), absl::StatusCode::kInvalidArgument) << fresh.status;
  EXPECT_TRUE(absl::StrContains(fresh.status.message(), "before its setup")) << fresh.status;
  for (auto& r : replicas) r->Stop();
}

// A fault in a memory node's share of batch 1's third step, on 4 batches and 3 replicas
// whose deadlines are a minute, far past the bound checked here: no batch may fail whole, no
// replica give up a step, and nobody wait for a deadline. `fault` may change that plan
// (before it goes to the replicas) and returns what to do once it has reached every replica
// but the last (or nothing). Returns the sequences that failed alone, each once; every
// other sequence must run all its steps, bit-identical to pipelining off.
Failures RotationTest::RunWithAFaultyShare(const FaultyShare& fault) {
  const int batches = 4;
  const auto expected = Reference(batches, /*greedy=*/true);
  ModelRunner runner(weights_, kMaxPositions);
  MemoryPools pools(runner.config());
  std::vector<std::unique_ptr<Replica>> replicas =
      MakeReplicas(runner, pools, batches, absl::Seconds(60));
  const std::vector<Replica*> three = Pointers(replicas);
  const int layers = static_cast<int>(runner.config().num_layers);
  std::atomic<uint64_t> ids{1};
  auto b = MakeBatches(batches, 11);
  std::atomic<int> plans{0};
  std::vector<absl::Status> errors, replica_errors;
  Failures failed;
  const absl::Time start = absl::Now();
  const auto got = Drive(
      b,
      [&](int batch, StepPlan plan) {
        std::function<void()> after_submit;
        if (batch == 1 && ++plans == 3) after_submit = fault(plan, pools);
        return Broadcast(three, batch, plan, layers, &replica_errors, after_submit);
      },
      true, ids, &errors, &failed);
  EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "a replica waited for its deadline";
  for (const absl::Status& e : errors) EXPECT_TRUE(e.ok()) << "a batch failed whole: " << e;
  for (const absl::Status& e : replica_errors) ADD_FAILURE() << "a replica gave up a step: " << e;
  std::set<SequenceId> once;
  for (const auto& [id, why] : failed) {
    EXPECT_TRUE(once.insert(id).second) << "sequence " << id.value() << " failed twice";
  }
  for (const auto& [id, tokens] : expected) {
    if (once.count(SequenceId(id))) continue;
    EXPECT_EQ(got.at(id), tokens) << "sequence " << id;
  }
  EXPECT_LT(once.size(), expected.size());
  for (auto& r : replicas) r->Stop();
  return failed;
}

// A memory node dies mid-rotation. Its sequences fail alone: the replica whose slice finds
// it dead zeroes their rows and names its pool in the context it hands on, so that the
// replicas after it expect no answers from it; the batch's other sequences go on in the
// same step, bit-identical to pipelining off, and no step fails whole. (Rotated steps used
// to fail whole, every sequence of the batch then recomputed.)
TEST_F(RotationTest, ADeadMemoryNodeFailsOnlyItsSequencesAndTheRotatedStepGoesOn) {
  absl::Mutex kill_mu;
  const Failures failed = RunWithAFaultyShare([&](StepPlan&, MemoryPools& pools) {
    return [&] {
      absl::MutexLock lock(&kill_mu);
      pools.servers[1].reset();  // its connections close with it
    };
  });
  // Only the dead pool's sequences failed, saying which pool; batch 1's all did.
  std::set<uint64_t> failed_ids;
  for (const auto& [id, why] : failed) {
    failed_ids.insert(id.value());
    EXPECT_EQ(id.value() % kPools, 1u) << "sequence " << id.value() << " of a live pool failed";
    EXPECT_TRUE(absl::IsUnavailable(why)) << why;
    EXPECT_TRUE(absl::StrContains(why.message(), "pool 1")) << why;
  }
  for (uint64_t id = 1 + kSeqsPerBatch; id <= 2 * kSeqsPerBatch; ++id) {
    if (id % kPools == 1) {
      EXPECT_TRUE(failed_ids.count(id)) << "sequence " << id << " of batch 1";
    }
  }
}

// A memory node that refuses its share of a rotated step (a slot outside its store) stays
// up, and answers the layers' frames with its error, to the replica of the first slice that
// waits for it. That replica names the pool in the context it hands on; the replicas after
// it expect nothing of the pool for that step (it is sent nothing more, so without the name
// they would wait for their deadline). Only the sequence whose share was refused fails.
TEST_F(RotationTest, AMemoryNodeThatRefusesItsShareFailsOnlyItsSequences) {
  // Batch 1 holds sequences 4, 5 and 6; 5 is the one on pool 1.
  const SequenceId refused(5);
  ASSERT_EQ(MakeBatches(4, 11)[1][1].id, refused);
  ASSERT_EQ(MakeBatches(4, 11)[1][1].pool, PoolIndex(1));
  const Failures failed = RunWithAFaultyShare([&](StepPlan& plan, MemoryPools&) {
    for (SlotAssignment& a : plan.assignments) {
      if (a.request_id == refused) a.slots = {int32_t{1} << 20};
    }
    return std::function<void()>();
  });
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].first, refused);
  EXPECT_TRUE(absl::StrContains(failed[0].second.message(), "pool 1")) << failed[0].second;
}

// A memory node that hangs (it takes frames and answers none) under rotational pipelining:
// the replica whose slice waits for its answers gives up on them at the layer deadline,
// fails its rows alone and names its pool in the context it hands on. The replicas after
// stop expecting it, and their deadline on that context (HandoffTimeout: twice the layer's)
// outlasts the wait, so the step goes on for the batch's other sequences. Only the sequence
// placed there fails; every other one matches pipelining off.
TEST_F(RotationTest, AHungMemoryNodeFailsOnlyItsSequencesAtTheLayerDeadline) {
  const int batches = 3;
  const auto expected = Reference(batches, /*greedy=*/true);
  ModelRunner runner(weights_, kMaxPositions);
  MemoryPools pools(runner.config());
  // A third pool, whose node takes the frames and answers none.
  auto hung = transport::Transport::Create({transport::Backend::kInproc});
  ASSERT_TRUE(hung.ok()) << hung.status();
  auto hung_address = (*hung)->Listen(absl::StrCat("rotation-test-hung-", ++instance));
  ASSERT_TRUE(hung_address.ok()) << hung_address.status();
  pools.addresses.push_back({PoolIndex(2), "memory-hung", *hung_address});
  std::vector<std::unique_ptr<Replica>> replicas =
      MakeReplicas(runner, pools, batches, absl::Milliseconds(300));
  const std::vector<Replica*> all = Pointers(replicas);
  const int layers = static_cast<int>(runner.config().num_layers);
  std::atomic<uint64_t> ids{1};
  auto b = MakeBatches(batches, 11);
  const SequenceId placed_there = b[1][1].id;
  b[1][1].pool = PoolIndex(2);
  std::vector<absl::Status> errors, replica_errors;
  Failures failed;
  const auto got = Drive(
      b,
      [&](int batch, StepPlan plan) {
        return Broadcast(all, batch, plan, layers, &replica_errors);
      },
      true, ids, &errors, &failed);
  for (const absl::Status& e : errors) EXPECT_TRUE(e.ok()) << "a batch failed whole: " << e;
  for (const absl::Status& e : replica_errors) ADD_FAILURE() << "a replica gave up a step: " << e;
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].first, placed_there);
  EXPECT_TRUE(absl::StrContains(failed[0].second.message(), "pool 2")) << failed[0].second;
  for (const auto& [id, tokens] : expected) {
    if (id == placed_there.value()) continue;
    EXPECT_EQ(got.at(id), tokens) << "sequence " << id;
  }
  for (auto& r : replicas) r->Stop();
}

}  // namespace
}  // namespace strata
