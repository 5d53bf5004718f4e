// The control plane's retire function for executors that leave the rotation (ControlPlane's
// constructor hands it to RotationGroup::SetRetire): wherever the last copy of a replica's
// executor goes, the executor is destroyed on the plane's release thread ("ctl-release"),
// not on the thread that let it go, which may be the scheduler's; and once the plane has
// stopped, the function is cleared and the executor is destroyed where its last copy goes.
// (The function's refused post, for a release loop that stopped while the function was
// still set, cannot happen through Stop, which clears the function first.) And how nodes
// are configured: each on a thread of its own, so a node that hangs or takes minutes while it
// is configured holds up no other; a compute node configured while a memory node arrived
// is told of it afterwards; and a memory node's pool comes alive in the scheduler only once
// every compute node knows of it. The nodes are stand-in control services on loopback.
#include "server/control_plane.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

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

// A memory node's control service standing in for a node. Its Configure answers at once
// (kAnswer); or never (kHang), as a node stopped (SIGSTOP) while it allocates its KV cache
// would, until the call is cancelled; or (kHold) once the test lets it, as a node that takes
// minutes to touch a large KV cache would. It records the pool index each call gave it.
class MemoryNodeStandIn final : public control::MemoryNode::Service {
 public:
  enum class Mode { kAnswer, kHang, kHold };
  explicit MemoryNodeStandIn(Mode mode) : mode_(mode) {}
  grpc::Status Configure(grpc::ServerContext* context, const control::MemoryConfig* config,
                         control::MemoryConfigAck* ack) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++calls_;
      pool_index_ = config->pool_index();
    }
    cv_.notify_all();
    if (mode_ == Mode::kHang) {
      const absl::Time until = absl::Now() + absl::Seconds(60);
      while (!context->IsCancelled() && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
      {
        std::lock_guard<std::mutex> lock(mu_);
        cancelled_ = context->IsCancelled();
      }
      cv_.notify_all();
      return grpc::Status::CANCELLED;
    }
    if (mode_ == Mode::kHold) {
      std::unique_lock<std::mutex> lock(mu_);
      const absl::Time until = absl::Now() + absl::Seconds(60);
      while (!released_ && !context->IsCancelled() && absl::Now() < until) {
        cv_.wait_for(lock, std::chrono::milliseconds(5));
      }
      if (!released_) {
        cancelled_ = context->IsCancelled();
        lock.unlock();
        cv_.notify_all();
        return grpc::Status::CANCELLED;
      }
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
  // A held call answers now.
  void Release() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      released_ = true;
    }
    cv_.notify_all();
  }
  // The pool index of the last call (-1 before any).
  int64_t pool_index() {
    std::lock_guard<std::mutex> lock(mu_);
    return pool_index_;
  }

 private:
  const Mode mode_;
  std::mutex mu_;
  std::condition_variable cv_;
  int calls_ = 0;
  bool cancelled_ = false;
  bool released_ = false;
  int64_t pool_index_ = -1;
};

// A compute node's control service standing in for a node: its Configure answers at once,
// but for call number `hold_call` (from 1; 0: none) and every call from number `hold_from`
// on (0: none), which answer once the test lets them (or the caller cancels them), and calls
// from number `refuse_from` on (0: none), which it refuses (FAILED_PRECONDITION); it records
// the memory nodes each call named.
class ComputeNodeStandIn final : public control::ComputeNode::Service {
 public:
  explicit ComputeNodeStandIn(int hold_call = 0, int refuse_from = 0, int hold_from = 0)
      : hold_call_(hold_call), refuse_from_(refuse_from), hold_from_(hold_from) {}
  grpc::Status Configure(grpc::ServerContext* context, const control::ComputeConfig* config,
                         control::ComputeConfigAck*) override {
    std::unique_lock<std::mutex> lock(mu_);
    std::vector<std::string> names;
    for (const auto& m : config->memory_nodes()) names.push_back(m.name());
    calls_.push_back(std::move(names));
    cv_.notify_all();
    const int call = static_cast<int>(calls_.size());
    if (call == hold_call_ || (hold_from_ > 0 && call >= hold_from_)) {
      const absl::Time until = absl::Now() + absl::Seconds(60);
      while (!released_ && !context->IsCancelled() && absl::Now() < until) {
        cv_.wait_for(lock, std::chrono::milliseconds(5));
      }
      if (!released_) return grpc::Status::CANCELLED;
    }
    if (refuse_from_ > 0 && call >= refuse_from_) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "not this configuration");
    }
    return grpc::Status::OK;
  }
  // Waits until a call has named exactly `names` (in the order given), up to `timeout`.
  bool Named(const std::vector<std::string>& names, absl::Duration timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [&] {
      return std::find(calls_.begin(), calls_.end(), names) != calls_.end();
    });
  }
  // The held call answers now.
  void Release() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      released_ = true;
    }
    cv_.notify_all();
  }

 private:
  const int hold_call_;
  const int refuse_from_;
  const int hold_from_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::vector<std::string>> calls_;
  bool released_ = false;
};

// Whether a test may read the scheduler's stats from its own thread: they are published
// under an absl::Mutex, which ThreadSanitizer cannot see (tests/thread_checks), so under
// TSan the read is reported as a race. The plain build (tests/run_all) checks them.
#if defined(__SANITIZE_THREAD__)
constexpr bool kReadsSchedulerStats = false;
#else
constexpr bool kReadsSchedulerStats = true;
#endif

// A stand-in control service served on loopback until this goes.
class OnLoopback {
 public:
  explicit OnLoopback(grpc::Service& service)
      : served_(testing::ServeOnLoopback(service, *ClusterAuth::Insecure())) {}
  ~OnLoopback() {
    if (up()) served_.server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  }
  bool up() const { return served_.server != nullptr; }
  const std::string& address() const { return served_.address; }

 private:
  testing::LoopbackServer served_;
};

// The model shape the tests' plane serves and their nodes load.
control::ModelShape TestModel() {
  control::ModelShape model;
  model.set_num_layers(2);
  model.set_num_kv_heads(2);
  model.set_head_dim(16);
  return model;
}

// Registers a node named `name` in `role` whose control service is at `address`.
control::RegisterResponse RegisterNode(ControlPlane& plane, const std::string& name,
                                       control::NodeRole role, const std::string& address) {
  control::RegisterRequest request;
  control::NodeInfo* info = request.mutable_node();
  info->set_name(name);
  info->set_role(role);
  info->set_protocol_version(kProtocolVersion);
  info->set_control_address(address);
  info->set_kv_budget_bytes(64 << 20);
  *info->mutable_model() = TestModel();
  control::RegisterResponse response;
  grpc::ServerContext context;
  const grpc::Status status = plane.Register(&context, &request, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return response;
}

control::RegisterResponse RegisterMemoryNode(ControlPlane& plane, const std::string& name,
                                             const std::string& address) {
  return RegisterNode(plane, name, control::ROLE_MEMORY, address);
}

// Sends the heartbeats of the nodes added, every 100 ms, until it is destroyed.
class Heartbeats {
 public:
  explicit Heartbeats(ControlPlane* plane)
      : plane_(plane), thread_([this] {
          while (!stop_.load()) {
            std::vector<control::RegisterResponse> nodes;
            {
              std::lock_guard<std::mutex> lock(mu_);
              nodes = nodes_;
            }
            for (const control::RegisterResponse& node : nodes) {
              control::HeartbeatRequest request;
              request.set_node_id(node.node_id());
              request.set_epoch(node.epoch());
              request.set_session_token(node.session_token());
              control::HeartbeatResponse response;
              grpc::ServerContext context;
              plane_->Heartbeat(&context, &request, &response);
            }
            absl::SleepFor(absl::Milliseconds(100));
          }
        }) {}
  ~Heartbeats() {
    stop_.store(true);
    thread_.join();
  }
  void Add(const control::RegisterResponse& node) {
    std::lock_guard<std::mutex> lock(mu_);
    nodes_.push_back(node);
  }

 private:
  ControlPlane* const plane_;
  std::mutex mu_;
  std::vector<control::RegisterResponse> nodes_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Whether the node named `name` is configured, waiting up to `timeout` for it.
bool Configured(const ControlPlane& plane, const std::string& name, absl::Duration timeout) {
  const absl::Time until = absl::Now() + timeout;
  do {
    for (const NodeView& node : plane.Nodes()) {
      if (node.info.name() == name && node.alive && node.configured) return true;
    }
    absl::SleepFor(absl::Milliseconds(10));
  } while (absl::Now() < until);
  return false;
}

ControlPlaneOptions TwoMemoryNodes() {
  ControlPlaneOptions options;
  options.auth = ClusterAuth::Insecure();
  options.expected_memory_nodes = 2;
  options.heartbeat_timeout = absl::Seconds(1);
  options.model = TestModel();
  return options;
}

// A memory node's configuration may take minutes (its KV cache is touched page by page), so
// the call has a deadline of ten minutes. A node that hangs during it holds up no other
// node's configuration, and it is declared dead when its heartbeats lapse: its call is
// cancelled then, not left open for ten minutes.
TEST(ControlPlaneConfigureTest, ANodeThatHangsWhileItConfiguresHoldsUpNoOther) {
  Scheduler scheduler(SchedulerConfig{}, nullptr);
  ControlPlane plane(&scheduler, TwoMemoryNodes());
  MemoryNodeStandIn hung(MemoryNodeStandIn::Mode::kHang), good(MemoryNodeStandIn::Mode::kAnswer);
  OnLoopback hung_server(hung);
  OnLoopback good_server(good);
  ASSERT_TRUE(hung_server.up());
  ASSERT_TRUE(good_server.up());
  RegisterMemoryNode(plane, "memory-hung", hung_server.address());
  ASSERT_TRUE(hung.Called(absl::Seconds(10)));
  // The good node sends its heartbeats; the hung one sends none.
  const control::RegisterResponse good_node =
      RegisterMemoryNode(plane, "memory-good", good_server.address());
  {
    Heartbeats heartbeats(&plane);
    heartbeats.Add(good_node);
    EXPECT_TRUE(good.Called(absl::Seconds(20)))
        << "the good node was not configured while the hung one's call was open";
  }
  EXPECT_TRUE(hung.Cancelled(absl::Seconds(10))) << "the hung node's call was not cancelled";
  plane.Stop();
}

// A memory node that takes long to configure (a large KV cache touched page by page: about
// 3 s per GiB) but is alive holds up no other node: a memory node registered after it is
// configured, and the compute nodes are told of it, while its call is still open. Each
// gets a pool index of its own, in the order they registered, whichever finishes first.
// Stopping the plane cancels a call still open.
TEST(ControlPlaneConfigureTest, ASlowNodesConfigurationHoldsUpNoOther) {
  Scheduler scheduler(SchedulerConfig{}, nullptr);
  scheduler.Start();  // its pools are read below
  ControlPlane plane(&scheduler, TwoMemoryNodes());
  MemoryNodeStandIn slow(MemoryNodeStandIn::Mode::kHold), quick(MemoryNodeStandIn::Mode::kAnswer),
      last(MemoryNodeStandIn::Mode::kHold);
  ComputeNodeStandIn compute;
  OnLoopback slow_server(slow);
  OnLoopback quick_server(quick);
  OnLoopback last_server(last);
  OnLoopback compute_server(compute);
  ASSERT_TRUE(slow_server.up());
  ASSERT_TRUE(quick_server.up());
  ASSERT_TRUE(last_server.up());
  ASSERT_TRUE(compute_server.up());
  {
    Heartbeats heartbeats(&plane);
    heartbeats.Add(RegisterMemoryNode(plane, "memory-slow", slow_server.address()));
    ASSERT_TRUE(slow.Called(absl::Seconds(10)));
    heartbeats.Add(
        RegisterNode(plane, "compute-0", control::ROLE_COMPUTE, compute_server.address()));
    EXPECT_TRUE(Configured(plane, "compute-0", absl::Seconds(10)))
        << "the compute node was not configured while a memory node's call was open";
    heartbeats.Add(RegisterMemoryNode(plane, "memory-quick", quick_server.address()));
    EXPECT_TRUE(Configured(plane, "memory-quick", absl::Seconds(10)))
        << "a memory node was not configured while another's call was open";
    EXPECT_TRUE(compute.Named({"memory-quick"}, absl::Seconds(10)))
        << "the compute node was not told of the memory node configured meanwhile";
    EXPECT_FALSE(Configured(plane, "memory-slow", absl::ZeroDuration()));

    slow.Release();
    EXPECT_TRUE(Configured(plane, "memory-slow", absl::Seconds(10)));
    EXPECT_TRUE(compute.Named({"memory-slow", "memory-quick"}, absl::Seconds(10)));
    EXPECT_EQ(slow.pool_index(), 0);
    EXPECT_EQ(quick.pool_index(), 1);
    // The scheduler's pools are the ones the nodes were given, both alive.
    if (kReadsSchedulerStats) {
      std::vector<PoolStatus> pools;
      for (absl::Time until = absl::Now() + absl::Seconds(10); absl::Now() < until;) {
        pools = scheduler.Stats().pools;
        if (pools.size() == 2 && pools[0].alive && pools[1].alive) break;
        absl::SleepFor(absl::Milliseconds(10));
      }
      ASSERT_EQ(pools.size(), 2u);
      EXPECT_EQ(pools[0].name, "memory-slow");
      EXPECT_EQ(pools[1].name, "memory-quick");
      EXPECT_TRUE(pools[0].alive);
      EXPECT_TRUE(pools[1].alive);
    }

    heartbeats.Add(RegisterMemoryNode(plane, "memory-last", last_server.address()));
    ASSERT_TRUE(last.Called(absl::Seconds(10)));
    plane.Stop();
    EXPECT_TRUE(last.Cancelled(absl::Seconds(10))) << "Stop left the open call running";
  }
}

// A compute node is sent the memory nodes configured when its configuration starts; one
// configured while its call is open is not in that list, and the broadcast of the change
// passes it by (it is not configured yet). It is told once its own call is over.
TEST(ControlPlaneConfigureTest, AComputeNodeLearnsOfAMemoryNodeConfiguredDuringItsOwnCall) {
  Scheduler scheduler(SchedulerConfig{}, nullptr);
  ControlPlane plane(&scheduler, TwoMemoryNodes());
  ComputeNodeStandIn compute(/*hold_call=*/1);
  MemoryNodeStandIn memory(MemoryNodeStandIn::Mode::kAnswer);
  OnLoopback compute_server(compute);
  OnLoopback memory_server(memory);
  ASSERT_TRUE(compute_server.up());
  ASSERT_TRUE(memory_server.up());
  {
    Heartbeats heartbeats(&plane);
    heartbeats.Add(
        RegisterNode(plane, "compute-0", control::ROLE_COMPUTE, compute_server.address()));
    ASSERT_TRUE(compute.Named({}, absl::Seconds(10)));  // its first call, held
    heartbeats.Add(RegisterMemoryNode(plane, "memory-0", memory_server.address()));
    ASSERT_TRUE(memory.Called(absl::Seconds(10)));
    absl::SleepFor(absl::Milliseconds(200));  // time for its call to be over
    compute.Release();
    EXPECT_TRUE(Configured(plane, "compute-0", absl::Seconds(10)));
    EXPECT_TRUE(compute.Named({"memory-0"}, absl::Seconds(10)))
        << "the compute node was never told of the memory node configured during its call";
    EXPECT_TRUE(Configured(plane, "memory-0", absl::Seconds(10)));
    plane.Stop();
  }
}

// The scheduler places KV only on pools every compute node has heard of: a plan that
// named a pool its compute node does not know would fail the step, and that pool's memory
// node would be taken for dead. So a memory node that took its configuration while the
// compute node's call telling it so is still open is not ready, nor its pool alive, until
// that call is over.
TEST(ControlPlaneConfigureTest, AMemoryNodesPoolIsAliveOnlyOnceEveryComputeNodeKnowsIt) {
  Scheduler scheduler(SchedulerConfig{}, nullptr);
  scheduler.Start();  // its pools are read below
  ControlPlane plane(&scheduler, TwoMemoryNodes());
  ComputeNodeStandIn compute(/*hold_call=*/2);  // the first call after its own
  MemoryNodeStandIn memory(MemoryNodeStandIn::Mode::kAnswer);
  OnLoopback compute_server(compute);
  OnLoopback memory_server(memory);
  ASSERT_TRUE(compute_server.up());
  ASSERT_TRUE(memory_server.up());
  // Whether the scheduler's pool 0 is alive.
  auto pool_alive = [&] {
    const std::vector<PoolStatus> pools = scheduler.Stats().pools;
    return !pools.empty() && pools[0].alive;
  };
  {
    Heartbeats heartbeats(&plane);
    heartbeats.Add(
        RegisterNode(plane, "compute-0", control::ROLE_COMPUTE, compute_server.address()));
    ASSERT_TRUE(Configured(plane, "compute-0", absl::Seconds(10)));
    heartbeats.Add(RegisterMemoryNode(plane, "memory-0", memory_server.address()));
    ASSERT_TRUE(memory.Called(absl::Seconds(10)));
    ASSERT_TRUE(compute.Named({"memory-0"}, absl::Seconds(10)));  // the held call
    absl::SleepFor(absl::Milliseconds(200));                      // time to go wrong
    EXPECT_FALSE(Configured(plane, "memory-0", absl::ZeroDuration()));
    if (kReadsSchedulerStats) {
      EXPECT_FALSE(pool_alive()) << "the pool is alive before the compute node knows of it";
      // /health says what it waits for.
      EXPECT_NE(plane.Missing().find("1 configured but not yet known to every compute node"),
                std::string::npos)
          << plane.Missing();
    }
    compute.Release();
    EXPECT_TRUE(Configured(plane, "memory-0", absl::Seconds(10)));
    bool alive = !kReadsSchedulerStats;
    for (absl::Time until = absl::Now() + absl::Seconds(10); !alive && absl::Now() < until;) {
      alive = pool_alive();
      if (!alive) absl::SleepFor(absl::Milliseconds(10));
    }
    EXPECT_TRUE(alive) << "the pool did not come alive once the compute node knew of it";
    plane.Stop();
  }
}

// The compute nodes are told of a change each on its own: one that hangs (its call is open
// until it is declared dead) delays no other node's news, such as a memory node that died,
// which the other's steps would wait on.
TEST(ControlPlaneConfigureTest, AHungComputeNodeDelaysNoOtherComputeNodesNews) {
  Scheduler scheduler(SchedulerConfig{}, nullptr);
  ControlPlaneOptions options = TwoMemoryNodes();
  options.heartbeat_timeout = absl::Seconds(10);  // the hung node stays alive for the test
  ControlPlane plane(&scheduler, std::move(options));
  ComputeNodeStandIn hung(/*hold_call=*/2), good;
  MemoryNodeStandIn memory(MemoryNodeStandIn::Mode::kAnswer);
  OnLoopback hung_server(hung);
  OnLoopback good_server(good);
  OnLoopback memory_server(memory);
  ASSERT_TRUE(hung_server.up());
  ASSERT_TRUE(good_server.up());
  ASSERT_TRUE(memory_server.up());
  {
    Heartbeats heartbeats(&plane);
    // The hung node first: a broadcast that went node by node would reach it first.
    RegisterNode(plane, "compute-hung", control::ROLE_COMPUTE, hung_server.address());
    ASSERT_TRUE(Configured(plane, "compute-hung", absl::Seconds(10)));
    heartbeats.Add(
        RegisterNode(plane, "compute-good", control::ROLE_COMPUTE, good_server.address()));
    ASSERT_TRUE(Configured(plane, "compute-good", absl::Seconds(10)));
    heartbeats.Add(RegisterMemoryNode(plane, "memory-0", memory_server.address()));
    ASSERT_TRUE(hung.Named({"memory-0"}, absl::Seconds(10)));  // its call, held
    EXPECT_TRUE(good.Named({"memory-0"}, absl::Seconds(3)))
        << "the good compute node was not told while the hung one's call was open";
    EXPECT_TRUE(Configured(plane, "compute-hung", absl::ZeroDuration()))
        << "the hung node was declared dead too soon for the test to mean anything";
    plane.Stop();
  }
}

// What came of a memory node that registered beside two configured, heartbeating compute
// nodes, `bad` and a good one: how long after its registration it was announced (none:
// not within `timeout`), whether the good one was told of it, and whether `bad` lives.
struct BesideABadComputeNode {
  std::optional<absl::Duration> announced_after;
  bool good_told = false;
  bool bad_alive = true;
};

BesideABadComputeNode RegisterAMemoryNodeBesideABadComputeNode(ControlPlaneOptions options,
                                                               ComputeNodeStandIn& bad,
                                                               absl::Duration timeout) {
  Scheduler scheduler(SchedulerConfig{}, nullptr);
  ControlPlane plane(&scheduler, std::move(options));
  ComputeNodeStandIn good;
  MemoryNodeStandIn memory(MemoryNodeStandIn::Mode::kAnswer);
  OnLoopback bad_server(bad);
  OnLoopback good_server(good);
  OnLoopback memory_server(memory);
  BesideABadComputeNode out;
  EXPECT_TRUE(bad_server.up() && good_server.up() && memory_server.up());
  Heartbeats heartbeats(&plane);
  heartbeats.Add(RegisterNode(plane, "compute-bad", control::ROLE_COMPUTE, bad_server.address()));
  heartbeats.Add(RegisterNode(plane, "compute-good", control::ROLE_COMPUTE, good_server.address()));
  EXPECT_TRUE(Configured(plane, "compute-bad", absl::Seconds(10)));
  EXPECT_TRUE(Configured(plane, "compute-good", absl::Seconds(10)));
  const absl::Time registered = absl::Now();
  heartbeats.Add(RegisterMemoryNode(plane, "memory-0", memory_server.address()));
  if (Configured(plane, "memory-0", timeout)) out.announced_after = absl::Now() - registered;
  out.good_told = good.Named({"memory-0"}, absl::Seconds(10));
  for (const NodeView& node : plane.Nodes()) {
    if (node.info.name() == "compute-bad") out.bad_alive = node.alive;
  }
  plane.Stop();
  return out;
}

// A compute node that refuses the memory-node list (an error asking again would get again)
// is taken out rather than asked forever: while it lived, no memory node it had not heard
// of would be announced. The memory node then is, to the compute node that took the list.
TEST(ControlPlaneConfigureTest, AComputeNodeThatRefusesTheMemoryNodeListIsTakenOut) {
  ControlPlaneOptions options = TwoMemoryNodes();
  options.heartbeat_timeout = absl::Seconds(30);  // only the refusal takes it out
  ComputeNodeStandIn refusing(/*hold_call=*/0, /*refuse_from=*/2);
  const BesideABadComputeNode outcome =
      RegisterAMemoryNodeBesideABadComputeNode(std::move(options), refusing, absl::Seconds(10));
  EXPECT_TRUE(outcome.announced_after.has_value())
      << "the memory node waited for the compute node that refuses its list";
  EXPECT_TRUE(outcome.good_told);
  EXPECT_FALSE(outcome.bad_alive);
}

// A compute node that heartbeats but never answers the memory-node list (every call from
// its second on hangs until the plane cancels it) is taken out after list_deadline rather
// than asked for as long as it lives, which held back the new memory node's pool all that
// time. The memory node then is announced, to the compute node that took the list.
TEST(ControlPlaneConfigureTest, AComputeNodeThatNeverTakesTheMemoryNodeListIsTakenOut) {
  ControlPlaneOptions options = TwoMemoryNodes();
  options.heartbeat_timeout = absl::Seconds(60);  // it heartbeats; only the bound takes it out
  options.list_deadline = absl::Seconds(2);
  ComputeNodeStandIn silent(/*hold_call=*/0, /*refuse_from=*/0, /*hold_from=*/2);
  const BesideABadComputeNode outcome =
      RegisterAMemoryNodeBesideABadComputeNode(std::move(options), silent, absl::Seconds(15));
  ASSERT_TRUE(outcome.announced_after.has_value())
      << "the memory node waited for the compute node that never takes its list";
  EXPECT_GE(*outcome.announced_after, absl::Seconds(2))
      << "announced before the silent node was taken out";
  EXPECT_TRUE(outcome.good_told);
  EXPECT_FALSE(outcome.bad_alive);
}

// The KV cache's type is the deployment's: a compute node started with another
// (--kv_cache_dtype) is refused at registration, with both types named, as one that loaded
// another model is.
TEST(ControlPlaneRegisterTest, AComputeNodeWithAnotherKvCacheTypeIsRefused) {
  Scheduler scheduler(SchedulerConfig{}, nullptr);
  ControlPlaneOptions options = TwoMemoryNodes();
  options.model.set_kv_dtype("f16");
  ControlPlane plane(&scheduler, std::move(options));
  for (const char* kv : {"bf16", ""}) {  // "": a node of a build before the flag, bf16
    control::RegisterRequest request;
    control::NodeInfo* info = request.mutable_node();
    info->set_name("compute-0");
    info->set_role(control::ROLE_COMPUTE);
    info->set_protocol_version(kProtocolVersion);
    info->set_control_address("127.0.0.1:1");
    *info->mutable_model() = TestModel();
    info->mutable_model()->set_kv_dtype(kv);
    control::RegisterResponse response;
    grpc::ServerContext context;
    const grpc::Status status = plane.Register(&context, &request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << kv;
    EXPECT_NE(status.error_message().find("keeps its KV cache in bf16; this scheduler's is f16"),
              std::string::npos)
        << status.error_message();
  }
  plane.Stop();
}

}  // namespace
}  // namespace strata
