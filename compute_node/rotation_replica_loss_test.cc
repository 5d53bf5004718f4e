// A compute replica lost mid-rotation, on the world of rotation_test_harness.h. One that
// dies or hangs fails the batches in flight with an error that names it, long before the
// hand-off deadline: the others learn it from its connection's end, or (a hung one, whose
// connections stay open) from the scheduler's declaration (ContextExchange::Depart); the
// survivors then run the same sequences again from their tokens, bit-identical to
// pipelining off.
#include <atomic>
#include <map>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "common/base/logging.h"
#include "compute_node/rotation_test_harness.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using namespace rotation_testing;  // NOLINT: the harness's replicas, memory nodes and plans

using RotationReplicaLossTest = RotationFixture;

// How replica 2 of three is lost mid-rotation.
enum class Loss {
  kDies,   // its process ends: its connections close
  kHangs,  // it stops (SIGSTOP): its connections stay open, and the scheduler declares it
           // dead (its heartbeats lapse) and tells the others (ContextExchange::Depart)
};

// Replica 2 is lost at batch 2's second step, with plans of other batches in flight. Every
// batch stops with an error naming it, and no survivor waits for its hand-off deadline (two
// minutes here): a lane that needs the lost replica's context learns that it will not come
// (its connection closed, or the declaration); a dead one cannot be handed a context. Then
// the two survivors run every sequence again, to the tokens of pipelining off.
void LoseAReplica(ModelWeights* weights, const std::map<uint64_t, std::vector<int32_t>>& expected,
                  Loss loss) {
  const int batches = 4;
  ModelRunner runner(weights, kMaxPositions);
  MemoryPools pools(runner.config());
  std::vector<std::unique_ptr<Replica>> replicas =
      MakeReplicas(runner, pools, batches, absl::Seconds(60));
  const int layers = static_cast<int>(runner.config().num_layers);
  std::atomic<uint64_t> ids{1};
  auto b = MakeBatches(batches, 11);
  const std::string lost_address = replicas[2]->exchange->address();
  std::atomic<int> plans{0};
  std::atomic<bool> lost{false};
  absl::Mutex lose_mu;
  std::thread declare;  // the control plane, once the hung replica's heartbeats lapse
  std::vector<absl::Status> errors, replica_errors;
  const absl::Time start = absl::Now();
  Drive(
      b,
      [&](int batch, StepPlan plan) {
        const std::vector<Replica*> three = Pointers(replicas);
        if (batch == 2 && ++plans == 2) {
          // Batch 2's steps start on replica 2 (slice 0 runs on replica batch mod 3): it is
          // lost once its second step has reached the others, so that they wait for a
          // context it never hands over.
          return Broadcast(three, batch, plan, layers, &replica_errors, [&] {
            absl::MutexLock lock(&lose_mu);
            if (loss == Loss::kDies) {
              replicas[2]->Kill();
            } else {
              replicas[2]->Hang();
            }
            lost = true;
            if (loss == Loss::kHangs) {
              // Every step sent to it so far has an id below `ids`: plans built from now on
              // do not go to it (`lost`).
              const uint64_t through = ids.load() - 1;
              declare = std::thread([&, through] {
                absl::SleepFor(absl::Milliseconds(300));
                for (int r = 0; r < 2; ++r) replicas[r]->exchange->Depart(lost_address, through);
              });
            }
          });
        }
        if (lost) {
          // What the group sees: the lost replica's stream is gone, or it was removed.
          StepResult r;
          r.step_id = plan.step_id;
          r.status = absl::UnavailableError("compute replica lost");
          return r;
        }
        return Broadcast(three, batch, plan, layers, &replica_errors);
      },
      true, ids, &errors);
  if (declare.joinable()) declare.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "a batch hung";
  int failed = 0, named = 0;
  for (const absl::Status& e : errors) {
    failed += !e.ok();
    named += absl::StrContains(e.message(), lost_address) ||
             absl::StrContains(e.message(), "going away");
  }
  EXPECT_EQ(failed, batches) << "every batch was stopped by the lost replica";
  EXPECT_GT(named, 0) << "no error says which replica failed";
  // The survivors' lanes that needed the lost replica failed naming it: one waiting for its
  // context finds it gone, one handing a context to a dead one cannot reach it; none waited
  // for its deadline.
  int named_by_survivors = 0;
  for (const absl::Status& e : replica_errors) {
    LOG(INFO) << "replica error: " << e;
    EXPECT_FALSE(absl::StrContains(e.message(), "did not hand over")) << e;
    named_by_survivors += absl::StrContains(e.message(), lost_address) && absl::IsUnavailable(e) &&
                          (absl::StrContains(e.message(), "is gone") ||
                           (loss == Loss::kDies && absl::StrContains(e.message(), "cannot reach")));
  }
  EXPECT_GT(named_by_survivors, 0) << "no survivor said which replica it lost";
  // The two survivors: every sequence again from the prompt (its history so far is what the
  // scheduler would resend; recomputing from the prompt gives the same tokens).
  std::vector<Replica*> two = {replicas[0].get(), replicas[1].get()};
  auto again = MakeBatches(batches, 11);
  std::vector<absl::Status> errors2;
  const auto got = Drive(
      again, [&](int batch, StepPlan plan) { return Broadcast(two, batch, plan, layers); }, true,
      ids, &errors2);
  for (const absl::Status& e : errors2) ASSERT_TRUE(e.ok()) << e;
  for (const auto& [id, tokens] : expected) EXPECT_EQ(got.at(id), tokens) << "sequence " << id;
  replicas[0]->Stop();
  replicas[1]->Stop();
}

// A replica dies while every batch is mid-rotation: the batches in flight fail at once
// with an error naming it, none hangs, and the two survivors then run every sequence again
// from its tokens (setups with the history), bit-identical to pipelining off. A survivor
// that waits for the dead one's context learns that it is gone from its connection's end,
// not from its hand-off deadline: the deadlines here are a minute, far past the test's
// bound.
TEST_F(RotationReplicaLossTest, DeadReplicaFailsItsBatchesAndTheSurvivorsGoOn) {
  LoseAReplica(weights_, Reference(4, /*greedy=*/true), Loss::kDies);
}

// A replica that hangs keeps its connections to the others open: they learn that its
// contexts will not come from the scheduler's declaration (ComputeConfig's departed
// replicas), not at their hand-off deadline.
TEST_F(RotationReplicaLossTest, HungReplicaIsGivenUpWhenTheSchedulerDeclaresItDead) {
  LoseAReplica(weights_, Reference(4, /*greedy=*/true), Loss::kHangs);
}

// A replica that hangs right after it handed its context over, with its layer frames still
// queued on it (UCX had not sent them when the process stopped): the next replica has the
// context but not the answers those frames asked the memory nodes for. Once the scheduler
// declares the hung replica dead, that lane gives up at once, not at the layer deadline (a
// minute here).
TEST_F(RotationReplicaLossTest, AContextFromAReplicaDeclaredDeadIsNotWaitedOnForItsAnswers) {
  const int batches = 4;
  ModelRunner runner(weights_, kMaxPositions);
  MemoryPools pools(runner.config());
  std::vector<std::unique_ptr<Replica>> replicas =
      MakeReplicas(runner, pools, batches, absl::Seconds(60));
  const int layers = static_cast<int>(runner.config().num_layers);
  auto b = MakeBatches(batches, 11);
  // Batch 2's slice 0 runs on replica 2 (batch mod 3), which hangs before the plan: the test
  // hands its context of slice 1 to replica 0 in its place, and sends no layer frame.
  replicas[2]->Hang();
  const StepPlan plan = MakePlan(1, b[2], /*prefill=*/true, /*greedy=*/true);
  int64_t rows = 0;
  for (const SequenceChunk& c : plan.chunks) rows += static_cast<int64_t>(c.tokens.size());
  const std::vector<float> x(rows * runner.config().hidden_size, 0.5f);
  const std::string hung = replicas[2]->address;
  std::thread declare;
  std::vector<absl::Status> replica_errors;
  const absl::Time start = absl::Now();
  const StepResult r = Broadcast(Pointers(replicas), 2, plan, layers, &replica_errors, [&] {
    ASSERT_TRUE(
        replicas[2]->exchange->Send(replicas[0]->address, plan.step_id, 1, 2, x.data(), rows).ok());
    declare = std::thread([&] {
      absl::SleepFor(absl::Milliseconds(300));  // the context is there
      for (int i = 0; i < 2; ++i) replicas[i]->exchange->Depart(hung, plan.step_id);
    });
  });
  declare.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "a lane waited for the layer deadline";
  EXPECT_FALSE(r.status.ok());
  bool gave_up = false;
  for (const absl::Status& e : replica_errors) {
    LOG(INFO) << "replica error: " << e;
    EXPECT_FALSE(absl::StrContains(e.message(), "no answer for layer")) << e;
    gave_up = gave_up || (absl::StrContains(e.message(), hung) &&
                          absl::StrContains(e.message(), "answers of layer 0"));
  }
  EXPECT_TRUE(gave_up) << "no replica gave up the answers the hung one had asked for";
  replicas[0]->Stop();
  replicas[1]->Stop();
}

}  // namespace
}  // namespace strata
