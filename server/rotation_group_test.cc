// The scheduler's rotation group over scripted replicas (executors that hold plans until the
// test answers them): each plan reaches every active replica with its place in the
// rotation; the group's result is the sampling replica's, with the others' failures folded
// in, in submission order; slots are reused only when free; a replica that a step found
// unreachable sits out until it rejoins; removing a replica whose executor fails its
// plans from its destructor (as a gRPC executor does) does not deadlock; and an executor
// that left goes to the retire function where its last copy goes.
#include "server/rotation_group.h"

#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

#include "gtest/gtest.h"

namespace strata {
namespace {

// Holds every plan until Answer(); fails what it still holds when destroyed.
class ScriptedReplica : public StepExecutor {
 public:
  explicit ScriptedReplica(std::string name) : name_(std::move(name)) {}
  ~ScriptedReplica() override {
    std::vector<std::pair<StepPlan, StepResultSink>> held;
    {
      std::lock_guard<std::mutex> lock(mu_);
      held.swap(held_);
    }
    for (auto& [plan, sink] : held) {
      StepResult r;
      r.step_id = plan.step_id;
      r.status = absl::UnavailableError(name_ + " went away");
      r.node_unreachable = true;
      sink(std::move(r));
    }
  }
  std::string name() const override { return name_; }
  void Submit(std::shared_ptr<const StepPlan> plan, StepResultSink sink) override {
    std::lock_guard<std::mutex> lock(mu_);
    held_.emplace_back(*plan, std::move(sink));
  }
  bool Reachable() override { return reachable; }

  size_t held() {
    std::lock_guard<std::mutex> lock(mu_);
    return held_.size();
  }
  StepPlan plan(size_t i) {
    std::lock_guard<std::mutex> lock(mu_);
    return held_.at(i).first;
  }
  // Answers the oldest held plan with `result` (its step id filled in).
  void Answer(StepResult result) {
    std::pair<StepPlan, StepResultSink> next;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ASSERT_FALSE(held_.empty());
      next = std::move(held_.front());
      held_.erase(held_.begin());
    }
    result.step_id = next.first.step_id;
    next.second(std::move(result));
  }

  bool reachable = true;

 private:
  std::string name_;
  std::mutex mu_;
  std::vector<std::pair<StepPlan, StepResultSink>> held_;
};

std::shared_ptr<const StepPlan> Plan(uint64_t id) {
  StepPlan p;
  p.step_id = id;
  SequenceChunk c;
  c.request_id = SequenceId(id);
  c.tokens = {5};
  p.chunks.push_back(c);
  return std::make_shared<const StepPlan>(std::move(p));
}

StepResult Tokens(std::vector<uint64_t> ids) {
  StepResult r;
  for (uint64_t id : ids) r.tokens.push_back({SequenceId(id), 7, 0.0f, {}});
  return r;
}

struct Results {
  std::mutex mu;
  std::vector<StepResult> got;
  StepResultSink Sink() {
    return [this](StepResult r) {
      std::lock_guard<std::mutex> lock(mu);
      got.push_back(std::move(r));
    };
  }
  size_t size() {
    std::lock_guard<std::mutex> lock(mu);
    return got.size();
  }
};

constexpr int kLayers = 4;

TEST(RotationGroupTest, PlansReachEveryReplicaAndResultsComeFromTheSampler) {
  Results results;  // outlives the group, whose replicas answer into it at the end
  RotationGroup group(/*batches=*/3, kLayers);
  auto a = std::make_shared<ScriptedReplica>("a");
  auto b = std::make_shared<ScriptedReplica>("b");
  group.AddReplica("a", "addr-a", a);
  group.AddReplica("b", "addr-b", b);
  EXPECT_EQ(group.live_replicas(), 2);
  group.Submit(Plan(1), results.Sink());
  group.Submit(Plan(2), results.Sink());
  ASSERT_EQ(a->held(), 2u);
  ASSERT_EQ(b->held(), 2u);
  // Each copy names the receiver, the slot and both addresses (replicas by name).
  EXPECT_EQ(a->plan(0).rotation.replica, 0);
  EXPECT_EQ(b->plan(0).rotation.replica, 1);
  EXPECT_EQ(a->plan(0).rotation.replicas, (std::vector<std::string>{"addr-a", "addr-b"}));
  EXPECT_EQ(a->plan(0).rotation.batch, 0);
  EXPECT_EQ(a->plan(1).rotation.batch, 1);
  // Slot j samples on replica (j + L) mod R: slot 0 on a (4 mod 2 = 0), slot 1 on b.
  // Plan 2 finishes first on both; its result waits for plan 1's (submission order).
  a->Answer(Tokens({1}));  // plan 1, a samples: its tokens count
  StepResult b_plan1;
  b_plan1.failed.emplace_back(SequenceId(1), absl::UnavailableError("share lost"));
  // b answers plan 1 later; first plan 2 on both.
  // (a's and b's queues are in submission order, so answer the heads.)
  b->Answer(b_plan1);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results.got[0].step_id, 1u);
  EXPECT_TRUE(results.got[0].status.ok());
  EXPECT_TRUE(results.got[0].tokens.empty()) << "a failed sequence keeps no token";
  ASSERT_EQ(results.got[0].failed.size(), 1u);
  a->Answer(Tokens({99}));  // plan 2 on a: not the sampler, its tokens are ignored
  b->Answer(Tokens({2}));   // plan 2 on b: the sampler
  ASSERT_EQ(results.size(), 2u);
  ASSERT_EQ(results.got[1].tokens.size(), 1u);
  EXPECT_EQ(results.got[1].tokens[0].request_id, SequenceId(2));
}

TEST(RotationGroupTest, ResultsLeaveInSubmissionOrderAndSlotsAreReused) {
  Results results;  // outlives the group, whose replicas answer into it at the end
  RotationGroup group(/*batches=*/2, kLayers);
  auto a = std::make_shared<ScriptedReplica>("a");
  auto b = std::make_shared<ScriptedReplica>("b");
  group.AddReplica("a", "addr-a", a);
  group.AddReplica("b", "addr-b", b);
  group.Submit(Plan(1), results.Sink());
  group.Submit(Plan(2), results.Sink());
  // Both slots are taken: a third plan is refused at once, after the two in order.
  group.Submit(Plan(3), results.Sink());
  EXPECT_EQ(results.size(), 0u) << "plan 3's answer went ahead of plans 1 and 2";
  a->Answer(Tokens({1}));
  b->Answer(Tokens({1}));
  a->Answer(Tokens({2}));
  b->Answer(Tokens({2}));
  ASSERT_EQ(results.size(), 3u);
  EXPECT_EQ(results.got[0].step_id, 1u);
  EXPECT_EQ(results.got[1].step_id, 2u);
  EXPECT_EQ(results.got[2].step_id, 3u);
  EXPECT_TRUE(absl::IsResourceExhausted(results.got[2].status)) << results.got[2].status;
  // Slot 0 is free again.
  group.Submit(Plan(4), results.Sink());
  EXPECT_EQ(a->plan(0).rotation.batch, 0);
}

TEST(RotationGroupTest, FewerThanTwoReplicasIsUnavailable) {
  Results results;  // outlives the group, whose replicas answer into it at the end
  RotationGroup group(/*batches=*/3, kLayers);
  auto a = std::make_shared<ScriptedReplica>("a");
  group.AddReplica("a", "addr-a", a);
  auto b = std::make_shared<ScriptedReplica>("b");
  group.AddReplica("b", "addr-b", b, /*active=*/false);  // joined, not yet set up
  EXPECT_EQ(group.live_replicas(), 1);
  EXPECT_FALSE(group.Reachable());
  group.Submit(Plan(1), results.Sink());
  ASSERT_EQ(results.size(), 1u);
  EXPECT_TRUE(absl::IsUnavailable(results.got[0].status));
  EXPECT_EQ(b->held(), 0u) << "an inactive replica got a plan";
  group.ActivateReplica("b");
  EXPECT_TRUE(group.Reachable());
  group.Submit(Plan(2), results.Sink());
  EXPECT_EQ(b->held(), 1u);
}

TEST(RotationGroupTest, AnUnreachableReplicaSitsOutUntilItRejoins) {
  Results results;  // outlives the group, whose replicas answer into it at the end
  RotationGroup group(/*batches=*/3, kLayers);
  auto a = std::make_shared<ScriptedReplica>("a");
  auto b = std::make_shared<ScriptedReplica>("b");
  auto c = std::make_shared<ScriptedReplica>("c");
  group.AddReplica("a", "addr-a", a);
  group.AddReplica("b", "addr-b", b);
  group.AddReplica("c", "addr-c", c);
  std::vector<std::string> rejoined;
  group.SetRejoinHandler([&](const std::string& name) { rejoined.push_back(name); });
  group.Submit(Plan(1), results.Sink());
  a->Answer(Tokens({}));
  b->Answer(Tokens({}));
  StepResult lost;
  lost.status = absl::UnavailableError("stream broke");
  lost.node_unreachable = true;
  c->reachable = false;
  c->Answer(lost);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_FALSE(results.got[0].status.ok());
  // The next plan goes to a and b only.
  group.Submit(Plan(2), results.Sink());
  EXPECT_EQ(c->held(), 0u);
  EXPECT_EQ(a->plan(0).rotation.replicas.size(), 2u);
  // Reachable again: it rejoins through the handler, and sits out until activated.
  c->reachable = true;
  group.Submit(Plan(3), results.Sink());
  EXPECT_EQ(rejoined, (std::vector<std::string>{"c"}));
  EXPECT_EQ(c->held(), 0u);
  group.ActivateReplica("c");
  a->Answer(Tokens({}));
  b->Answer(Tokens({}));
  a->Answer(Tokens({}));
  b->Answer(Tokens({}));
  group.Submit(Plan(4), results.Sink());
  EXPECT_EQ(c->held(), 1u);
}

TEST(RotationGroupTest, RemovingAReplicaThatFailsItsPlansOnTheWayOutDoesNotDeadlock) {
  Results results;  // outlives the group, whose replicas answer into it at the end
  RotationGroup group(/*batches=*/3, kLayers);
  auto a = std::make_shared<ScriptedReplica>("a");
  group.AddReplica("a", "addr-a", a);
  group.AddReplica("b", "addr-b", std::make_shared<ScriptedReplica>("b"));
  group.Submit(Plan(1), results.Sink());
  a->Answer(Tokens({1}));
  // The group holds b's only reference: removing it destroys it, and its destructor fails
  // plan 1 through the group's callback.
  std::thread remover([&] { group.RemoveReplica("b"); });
  remover.join();
  ASSERT_EQ(results.size(), 1u);
  EXPECT_TRUE(absl::IsUnavailable(results.got[0].status)) << results.got[0].status;
  EXPECT_EQ(group.live_replicas(), 1);
  // Replacing a replica of the same name is the same path.
  group.AddReplica("c", "addr-c", std::make_shared<ScriptedReplica>("c"));
  group.Submit(Plan(2), results.Sink());
  group.AddReplica("c", "addr-c2", std::make_shared<ScriptedReplica>("c"));
  a->Answer(Tokens({2}));
  EXPECT_EQ(results.size(), 2u);
}

// A replica removed after plans reached it is listed with the last step it was sent, for the
// control plane to tell the others (a hung one keeps its connections to them open); one
// that was never sent a plan owes nothing and is not listed; one back at the same address
// leaves the list; the list keeps the newest kMaxDepartures.
TEST(RotationGroupTest, RemovedReplicasAreListedWithTheLastStepTheyWereSent) {
  Results results;  // outlives the group, whose replicas answer into it at the end
  RotationGroup group(/*batches=*/3, kLayers);
  auto a = std::make_shared<ScriptedReplica>("a");
  auto b = std::make_shared<ScriptedReplica>("b");
  group.AddReplica("a", "addr-a", a);
  group.AddReplica("b", "addr-b", b);
  group.Submit(Plan(5), results.Sink());
  group.Submit(Plan(6), results.Sink());
  group.AddReplica("c", "addr-c", std::make_shared<ScriptedReplica>("c"));  // after both
  EXPECT_TRUE(group.Departures().empty());
  group.RemoveReplica("c");
  EXPECT_TRUE(group.Departures().empty()) << "c was sent no plan";
  group.RemoveReplica("b");
  std::vector<DepartedReplica> left = group.Departures();
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0].context_address, "addr-b");
  EXPECT_EQ(left[0].through_step, 6u);
  for (ScriptedReplica* r : {a.get(), b.get()}) {
    r->Answer(Tokens({5}));
    r->Answer(Tokens({6}));
  }
  ASSERT_EQ(results.size(), 2u);
  // b back at its address: its later steps are not given up.
  group.AddReplica("b", "addr-b", std::make_shared<ScriptedReplica>("b"));
  EXPECT_TRUE(group.Departures().empty());
  for (size_t i = 0; i <= RotationGroup::kMaxDepartures; ++i) {
    const std::string name = "r" + std::to_string(i);
    group.AddReplica(name, "addr-" + name, std::make_shared<ScriptedReplica>(name));
  }
  group.Submit(Plan(7), results.Sink());
  for (size_t i = 0; i <= RotationGroup::kMaxDepartures; ++i) {
    group.RemoveReplica("r" + std::to_string(i));
  }
  left = group.Departures();
  ASSERT_EQ(left.size(), RotationGroup::kMaxDepartures);
  EXPECT_EQ(left.front().context_address, "addr-r1") << "the oldest goes first";
  EXPECT_EQ(left.back().through_step, 7u);
}

// A replica's executor that left the group goes to the retire function from wherever its
// last copy is let go (the caller RemoveReplica returned it to, a thread of its own here),
// never before; one still in the group when the group is destroyed is destroyed there.
TEST(RotationGroupTest, AnExecutorThatLeftGoesToTheRetireFunctionWhereItsLastCopyGoes) {
  std::mutex mu;
  std::vector<std::shared_ptr<StepExecutor>> retired;  // guarded by mu
  std::vector<std::thread::id> retired_on;             // guarded by mu
  std::weak_ptr<StepExecutor> b_alive, c_alive;
  {
    RotationGroup group(/*batches=*/3, kLayers);
    group.SetRetire([&](std::shared_ptr<StepExecutor> executor) -> std::shared_ptr<StepExecutor> {
      std::lock_guard<std::mutex> lock(mu);
      retired.push_back(std::move(executor));
      retired_on.push_back(std::this_thread::get_id());
      return nullptr;
    });
    {
      auto b = std::make_shared<ScriptedReplica>("b");
      b_alive = b;
      group.AddReplica("b", "addr-b", std::move(b));
      auto c = std::make_shared<ScriptedReplica>("c");
      c_alive = c;
      group.AddReplica("c", "addr-c", std::move(c));
    }
    std::shared_ptr<StepExecutor> removed = group.RemoveReplica("b");
    ASSERT_NE(removed, nullptr);
    EXPECT_EQ(removed->name(), "b");
    {
      std::lock_guard<std::mutex> lock(mu);
      EXPECT_TRUE(retired.empty()) << "retired while the caller still holds it";
    }
    std::thread dropper([&removed] { removed.reset(); });
    const std::thread::id dropper_id = dropper.get_id();
    dropper.join();
    {
      std::lock_guard<std::mutex> lock(mu);
      ASSERT_EQ(retired.size(), 1u);
      EXPECT_EQ(retired[0]->name(), "b");
      EXPECT_EQ(retired_on[0], dropper_id);
    }
    EXPECT_FALSE(b_alive.expired()) << "the retire function holds it";
    // A retire function that gives the executor back: it is destroyed where it was let go.
    group.SetRetire([](std::shared_ptr<StepExecutor> executor) { return executor; });
    std::shared_ptr<StepExecutor> c_removed = group.RemoveReplica("c");
    ASSERT_NE(c_removed, nullptr);
    c_removed.reset();
    EXPECT_TRUE(c_alive.expired());
    // A replica still in the group when it is destroyed is destroyed with it.
    group.SetRetire([&](std::shared_ptr<StepExecutor> executor) -> std::shared_ptr<StepExecutor> {
      std::lock_guard<std::mutex> lock(mu);
      retired.push_back(std::move(executor));
      return nullptr;
    });
    auto d = std::make_shared<ScriptedReplica>("d");
    c_alive = d;
    group.AddReplica("d", "addr-d", std::move(d));
    std::lock_guard<std::mutex> lock(mu);
    retired.clear();  // b, retired above: gone while the group is whole
  }
  EXPECT_TRUE(c_alive.expired()) << "destroyed with the group";
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_TRUE(retired.empty()) << "the group's own replicas are not retired";
}

// The case the retire function is for: a Reachable() in progress (which may be trying to
// connect) holds the last copy of a replica that was removed meanwhile. The executor goes
// to the retire function when that call lets it go, on its thread, not before.
class BlockingReplica : public ScriptedReplica {
 public:
  using ScriptedReplica::ScriptedReplica;
  bool Reachable() override {
    std::unique_lock<std::mutex> lock(mu_);
    entered_ = true;
    cv_.notify_all();
    cv_.wait(lock, [&] { return released_; });
    return true;
  }
  void WaitEntered() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return entered_; });
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool entered_ = false, released_ = false;
};

TEST(RotationGroupTest, AReachableInProgressHoldingTheLastCopyRetiresItWhenItReturns) {
  std::mutex mu;
  std::vector<std::thread::id> retired_on;  // guarded by mu
  RotationGroup group(/*batches=*/3, kLayers);
  group.SetRetire([&](std::shared_ptr<StepExecutor> executor) -> std::shared_ptr<StepExecutor> {
    std::lock_guard<std::mutex> lock(mu);
    retired_on.push_back(std::this_thread::get_id());
    return executor;  // given back: destroyed where its last copy went
  });
  auto b = std::make_shared<BlockingReplica>("b");
  BlockingReplica* b_raw = b.get();
  std::weak_ptr<StepExecutor> b_alive = b;
  group.AddReplica("b", "addr-b", std::move(b));
  group.AddReplica("c", "addr-c", std::make_shared<ScriptedReplica>("c"));
  std::thread asker([&] { group.Reachable(); });
  const std::thread::id asker_id = asker.get_id();
  b_raw->WaitEntered();
  group.RemoveReplica("b").reset();  // the caller's copy goes at once
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_TRUE(retired_on.empty()) << "retired while Reachable() still held it";
  }
  EXPECT_FALSE(b_alive.expired());
  b_raw->Release();
  asker.join();
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(retired_on.size(), 1u);
  EXPECT_EQ(retired_on[0], asker_id);
  EXPECT_TRUE(b_alive.expired());
}

}  // namespace
}  // namespace strata
