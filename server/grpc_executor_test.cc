// GrpcExecutor's step deadline, against a real gRPC server standing in for a compute node's
// RunSteps stream: a node that stops answering has its stream cancelled at the oldest plan's
// deadline and every plan sent on it fails, while a node whose every step is quicker than
// the deadline is never taken for hung, however long its steps run in all (each result
// moves the deadline on).
#include "server/grpc_executor.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/control/cluster_auth.h"
#include "gtest/gtest.h"
#include "proto/control.grpc.pb.h"
#include "server/testing/loopback_grpc.h"
#include "server/testing/step_results.h"

namespace strata {
namespace {

// Answers each plan after `delay`, up to `answers` of them; then reads on without
// answering, until the stream ends.
class Node final : public control::ComputeNode::Service {
 public:
  Node(absl::Duration delay, int answers) : delay_(delay), answers_(answers) {}
  grpc::Status RunSteps(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<control::StepResult, control::StepPlan>* stream) override {
    control::StepPlan plan;
    int answered = 0;
    while (stream->Read(&plan)) {
      ++read_;
      if (answered == answers_) continue;  // hung: the plan is never answered
      absl::SleepFor(delay_);
      control::StepResult result;
      result.set_step_id(plan.step_id());
      if (!stream->Write(result)) break;
      ++answered;
    }
    return context->IsCancelled() ? grpc::Status::CANCELLED : grpc::Status::OK;
  }
  int read() const { return read_.load(); }

 private:
  const absl::Duration delay_;
  const int answers_;
  std::atomic<int> read_{0};  // plans read
};

using Results = testing::StepResults;

std::shared_ptr<const StepPlan> Plan(uint64_t step_id) {
  auto plan = std::make_shared<StepPlan>();
  plan->step_id = step_id;
  return plan;
}

// `node` served on a free loopback port, and an executor of it with `deadline`.
struct Served {
  Served(Node& node, absl::Duration deadline) : auth(ClusterAuth::Insecure()) {
    testing::LoopbackServer served = testing::ServeOnLoopback(node, *auth);
    server = std::move(served.server);
    if (server == nullptr) return;
    executor = std::make_unique<GrpcExecutor>("compute-0", auth->CreateChannel(served.address),
                                              deadline, auth);
  }
  ~Served() {
    executor.reset();
    if (server != nullptr) server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  }
  std::shared_ptr<const ClusterAuth> auth;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<GrpcExecutor> executor;
};

// Plan 1, answered, then plans 2 and 3, which `node` (answering one plan only) has read
// and holds.
void OneAnsweredThenTwoHeld(const Node& node, Served& served, Results& results) {
  served.executor->Submit(Plan(1), results.Sink());
  ASSERT_TRUE(results.WaitFor(1, absl::Seconds(10)));
  served.executor->Submit(Plan(2), results.Sink());
  served.executor->Submit(Plan(3), results.Sink());
  for (const absl::Time until = absl::Now() + absl::Seconds(10);
       node.read() < 3 && absl::Now() < until;) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(node.read(), 3);
}

TEST(GrpcExecutorTest, AStepPastItsDeadlineFailsEveryPlanOnTheStream) {
  Node node(absl::Milliseconds(10), /*answers=*/1);
  Served served(node, /*deadline=*/absl::Milliseconds(300));
  ASSERT_NE(served.executor, nullptr);
  Results results;
  ASSERT_NO_FATAL_FAILURE(OneAnsweredThenTwoHeld(node, served, results));
  // 300 ms, and the cancellation's trip: far less than this.
  ASSERT_TRUE(results.WaitFor(3, absl::Seconds(10))) << "the deadline never fired";
  const std::vector<StepResult> got = results.Take();
  EXPECT_TRUE(got[0].status.ok()) << got[0].status;
  EXPECT_EQ(got[0].step_id, 1u);
  for (int i : {1, 2}) {
    EXPECT_FALSE(got[i].status.ok()) << "step " << got[i].step_id;
    EXPECT_EQ(got[i].step_id, static_cast<uint64_t>(i + 1));
  }
}

// A hung node's plans fail as soon as the control plane declares it dead (Abandon), long
// before their step deadline, with the reason given, the node unreachable.
TEST(GrpcExecutorTest, AnAbandonedNodesPlansFailAtOnceAsUnreachable) {
  Node node(absl::Milliseconds(10), /*answers=*/1);
  Served served(node, /*deadline=*/absl::Seconds(60));
  ASSERT_NE(served.executor, nullptr);
  Results results;
  ASSERT_NO_FATAL_FAILURE(OneAnsweredThenTwoHeld(node, served, results));
  served.executor->Abandon(absl::UnavailableError("compute node compute-0 was declared dead"));
  ASSERT_TRUE(results.WaitFor(3, absl::Seconds(10))) << "the plans waited for their deadline";
  const std::vector<StepResult> got = results.Take();
  EXPECT_TRUE(got[0].status.ok()) << got[0].status;
  for (int i : {1, 2}) {
    EXPECT_TRUE(absl::IsUnavailable(got[i].status)) << got[i].status;
    EXPECT_NE(got[i].status.message().find("declared dead"), std::string::npos) << got[i].status;
    EXPECT_TRUE(got[i].node_unreachable);
  }
}

TEST(GrpcExecutorTest, StepsEachWithinTheDeadlineAreNeverTakenForHung) {
  // Twelve steps of 100 ms each, two in flight at a time: the oldest is answered about
  // 100 ms into its 500 ms every time, though they take over twice the deadline in all.
  constexpr uint64_t kSteps = 12;
  Node node(absl::Milliseconds(100), /*answers=*/1000);
  Served served(node, /*deadline=*/absl::Milliseconds(500));
  ASSERT_NE(served.executor, nullptr);
  Results results;
  served.executor->Submit(Plan(1), results.Sink());
  for (uint64_t step = 2; step <= kSteps; ++step) {
    served.executor->Submit(Plan(step), results.Sink());
    ASSERT_TRUE(results.WaitFor(step - 1, absl::Seconds(10)));
  }
  ASSERT_TRUE(results.WaitFor(kSteps, absl::Seconds(10)));
  for (const StepResult& r : results.Take())
    EXPECT_TRUE(r.status.ok()) << r.step_id << ": " << r.status;
}

}  // namespace
}  // namespace strata
