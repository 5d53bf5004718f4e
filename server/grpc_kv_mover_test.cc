// GrpcKvMover against a real gRPC server standing in for a memory node's MoveKv: loads have
// their deadline from Submit, so that a batch that waited it out behind a slow one is
// failed without reaching the node (the node's load gate and the scheduler have given up on
// it by then), while a batch in time is sent with the time it has left.
#include "server/grpc_kv_mover.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "proto/control.grpc.pb.h"
#include "server/disk_ledger.h"
#include "server/testing/loopback_grpc.h"

namespace strata {
namespace {

// Answers every move OK after `delay`, and records when each call came and its deadline.
class SlowNode final : public control::MemoryNode::Service {
 public:
  explicit SlowNode(absl::Duration delay) : delay_(delay) {}
  grpc::Status MoveKv(grpc::ServerContext* context, const control::KvMoves* request,
                      control::KvMoveReport* report) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      deadlines_.push_back(absl::FromChrono(context->deadline()));
    }
    absl::SleepFor(delay_);
    for (int i = 0; i < request->moves_size(); ++i) report->add_status();
    return grpc::Status::OK;
  }
  std::vector<absl::Time> deadlines() {
    std::lock_guard<std::mutex> lock(mu_);
    return deadlines_;
  }

 private:
  const absl::Duration delay_;
  std::mutex mu_;
  std::vector<absl::Time> deadlines_;
};

struct Outcome {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<absl::Status> status;
  bool done = false;
  KvMovesDone Sink() {
    return [this](std::vector<absl::Status> s) {
      std::lock_guard<std::mutex> lock(mu);
      status = std::move(s);
      done = true;
      cv.notify_all();
    };
  }
  bool Wait() {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(20), [&] { return done; });
  }
};

std::vector<KvMove> Loads(uint64_t ticket) {
  KvMove m;
  m.kind = KvMove::Kind::kLoad;
  m.extent = 1;
  m.key = 2;
  m.slots = {0, 1};
  m.ticket = ticket;
  return {m};
}

// `node` served on a free loopback port, and a mover of its moves with these deadlines.
struct MoverOfNode {
  MoverOfNode(control::MemoryNode::Service& node, absl::Duration load_deadline,
              absl::Duration deadline)
      : auth(ClusterAuth::Insecure()) {
    testing::LoopbackServer served = testing::ServeOnLoopback(node, *auth);
    server = std::move(served.server);
    if (server == nullptr) return;
    mover = std::make_unique<GrpcKvMover>(GrpcKvMover::Node::kMemory,
                                          auth->CreateChannel(served.address), auth, 1, 1,
                                          load_deadline, deadline);
  }
  ~MoverOfNode() {
    mover.reset();
    if (server != nullptr) server->Shutdown();
  }
  std::shared_ptr<const ClusterAuth> auth;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<GrpcKvMover> mover;
};

TEST(GrpcKvMoverTest, LoadsThatWaitedOutTheirDeadlineInTheQueueAreNotSent) {
  SlowNode node(absl::Milliseconds(400));
  {
    MoverOfNode served(node, /*load_deadline=*/absl::Milliseconds(300), absl::Seconds(60));
    ASSERT_NE(served.mover, nullptr);
    GrpcKvMover& mover = *served.mover;
    // A: sent at once, and slower than its deadline. B: queued behind it meanwhile, and
    // out of time by the time A's call gives up.
    Outcome a, b;
    const absl::Time start = absl::Now();
    mover.Submit(Loads(11), a.Sink(), /*background=*/false);
    mover.Submit(Loads(12), b.Sink(), /*background=*/false);
    ASSERT_TRUE(a.Wait());
    ASSERT_TRUE(b.Wait());
    ASSERT_EQ(a.status.size(), 1u);
    EXPECT_EQ(a.status[0].code(), absl::StatusCode::kDeadlineExceeded) << a.status[0];
    ASSERT_EQ(b.status.size(), 1u);
    EXPECT_EQ(b.status[0].code(), absl::StatusCode::kDeadlineExceeded) << b.status[0];
    absl::SleepFor(absl::Milliseconds(600));  // what a late call would need to arrive
    const std::vector<absl::Time> calls = node.deadlines();
    EXPECT_EQ(calls.size(), 1u) << "a batch past its deadline reached the node";
    // A's call carried its deadline from Submit.
    ASSERT_FALSE(calls.empty());
    EXPECT_LE(calls[0], start + absl::Milliseconds(300) + absl::Milliseconds(50));

    // A batch with time left is sent (and fails at its deadline, the node being slower).
    Outcome c;
    mover.Submit(Loads(13), c.Sink(), /*background=*/false);
    ASSERT_TRUE(c.Wait());
    EXPECT_EQ(c.status.at(0).code(), absl::StatusCode::kDeadlineExceeded) << "slower than 300 ms";
    EXPECT_EQ(node.deadlines().size(), 2u);
  }
}

// Fails every call with INTERNAL, or answers too few statuses.
class BrokenNode final : public control::MemoryNode::Service {
 public:
  explicit BrokenNode(bool short_report) : short_report_(short_report) {}
  grpc::Status MoveKv(grpc::ServerContext*, const control::KvMoves*,
                      control::KvMoveReport* report) override {
    if (!short_report_) return grpc::Status(grpc::StatusCode::INTERNAL, "a node's own bug");
    report->add_status();
    return grpc::Status::OK;
  }

 private:
  const bool short_report_;
};

// A call that fails as a whole, or whose report does not match its moves, says nothing of
// the blocks: no load of it condemns its block on disk.
TEST(GrpcKvMoverTest, ACallThatFailedAsAWholeCondemnsNoBlock) {
  for (const bool short_report : {false, true}) {
    SCOPED_TRACE(short_report ? "a short report" : "INTERNAL");
    BrokenNode node(short_report);
    {
      MoverOfNode served(node, absl::Seconds(10), absl::Seconds(10));
      ASSERT_NE(served.mover, nullptr);
      GrpcKvMover& mover = *served.mover;
      std::vector<KvMove> moves = Loads(21);
      moves.push_back(moves.front());
      moves.back().extent = 2;
      Outcome outcome;
      mover.Submit(moves, outcome.Sink(), /*background=*/false);
      ASSERT_TRUE(outcome.Wait());
      ASSERT_EQ(outcome.status.size(), 2u);
      for (const absl::Status& s : outcome.status) {
        EXPECT_FALSE(s.ok());
        EXPECT_FALSE(LoadCondemnsBlock(s)) << s;
        EXPECT_NE(s.message().find(short_report ? "statuses for 2" : "a node's own bug"),
                  std::string::npos)
            << s;
      }
    }
  }
}

}  // namespace
}  // namespace strata
