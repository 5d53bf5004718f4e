// The step channel end to end: DataPlaneExecutor (the scheduler's side) against a real
// StepChannel (the compute node's side) over the in-process transport and UCX over tcp.
// The node's compute is a stand-in that answers each plan with tokens computed from the
// plan's contents (so a plan that arrived changed would be seen), and can hold a plan until
// its session is aborted (a hung node). What is under test is the carrier: order, one result
// per plan, failures, deadlines, malformed frames; scheduler_test checks real outputs over
// it.
#include "server/data_plane_executor.h"

#include <sched.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <numeric>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/protocol/step_frame.h"
#include "common/protocol/step_proto.h"
#include "common/transport/frame.h"
#include "compute_node/step_channel.h"
#include "gtest/gtest.h"
#include "proto/control.pb.h"
#include "server/testing/step_results.h"

namespace strata {
namespace {

using transport::FrameHeader;
using transport::FrameKind;

const std::string kKey = "0123456789abcdef0123456789abcdef";

struct Carrier {
  std::string name;
  transport::TransportConfig config;
};

std::vector<Carrier> Carriers() {
  transport::TransportConfig inproc;
  inproc.backend = transport::Backend::kInproc;
  transport::TransportConfig tcp;
  tcp.ucx_options = {{"TLS", "tcp"}, {"NET_DEVICES", "lo"}};
  tcp.error_mode = transport::ErrorMode::kPeer;
  tcp.connect_timeout = absl::Seconds(5);
  tcp.auth_key = kKey;
  // With a deployment key every frame is sealed (FrameSeal): over UCX always, and over the
  // in-process transport for this carrier.
  transport::TransportConfig inproc_sealed = inproc;
  inproc_sealed.auth_key = kKey;
  return {{"inproc", inproc}, {"inproc_sealed", inproc_sealed}, {"ucx_tcp", tcp}};  // tcp last
}

// What the stand-in node answers for a chunk: a function of every token in it.
int32_t Digest(const SequenceChunk& c, uint64_t step_id) {
  int64_t h = static_cast<int64_t>(step_id);
  for (int32_t t : c.tokens) h = h * 31 + t;
  return static_cast<int32_t>(h & 0x7fffffff);
}

// The compute stand-in: runs plans from a session's queue in order. While `hold` is set, it
// keeps the plan it took until the session is aborted, then answers it Cancelled.
class Node {
 public:
  // `compute_policy`: the sessions run their plans as a compute node does
  // (OnOwnOpenMpThread): on a thread of their own, SCHED_OTHER whatever the thread that
  // started the session was. `busy`: after answering each plan, a
  // session's thread keeps its core that long (a step's computation) before it takes the
  // next.
  Node(const transport::TransportConfig& config, const std::string& address,
       absl::Duration plan_spin = StepChannelOptions().plan_spin, bool compute_policy = false,
       absl::Duration busy = absl::ZeroDuration())
      : compute_policy_(compute_policy), busy_(busy) {
    StepChannelOptions o;
    o.transport = config;
    o.listen_address = address;
    o.plan_spin = plan_spin;
    o.run = [this](PlanQueue& queue) { Run(queue); };
    auto channel = StepChannel::Create(std::move(o));
    EXPECT_TRUE(channel.ok()) << channel.status();
    if (channel.ok()) channel_ = std::move(*channel);
  }
  ~Node() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      dying_ = true;
    }
    cv_.notify_all();
    channel_.reset();
  }
  StepChannel& channel() { return *channel_; }
  void set_hold(bool hold) { hold_.store(hold); }
  int held() const { return held_.load(); }

 private:
  void Run(PlanQueue& queue) {
    if (compute_policy_) {
      std::thread([&] {
        const sched_param param{};
        EXPECT_EQ(sched_setscheduler(0, SCHED_OTHER, &param), 0);
        Serve(queue);
      }).join();
    } else {
      Serve(queue);
    }
  }

  void Serve(PlanQueue& queue) {
    while (auto q = queue.Pop(/*wait=*/true)) {
      if (q->answer) {
        q->done(std::move(*q->answer));
        continue;
      }
      StepResult r;
      r.step_id = q->plan.step_id;
      if (hold_.load()) {
        ++held_;
        std::unique_lock<std::mutex> lock(mu_);
        while (!queue.aborted() && !dying_) {
          cv_.wait_for(lock, std::chrono::milliseconds(5));
        }
        r.status = absl::CancelledError("held until the session ended");
        lock.unlock();
        q->done(std::move(r));
        continue;
      }
      for (const SequenceChunk& c : q->plan.chunks) {
        SampledToken t;
        t.request_id = c.request_id;
        t.token = Digest(c, q->plan.step_id);
        r.tokens.push_back(t);
      }
      q->done(std::move(r));
      for (const absl::Time until = absl::Now() + busy_; absl::Now() < until;) {
      }
    }
  }

  const bool compute_policy_ = false;
  const absl::Duration busy_;
  std::unique_ptr<StepChannel> channel_;
  std::atomic<bool> hold_{false};
  std::atomic<int> held_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool dying_ = false;
};

std::shared_ptr<const StepPlan> Plan(uint64_t step_id, int chunks) {
  auto plan = std::make_shared<StepPlan>();
  plan->step_id = step_id;
  for (int i = 0; i < chunks; ++i) {
    SequenceChunk c;
    c.request_id = SequenceId(step_id * 10 + i);
    for (int t = 0; t < 3 + i; ++t) c.tokens.push_back(static_cast<int32_t>(step_id + 7 * t + i));
    plan->chunks.push_back(std::move(c));
  }
  return plan;
}

using Results = testing::StepResults;

class DataPlaneExecutorTest : public ::testing::TestWithParam<Carrier> {
 protected:
  std::string ListenAddress() {
    static int instance = 0;
    return GetParam().config.backend == transport::Backend::kInproc
               ? absl::StrCat("step-channel-test-", ++instance)
               : "127.0.0.1:0";
  }
  std::unique_ptr<DataPlaneExecutor> Executor(const std::string& address,
                                              absl::Duration deadline = absl::Seconds(20)) {
    DataPlaneExecutorOptions o;
    o.name = "compute-0";
    o.address = address;
    o.step_deadline = deadline;
    o.transport = GetParam().config;
    auto executor = DataPlaneExecutor::Create(std::move(o));
    EXPECT_TRUE(executor.ok()) << executor.status();
    return executor.ok() ? std::move(*executor) : nullptr;
  }
};

TEST_P(DataPlaneExecutorTest, EveryPlanIsAnsweredOnceInOrderWithItsOwnTokens) {
  Node node(GetParam().config, ListenAddress());
  auto executor = Executor(node.channel().address());
  ASSERT_NE(executor, nullptr);
  Results results;
  constexpr int kPlans = 300;
  std::vector<std::shared_ptr<const StepPlan>> plans;
  for (int i = 0; i < kPlans; ++i) {
    plans.push_back(Plan(1000 + i, 1 + i % 4));
    executor->Submit(plans.back(), results.Sink());  // all in flight at once
  }
  ASSERT_TRUE(results.WaitFor(kPlans));
  const auto got = results.Take();
  ASSERT_EQ(got.size(), static_cast<size_t>(kPlans));
  for (int i = 0; i < kPlans; ++i) {
    ASSERT_TRUE(got[i].status.ok()) << got[i].status;
    EXPECT_EQ(got[i].step_id, plans[i]->step_id);
    ASSERT_EQ(got[i].tokens.size(), plans[i]->chunks.size());
    for (size_t c = 0; c < got[i].tokens.size(); ++c) {
      EXPECT_EQ(got[i].tokens[c].request_id, plans[i]->chunks[c].request_id);
      EXPECT_EQ(got[i].tokens[c].token, Digest(plans[i]->chunks[c], plans[i]->step_id));
    }
  }
  EXPECT_TRUE(executor->Reachable());
  EXPECT_EQ(executor->stats().connects, 1u);
  EXPECT_EQ(executor->stats().answered, static_cast<uint64_t>(kPlans));
  EXPECT_EQ(node.channel().stats().plans, static_cast<uint64_t>(kPlans));
  EXPECT_EQ(node.channel().stats().sessions, 1u);
}

// What the spin is for: on cores that the step's team holds, the node's transport thread,
// woken by a plan sent ahead, waits for a core, and the step thread that finishes its step
// can take the plan itself. Here every thread of the test shares one core; the node's
// transport thread is SCHED_IDLE (it runs only when nothing else wants the core), its step
// thread SCHED_OTHER and busy for 1 ms after each result (the next step's computation),
// during which the next plan arrives: each is sent as soon as the last result is back.
// With a spin, the step thread then receives the plans on its own thread
// (StepChannelStats::polled counts the frames a session's step thread received); with
// none, it sleeps and the transport thread receives every plan. The in-process backend
// has nothing to progress.
TEST_P(DataPlaneExecutorTest, AnIdleStepThreadTakesPlansOffTheChannelItselfWhileItSpins) {
  constexpr int kPlans = 40;
  cpu_set_t saved;
  ASSERT_EQ(sched_getaffinity(0, sizeof(saved), &saved), 0);
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(sched_getcpu(), &one);
  if (sched_setaffinity(0, sizeof(one), &one) != 0) GTEST_SKIP() << "cannot pin to one core";
  // Threads started from here inherit the one core; all go back to every core at the end.
  struct Unpin {
    cpu_set_t* saved;
    ~Unpin() { sched_setaffinity(0, sizeof(*saved), saved); }
  } unpin{&saved};
  for (const absl::Duration spin : {absl::Seconds(30), absl::ZeroDuration()}) {
    SCOPED_TRACE(absl::StrCat("plan_spin ", absl::FormatDuration(spin)));
    std::unique_ptr<Node> node;
    bool idle_allowed = false;
    std::thread idle([&] {  // the node's transport thread inherits SCHED_IDLE
      const sched_param param{};
      idle_allowed = sched_setscheduler(0, SCHED_IDLE, &param) == 0;
      if (!idle_allowed) return;
      node = std::make_unique<Node>(GetParam().config, ListenAddress(), spin,
                                    /*compute_policy=*/true, absl::Milliseconds(1));
    });
    idle.join();
    if (!idle_allowed) GTEST_SKIP() << "SCHED_IDLE is refused here";
    ASSERT_NE(node, nullptr);
    auto executor = Executor(node->channel().address());
    ASSERT_NE(executor, nullptr);
    Results results;
    for (int i = 0; i < kPlans; ++i) {
      auto plan = Plan(500 + i, 2);
      executor->Submit(plan, results.Sink());
      ASSERT_TRUE(results.WaitFor(i + 1));
      const StepResult got = results.Take().back();
      ASSERT_TRUE(got.status.ok()) << got.status;
      ASSERT_EQ(got.step_id, plan->step_id);
      EXPECT_EQ(got.tokens[1].token, Digest(plan->chunks[1], plan->step_id));
    }
    const uint64_t polled = node->channel().stats().polled;
    if (spin == absl::ZeroDuration()) {
      EXPECT_EQ(polled, 0u);
    } else if (GetParam().config.backend == transport::Backend::kUcx) {
      EXPECT_GE(polled, static_cast<uint64_t>(kPlans / 2));
      EXPECT_LE(polled, static_cast<uint64_t>(kPlans));
    }
    executor.reset();
    node.reset();
  }
}

// A node that takes plans and never answers; destroying it closes its connections as a
// process that dies does, with the plans unanswered.
class SilentNode : public transport::MessageHandler {
 public:
  SilentNode(const transport::TransportConfig& config, const std::string& address) {
    transport_ = std::move(*transport::Transport::Create(config));
    transport_->SetHandler(transport::kFrameTag, this);
    address_ = *transport_->Listen(address);
  }
  ~SilentNode() override { transport_.reset(); }
  const std::string& address() const { return address_; }
  int received() const { return received_.load(); }
  std::span<uint8_t> Place(transport::PeerId, std::span<const uint8_t>, size_t) override {
    return {};
  }
  void Deliver(transport::PeerId, std::span<const uint8_t>, std::span<const uint8_t>,
               absl::Status) override {
    ++received_;
  }

 private:
  std::atomic<int> received_{0};
  std::unique_ptr<transport::Transport> transport_;
  std::string address_;
};

// The node dies (its connection closes) with two plans unanswered: both fail at once, in
// order, as unreachable, without waiting for their deadline.
TEST_P(DataPlaneExecutorTest, ANodeThatDiesFailsItsUnansweredPlansAsUnreachable) {
  auto node = std::make_unique<SilentNode>(GetParam().config, ListenAddress());
  auto executor = Executor(node->address(), /*deadline=*/absl::Seconds(60));
  ASSERT_NE(executor, nullptr);
  Results results;
  executor->Submit(Plan(1, 1), results.Sink());
  executor->Submit(Plan(2, 2), results.Sink());
  for (int i = 0; i < 2000 && node->received() < 2; ++i) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_EQ(node->received(), 2);
  const absl::Time died = absl::Now();
  node.reset();
  ASSERT_TRUE(results.WaitFor(2)) << "a plan of the dead node was never answered";
  EXPECT_LT(absl::Now() - died, absl::Seconds(10)) << "the plans waited for their deadline";
  const auto got = results.Take();
  ASSERT_EQ(got.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(got[i].step_id, static_cast<uint64_t>(i + 1));
    EXPECT_EQ(got[i].status.code(), absl::StatusCode::kUnavailable) << got[i].status;
    EXPECT_TRUE(got[i].node_unreachable);
  }
  // The scheduler asks before it sends there again: unreachable while the node is gone (its
  // control channel may not know yet).
  EXPECT_FALSE(executor->Reachable());
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(executor->Reachable());
}

// The node stops (its channel closes its sessions, answering what it holds) with two plans
// in flight: both fail, in order; later plans fail while it is gone, and connect again once
// it is back at the same address.
TEST_P(DataPlaneExecutorTest, ANodeThatStopsFailsItsPlansInOrderAndLaterOnesReconnect) {
  const std::string listen = ListenAddress();
  auto node = std::make_unique<Node>(GetParam().config, listen);
  const std::string address = node->channel().address();
  auto executor = Executor(address);
  ASSERT_NE(executor, nullptr);
  Results results;
  executor->Submit(Plan(1, 1), results.Sink());
  ASSERT_TRUE(results.WaitFor(1));
  // Two plans in flight: the node holds the first, the second waits behind it.
  node->set_hold(true);
  executor->Submit(Plan(2, 2), results.Sink());
  executor->Submit(Plan(3, 1), results.Sink());
  for (int i = 0; i < 2000 && node->held() == 0; ++i) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_EQ(node->held(), 1);
  node.reset();  // the node stops with both in flight
  ASSERT_TRUE(results.WaitFor(3)) << "a plan of the dead node was never answered";
  auto got = results.Take();
  ASSERT_EQ(got.size(), 3u);
  EXPECT_TRUE(got[0].status.ok());
  EXPECT_EQ(got[1].step_id, 2u);
  EXPECT_EQ(got[2].step_id, 3u);
  EXPECT_FALSE(got[1].status.ok());
  EXPECT_FALSE(got[2].status.ok());
  // With the node gone, a plan fails (it cannot connect) rather than waiting.
  executor->Submit(Plan(4, 1), results.Sink());
  ASSERT_TRUE(results.WaitFor(4));
  got = results.Take();
  EXPECT_EQ(got[3].step_id, 4u);
  EXPECT_EQ(got[3].status.code(), absl::StatusCode::kUnavailable) << got[3].status;
  EXPECT_TRUE(got[3].node_unreachable);
  // The node comes back at the same address: the next plan connects again and runs.
  EXPECT_FALSE(executor->Reachable());
  Node back(GetParam().config,
            GetParam().config.backend == transport::Backend::kInproc ? listen : address);
  // Reachable again once a connection, which asking it starts, is up.
  bool reachable = false;
  for (int i = 0; i < 500 && !reachable; ++i) {
    reachable = executor->Reachable();
    if (!reachable) absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(reachable) << "the node came back, but the executor never said so";
  executor->Submit(Plan(5, 3), results.Sink());
  ASSERT_TRUE(results.WaitFor(5));
  got = results.Take();
  ASSERT_TRUE(got[4].status.ok()) << got[4].status;
  EXPECT_EQ(got[4].step_id, 5u);
  EXPECT_EQ(got[4].tokens.size(), 3u);
}

TEST_P(DataPlaneExecutorTest, AHungNodeMissesItsDeadlineAndTheNextPlanRunsOnANewConnection) {
  Node node(GetParam().config, ListenAddress());
  auto executor = Executor(node.channel().address(), absl::Milliseconds(300));
  ASSERT_NE(executor, nullptr);
  Results results;
  node.set_hold(true);
  const absl::Time start = absl::Now();
  executor->Submit(Plan(1, 1), results.Sink());
  executor->Submit(Plan(2, 1), results.Sink());
  ASSERT_TRUE(results.WaitFor(2, absl::Seconds(10))) << "the deadline never fired";
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(300));
  auto got = results.Take();
  EXPECT_EQ(got[0].status.code(), absl::StatusCode::kDeadlineExceeded) << got[0].status;
  EXPECT_EQ(got[1].status.code(), absl::StatusCode::kDeadlineExceeded) << got[1].status;
  EXPECT_FALSE(got[0].node_unreachable);
  // The executor dropped the connection, which aborted the node's session: the held plan
  // ends there, and a new plan goes over a new connection.
  node.set_hold(false);
  executor->Submit(Plan(3, 2), results.Sink());
  ASSERT_TRUE(results.WaitFor(3));
  got = results.Take();
  ASSERT_TRUE(got[2].status.ok()) << got[2].status;
  EXPECT_EQ(got[2].step_id, 3u);
  EXPECT_EQ(executor->stats().connects, 2u);
  EXPECT_EQ(node.channel().stats().sessions, 2u);
}

// A hung node's plans fail as soon as the control plane declares it dead (Abandon), long
// before their step deadline, as a lost node's: the node unreachable. The next plan goes
// over a new connection.
TEST_P(DataPlaneExecutorTest, AnAbandonedNodesPlansFailAtOnceAsUnreachable) {
  Node node(GetParam().config, ListenAddress());
  auto executor = Executor(node.channel().address(), absl::Seconds(60));
  ASSERT_NE(executor, nullptr);
  Results results;
  node.set_hold(true);
  executor->Submit(Plan(1, 1), results.Sink());
  executor->Submit(Plan(2, 1), results.Sink());
  // Both reached the node, which holds them.
  for (const absl::Time until = absl::Now() + absl::Seconds(10);
       node.channel().stats().plans < 2 && absl::Now() < until;) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(node.channel().stats().plans, 2u);
  executor->Abandon(absl::UnavailableError("compute node compute-0 was declared dead"));
  ASSERT_TRUE(results.WaitFor(2, absl::Seconds(10))) << "the plans waited for their deadline";
  auto got = results.Take();
  for (const StepResult& r : got) {
    EXPECT_TRUE(absl::IsUnavailable(r.status)) << r.status;
    EXPECT_TRUE(absl::StrContains(r.status.message(), "declared dead")) << r.status;
    EXPECT_TRUE(r.node_unreachable);
  }
  node.set_hold(false);
  executor->Submit(Plan(3, 2), results.Sink());
  ASSERT_TRUE(results.WaitFor(3));
  got = results.Take();
  ASSERT_TRUE(got[2].status.ok()) << got[2].status;
  EXPECT_EQ(executor->stats().connects, 2u);
}

// A raw client of the node's channel: sends frames as given, collects the result frames
// (opened with its connection's seal, where the deployment key asks for one).
class RawClient : public transport::MessageHandler {
 public:
  RawClient(const transport::TransportConfig& config, const std::string& address) {
    auto t = transport::Transport::Create(config);
    EXPECT_TRUE(t.ok());
    transport_ = std::move(*t);
    transport_->SetHandler(transport::kFrameTag, this);
    auto peer = transport_->Connect(address);
    EXPECT_TRUE(peer.ok()) << peer.status();
    peer_ = peer.ok() ? *peer : 0;
    seal_ = std::make_shared<FrameSeal>(config.auth_key, transport_->PeerSecret(peer_));
  }
  ~RawClient() override { transport_.reset(); }
  void Send(const FrameHeader& h, const std::string& payload) {
    const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(payload.data()),
                                         payload.size());
    ASSERT_TRUE(transport::SendAndWait(*transport_, peer_, transport::kFrameTag,
                                       transport::AsBytes(h), {bytes}, absl::Seconds(5))
                    .ok());
  }
  // A plan frame for `step_id` around `payload`, sealed as the executor would.
  void SendPlan(uint64_t step_id, const std::string& payload);
  // `payload` as the payload of step `step_id`'s plan frame: sealed where sealing is on.
  std::string Sealed(uint64_t step_id, const std::string& payload);
  const std::string& last_sealed() const { return last_sealed_; }
  bool sealing() const { return seal_->enabled(); }
  void SendRawHeader(std::span<const uint8_t> header) {
    ASSERT_TRUE(transport::SendAndWait(*transport_, peer_, transport::kFrameTag, header, {},
                                       absl::Seconds(5))
                    .ok());
  }
  std::vector<StepResult> WaitFor(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(20), [&] { return results_.size() >= n; });
    return results_;
  }
  std::span<uint8_t> Place(transport::PeerId, std::span<const uint8_t>, size_t) override {
    return {};
  }
  void Deliver(transport::PeerId, std::span<const uint8_t> header, std::span<const uint8_t> payload,
               absl::Status status) override {
    control::StepResult wire;
    uint64_t step_id = 0;
    const bool ok =
        ReadMessageFrame(header, payload, status, FrameKind::kResult, &wire, &step_id, seal_.get())
            .ok();
    std::lock_guard<std::mutex> lock(mu_);
    if (!ok) {
      ++bad_;
    } else {
      results_.push_back(FromProto(wire));
    }
    cv_.notify_all();
  }
  int bad() {
    std::lock_guard<std::mutex> lock(mu_);
    return bad_;
  }

 private:
  std::unique_ptr<transport::Transport> transport_;
  std::shared_ptr<FrameSeal> seal_;
  std::string last_sealed_;
  transport::PeerId peer_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<StepResult> results_;
  int bad_ = 0;
};

FrameHeader PlanHeader(uint64_t step_id, const std::string& payload) {
  FrameHeader h;
  h.kind = static_cast<uint16_t>(FrameKind::kPlan);
  h.step_id = step_id;
  h.payload_bytes = payload.size();
  h.checksum = transport::PayloadChecksum(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(payload.data()), payload.size()));
  return h;
}

std::string Serialized(const StepPlan& plan) {
  control::StepPlan wire;
  ToProto(plan, &wire);
  return wire.SerializeAsString();
}

std::string RawClient::Sealed(uint64_t step_id, const std::string& payload) {
  if (!seal_->enabled()) return payload;
  auto sealed = seal_->Seal(FrameKind::kPlan, step_id, payload);
  EXPECT_TRUE(sealed.ok()) << sealed.status();
  return last_sealed_ = sealed.value_or("");
}

void RawClient::SendPlan(uint64_t step_id, const std::string& payload) {
  const std::string bytes = Sealed(step_id, payload);
  Send(PlanHeader(step_id, bytes), bytes);
}

TEST_P(DataPlaneExecutorTest, MalformedFramesAreAnsweredInTurnAndTheChannelKeepsServing) {
  Node node(GetParam().config, ListenAddress());
  RawClient client(GetParam().config, node.channel().address());
  client.SendPlan(10, Serialized(*Plan(10, 2)));
  const std::string good = Serialized(*Plan(16, 2));
  // 1: a header of the wrong size.
  const uint8_t junk[7] = {1, 2, 3, 4, 5, 6, 7};
  client.SendRawHeader(junk);
  // 2: a frame of another kind. 2 and 3 are sealed as the executor would seal them, and
  // refused before their seals are looked at: their numbers are lost, which must cost the
  // connection only these two frames.
  const std::string other_bytes = client.Sealed(11, good);
  FrameHeader other = PlanHeader(11, other_bytes);
  other.kind = static_cast<uint16_t>(FrameKind::kLayer);
  client.Send(other, other_bytes);
  // 3: a checksum that does not match.
  const std::string corrupt_bytes = client.Sealed(12, good);
  FrameHeader corrupt = PlanHeader(12, corrupt_bytes);
  corrupt.checksum ^= 1;
  client.Send(corrupt, corrupt_bytes);
  // 4: a payload that is not a StepPlan (sealed where sealing is on).
  client.SendPlan(13, "\xff\xff\xff\xff not a proto");
  // 5: a valid StepPlan under another step's header.
  client.SendPlan(14, good);
  std::vector<uint64_t> want_ids = {10, 0, 11, 12, 13, 14};
  if (client.sealing()) {
    // 6: a good plan, not sealed.
    client.Send(PlanHeader(15, good), good);
    // 7: frame 5 again, sealed as it was: a replay.
    client.Send(PlanHeader(14, client.last_sealed()), client.last_sealed());
    want_ids.push_back(15);
    want_ids.push_back(14);
  }
  // Last: a good plan, after all of that.
  client.SendPlan(16, good);
  want_ids.push_back(16);
  const size_t n = want_ids.size();
  const auto got = client.WaitFor(n);
  ASSERT_EQ(got.size(), n);
  EXPECT_EQ(client.bad(), 0) << "answers that did not open or parse";
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(got[i].step_id, want_ids[i]) << "frame " << i;
    EXPECT_EQ(got[i].status.ok(), i == 0 || i == n - 1) << "frame " << i << ": " << got[i].status;
  }
  EXPECT_EQ(got[3].status.code(), absl::StatusCode::kDataLoss) << got[3].status;
  if (client.sealing()) {
    EXPECT_EQ(got[6].status.code(), absl::StatusCode::kPermissionDenied) << got[6].status;
    EXPECT_EQ(got[7].status.code(), absl::StatusCode::kPermissionDenied) << got[7].status;
  }
  EXPECT_EQ(got[n - 1].tokens.size(), 2u);
  EXPECT_EQ(node.channel().stats().refused, n - 2);
  EXPECT_EQ(node.channel().stats().plans, 2u);
}

// A node that answers wrongly: each plan's answer is the result of another step. The
// executor fails the plans it had sent, and does not hang.
class WrongNode : public transport::MessageHandler {
 public:
  WrongNode(const transport::TransportConfig& config, const std::string& address) {
    transport_ = std::move(*transport::Transport::Create(config));
    sender_ = transport_.get();
    transport_->SetHandler(transport::kFrameTag, this);
    address_ = *transport_->Listen(address);
  }
  ~WrongNode() override {
    closing_.store(true);  // no answers from here on
    // reset() nulls transport_ at once; a delivery in progress answers through sender_,
    // which stays valid until the transport's destructor has waited for it.
    transport_.reset();
  }
  const std::string& address() const { return address_; }
  std::span<uint8_t> Place(transport::PeerId, std::span<const uint8_t>, size_t) override {
    return {};
  }
  void Deliver(transport::PeerId from, std::span<const uint8_t> header, std::span<const uint8_t>,
               absl::Status) override {
    FrameHeader h;
    if (closing_.load() || !transport::ParseFrameHeader(header, &h).ok()) return;
    control::StepResult wire;
    wire.set_step_id(h.step_id + 1);
    SendMessageFrame(*sender_, from, FrameKind::kResult, h.step_id + 1, wire, {});
  }

 private:
  std::atomic<bool> closing_{false};
  std::unique_ptr<transport::Transport> transport_;
  transport::Transport* sender_ = nullptr;
  std::string address_;
};

TEST_P(DataPlaneExecutorTest, AResultForTheWrongStepBreaksTheConnectionAndFailsItsPlans) {
  WrongNode node(GetParam().config, ListenAddress());
  auto executor = Executor(node.address());
  ASSERT_NE(executor, nullptr);
  Results results;
  executor->Submit(Plan(1, 1), results.Sink());
  executor->Submit(Plan(2, 1), results.Sink());
  ASSERT_TRUE(results.WaitFor(2));
  const auto got = results.Take();
  EXPECT_EQ(got[0].step_id, 1u);
  EXPECT_EQ(got[1].step_id, 2u);
  EXPECT_EQ(got[0].status.code(), absl::StatusCode::kDataLoss) << got[0].status;
  EXPECT_EQ(got[1].status.code(), absl::StatusCode::kDataLoss) << got[1].status;
}

TEST_P(DataPlaneExecutorTest, PlansLeftAtShutdownCompleteWithAnError) {
  Node node(GetParam().config, ListenAddress());
  node.set_hold(true);
  Results results;
  {
    auto executor = Executor(node.channel().address());
    ASSERT_NE(executor, nullptr);
    executor->Submit(Plan(1, 1), results.Sink());
    executor->Submit(Plan(2, 1), results.Sink());
    for (int i = 0; i < 2000 && node.held() == 0; ++i) absl::SleepFor(absl::Milliseconds(1));
    ASSERT_EQ(node.held(), 1);
  }
  const auto got = results.Take();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_FALSE(got[0].status.ok());
  EXPECT_FALSE(got[1].status.ok());
  EXPECT_EQ(got[0].step_id, 1u);
  EXPECT_EQ(got[1].step_id, 2u);
}

// A sink that submits again while the executor shuts down (a scheduler resubmitting a failed
// step) still gets an answer for what it submitted.
TEST_P(DataPlaneExecutorTest, APlanSubmittedFromASinkDuringShutdownIsAnswered) {
  Node node(GetParam().config, ListenAddress());
  node.set_hold(true);
  Results results;
  auto executor = Executor(node.channel().address());
  ASSERT_NE(executor, nullptr);
  DataPlaneExecutor* raw = executor.get();
  std::atomic<int> resubmitted{0};
  StepResultSink collect = results.Sink();
  StepResultSink again = [&, raw, collect](StepResult r) {
    if (!r.status.ok() && resubmitted.fetch_add(1) == 0) raw->Submit(Plan(99, 1), collect);
    collect(std::move(r));
  };
  executor->Submit(Plan(1, 1), again);
  executor->Submit(Plan(2, 1), again);
  for (int i = 0; i < 2000 && node.held() == 0; ++i) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_EQ(node.held(), 1);
  executor.reset();
  const auto got = results.Take();
  ASSERT_EQ(got.size(), 3u);
  // In submission order: the resubmitted plan came after both others.
  EXPECT_EQ(got[0].step_id, 1u);
  EXPECT_EQ(got[1].step_id, 2u);
  EXPECT_EQ(got[2].step_id, 99u);
  for (const StepResult& r : got) EXPECT_FALSE(r.status.ok());
}

TEST_P(DataPlaneExecutorTest, ProbeSaysWhetherTheChannelCanBeReached) {
  Node node(GetParam().config, ListenAddress());
  auto reachable = Executor(node.channel().address());
  ASSERT_NE(reachable, nullptr);
  EXPECT_TRUE(reachable->Probe().ok());
  EXPECT_EQ(reachable->stats().connects, 1u);
  EXPECT_TRUE(reachable->Probe().ok());  // connected already: no second connection
  EXPECT_EQ(reachable->stats().connects, 1u);
  Results results;
  reachable->Submit(Plan(1, 2), results.Sink());
  ASSERT_TRUE(results.WaitFor(1));
  EXPECT_TRUE(results.Take()[0].status.ok());
  auto nobody =
      Executor(GetParam().config.backend == transport::Backend::kInproc ? "nobody-listens-here"
                                                                        : "127.0.0.1:1");
  ASSERT_NE(nobody, nullptr);
  EXPECT_FALSE(nobody->Probe().ok());
}

// A transport that cannot start fails Create with its reason, and nothing crashes.
TEST(DataPlaneExecutorCreateTest, ATransportThatCannotStartFailsCreate) {
  DataPlaneExecutorOptions o;
  o.name = "compute-0";
  o.address = "127.0.0.1:1";
  o.transport.ucx_options = {{"TLS", "no-such-transport"}};
  auto executor = DataPlaneExecutor::Create(std::move(o));
  EXPECT_FALSE(executor.ok());
}

TEST(DataPlaneExecutorAuthTest, AClientWithoutTheDeploymentsKeyCannotConnect) {
  const transport::TransportConfig tcp = Carriers().back().config;  // ucx_tcp
  Node node(tcp, "127.0.0.1:0");
  transport::TransportConfig stranger = tcp;
  stranger.auth_key = "fedcba9876543210fedcba9876543210";
  DataPlaneExecutorOptions o;
  o.name = "compute-0";
  o.address = node.channel().address();
  o.transport = stranger;
  auto executor = DataPlaneExecutor::Create(std::move(o));
  ASSERT_TRUE(executor.ok());
  Results results;
  (*executor)->Submit(Plan(1, 1), results.Sink());
  ASSERT_TRUE(results.WaitFor(1));
  const auto got = results.Take();
  EXPECT_EQ(got[0].status.code(), absl::StatusCode::kUnavailable) << got[0].status;
  EXPECT_EQ(node.channel().stats().plans, 0u);
}

INSTANTIATE_TEST_SUITE_P(Carriers, DataPlaneExecutorTest, ::testing::ValuesIn(Carriers()),
                         [](const ::testing::TestParamInfo<Carrier>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace strata
