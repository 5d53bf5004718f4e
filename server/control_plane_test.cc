// The control plane's retire function for executors that leave the rotation (ControlPlane's
// constructor hands it to RotationGroup::SetRetire): wherever the last copy of a replica's
// executor goes, the executor is destroyed on the plane's release thread ("ctl-release"),
// not on the thread that let it go, which may be the scheduler's; and once the plane has
// stopped, the function is cleared and the executor is destroyed where its last copy goes.
// (The function's refused post, for a release loop that stopped while the function was
// still set, cannot happen through Stop, which clears the function first.) And a node that
// hangs while it is configured holds up no other node's configuration past its heartbeat
// deadline.
#include "server/control_plane.h"

#include <pthread.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "common/control/cluster_auth.h"
#include "common/control/version.h"
#include "gtest/gtest.h"
#include "proto/control.grpc.pb.h"
#include "server/rotation_group.h"
#include "server/scheduler.h"
#include "server/testing/loopback_grpc.h"

namespace strata {
namespace {

std::string ThreadName() {
  char name[16] = {};
  pthread_getname_np(pthread_self(), name, sizeof(name));
  return name;
}

// Tells the name of the thread that destroys it.
class Recorded : public StepExecutor {
 public:
  explicit Recorded(std::promise<std::string>* destroyed_on) : destroyed_on_(destroyed_on) {}
  ~Recorded() override { destroyed_on_->set_value(ThreadName()); }
  std::string name() const override { return "recorded"; }
  void Submit(std::shared_ptr<const StepPlan> plan, StepResultSink sink) override {
    StepResult r;
    r.step_id = plan->step_id;
    r.status = absl::UnavailableError("not a compute node");
    sink(std::move(r));
  }
  bool Reachable() override { return true; }

 private:
  std::promise<std::string>* destroyed_on_;
};

// Where the executor that left under `name` is destroyed once the test lets its copy go.
std::string DestroyedOn(RotationGroup& group, const std::string& name) {
  std::promise<std::string> destroyed_on;
  std::future<std::string> where = destroyed_on.get_future();
  EXPECT_EQ(group.AddReplica(name, "address-of-" + name, std::make_shared<Recorded>(&destroyed_on)),
            nullptr);
  std::shared_ptr<StepExecutor> left = group.RemoveReplica(name);
  EXPECT_NE(left, nullptr);
  left.reset();  // the last copy
  if (where.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    ADD_FAILURE() << name << " was not destroyed within 10 s";
    std::abort();  // the promise on this frame would be written later
  }
  return where.get();
}

TEST(ControlPlaneRetireTest, AnExecutorThatLeftIsDestroyedOnTheReleaseThreadUntilThePlaneStops) {
  Scheduler scheduler(SchedulerConfig{}, nullptr);
  auto group = std::make_shared<RotationGroup>(/*batches=*/2, /*num_layers=*/4);
  ControlPlaneOptions options;
  options.auth = ClusterAuth::Insecure();
  options.rotation = group;
  ControlPlane plane(&scheduler, std::move(options));
  const std::string here = ThreadName();
  ASSERT_NE(here, "ctl-release");

  EXPECT_EQ(DestroyedOn(*group, "replica-a"), "ctl-release");
  EXPECT_EQ(DestroyedOn(*group, "replica-b"), "ctl-release");

  plane.Stop();
  EXPECT_EQ(DestroyedOn(*group, "replica-c"), here);
}

// A memory node's control service standing in for a node: its Configure answers at once,
// or (`hang`) never, as a node stopped (SIGSTOP) while it allocates its KV cache would,
// until the call is cancelled.
class MemoryNodeStandIn final : public control::MemoryNode::Service {
 public:
  explicit MemoryNodeStandIn(bool hang) : hang_(hang) {}
  grpc::Status Configure(grpc::ServerContext* context, const control::MemoryConfig* config,
                         control::MemoryConfigAck* ack) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++calls_;
    }
    cv_.notify_all();
    if (hang_) {
      const absl::Time until = absl::Now() + absl::Seconds(60);
      while (!context->IsCancelled() && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
      {
        std::lock_guard<std::mutex> lock(mu_);
        cancelled_ = context->IsCancelled();
      }
      cv_.notify_all();
      return grpc::Status::CANCELLED;
    }
    ack->set_num_slots(config->num_slots());
    ack->set_kv_bytes(1);
    return grpc::Status::OK;
  }
  // Waits until Configure has been called, up to `timeout`.
  bool Called(absl::Duration timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [&] { return calls_ > 0; });
  }
  // Waits until its call has been cancelled, up to `timeout`.
  bool Cancelled(absl::Duration timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [&] { return cancelled_; });
  }

 private:
  const bool hang_;
  std::mutex mu_;
  std::condition_variable cv_;
  int calls_ = 0;
  bool cancelled_ = false;
};

// Registers a memory node named `name` whose control service is at `address`.
control::RegisterResponse RegisterMemoryNode(ControlPlane& plane, const std::string& name,
                                             const std::string& address) {
  control::RegisterRequest request;
  control::NodeInfo* info = request.mutable_node();
  info->set_name(name);
  info->set_role(control::ROLE_MEMORY);
  info->set_protocol_version(kProtocolVersion);
  info->set_control_address(address);
  info->set_kv_budget_bytes(64 << 20);
  control::RegisterResponse response;
  grpc::ServerContext context;
  const grpc::Status status = plane.Register(&context, &request, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return response;
}

// Nodes are configured one at a time, and a memory node's configuration may take minutes
// (its KV cache is touched page by page), so the call has a deadline of ten minutes. A node
// that hangs during it is declared dead when its heartbeats lapse, and its call is
// cancelled then: the nodes after it are configured at once, not ten minutes later.
TEST(ControlPlaneConfigureTest, ANodeThatHangsWhileItConfiguresHoldsUpNoOther) {
  Scheduler scheduler(SchedulerConfig{}, nullptr);
  ControlPlaneOptions options;
  options.auth = ClusterAuth::Insecure();
  options.expected_memory_nodes = 2;
  options.heartbeat_timeout = absl::Seconds(1);
  options.model.set_num_layers(2);
  options.model.set_num_kv_heads(2);
  options.model.set_head_dim(16);
  ControlPlane plane(&scheduler, std::move(options));
  MemoryNodeStandIn hung(/*hang=*/true), good(/*hang=*/false);
  testing::LoopbackServer hung_server = testing::ServeOnLoopback(hung, *ClusterAuth::Insecure());
  testing::LoopbackServer good_server = testing::ServeOnLoopback(good, *ClusterAuth::Insecure());
  ASSERT_NE(hung_server.server, nullptr);
  ASSERT_NE(good_server.server, nullptr);
  RegisterMemoryNode(plane, "memory-hung", hung_server.address);
  ASSERT_TRUE(hung.Called(absl::Seconds(10)));
  // The good node sends its heartbeats; the hung one sends none.
  const control::RegisterResponse good_node =
      RegisterMemoryNode(plane, "memory-good", good_server.address);
  std::atomic<bool> stop{false};
  std::thread heartbeats([&] {
    while (!stop.load()) {
      control::HeartbeatRequest request;
      request.set_node_id(good_node.node_id());
      request.set_epoch(good_node.epoch());
      request.set_session_token(good_node.session_token());
      control::HeartbeatResponse response;
      grpc::ServerContext context;
      plane.Heartbeat(&context, &request, &response);
      absl::SleepFor(absl::Milliseconds(100));
    }
  });
  EXPECT_TRUE(good.Called(absl::Seconds(20)))
      << "the good node was not configured while the hung one's call was open";
  stop.store(true);
  heartbeats.join();
  EXPECT_TRUE(hung.Cancelled(absl::Seconds(10))) << "the hung node's call was not cancelled";
  plane.Stop();
  hung_server.server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  good_server.server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
}

}  // namespace
}  // namespace strata
