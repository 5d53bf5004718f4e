// Malformed and truncated messages on both planes, sent to real node processes: garbage
// gRPC payloads, semantically bad step plans, bad data-plane frames over UCX, and junk on
// the data plane's bootstrap port. Each is rejected with an error; the nodes keep running
// and keep answering. Garbage is sent both with the deployment's credentials (it reaches
// the parsers) and without them (refused before it is parsed), and a fuzz loop checks that
// no malformed message changes a node's state.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <condition_variable>
#include <deque>
#include <future>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/protocol/attention_wire.h"
#include "common/protocol/step_frame.h"
#include "common/transport/frame.h"
#include "common/transport/transport.h"
#include "gtest/gtest.h"
#include "proto/control.grpc.pb.h"
#include "tests/common/deployment.h"
#include "tests/common/grpc_raw.h"
#include "tests/common/http_client.h"

namespace strata::testing {
namespace {

using transport::FrameHeader;
using transport::FrameKind;

std::shared_ptr<grpc::Channel> Channel(int port) {
  return grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
}

bool WaitForHealth(int port, bool memory) {
  for (int i = 0; i < 300; ++i) {
    grpc::ClientContext context;
    TestClusterAuth()->Attach(&context);
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(500)));
    control::HealthResponse response;
    grpc::Status status = memory ? control::MemoryNode::NewStub(Channel(port))
                                       ->Health(&context, control::HealthRequest(), &response)
                                 : control::ComputeNode::NewStub(Channel(port))
                                       ->Health(&context, control::HealthRequest(), &response);
    if (status.ok()) return true;
    absl::SleepFor(absl::Milliseconds(100));
  }
  return false;
}

// A unary call with raw bytes as the request.
grpc::Status RawUnary(int port, const std::string& method, const std::string& bytes,
                      bool authenticated = true) {
  grpc::GenericStub stub(Channel(port));
  grpc::ClientContext context;
  if (authenticated) TestClusterAuth()->Attach(&context);
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1), response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, method, grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) { done.set_value(s); });
  return done.get_future().get();
}

// Raw bytes as one message of a bidirectional stream: whether any reply came back.
bool RawStreamGotReply(int port, const std::string& method, const std::string& bytes,
                       bool authenticated = true) {
  return RawGrpcCall(port, method, bytes,
                     [&](grpc::ClientContext* c) {
                       if (authenticated) TestClusterAuth()->Attach(c);
                     })
      .got_reply;
}

// Configures the compute node whose control port is `control`, with the deployment's
// credentials (co-located when `config` names no memory nodes).
grpc::Status Configure(int control, const control::ComputeConfig& config) {
  grpc::ClientContext context;
  TestClusterAuth()->Attach(&context);
  control::ComputeConfigAck ack;
  return control::ComputeNode::NewStub(Channel(control))->Configure(&context, config, &ack);
}

std::string Garbage(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

class Collector : public transport::MessageHandler {
 public:
  std::span<uint8_t> Place(transport::PeerId, std::span<const uint8_t>, size_t) override {
    return {};
  }
  void Deliver(transport::PeerId, std::span<const uint8_t> header, std::span<const uint8_t> payload,
               absl::Status) override {
    FrameHeader h{};
    if (header.size() == sizeof(h)) std::memcpy(&h, header.data(), sizeof(h));
    std::lock_guard<std::mutex> lock(mu_);
    kinds_.push_back(h.kind);
    steps_.push_back(h.step_id);
    payloads_.emplace_back(payload.begin(), payload.end());
    cv_.notify_all();
  }
  // The next frame's kind (0: none came within 20 s); its payload into `payload` and its
  // header's step id into `step_id` if given.
  uint16_t Next(std::string* payload = nullptr, uint64_t* step_id = nullptr) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, absl::ToChronoNanoseconds(absl::Seconds(20)),
                      [&] { return !kinds_.empty(); })) {
      return 0;
    }
    const uint16_t k = kinds_.front();
    kinds_.pop_front();
    if (step_id != nullptr) *step_id = steps_.front();
    steps_.pop_front();
    if (payload != nullptr) *payload = std::move(payloads_.front());
    payloads_.pop_front();
    return k;
  }
  // The next frame as a step result, opened with `seal` if given (a result with status
  // DataLoss if it is none, or does not open).
  control::StepResult NextResult(FrameSeal* seal = nullptr) {
    std::string payload;
    control::StepResult r;
    uint64_t step_id = 0;
    const bool result = Next(&payload, &step_id) == static_cast<uint16_t>(FrameKind::kResult);
    if (result && seal != nullptr) {
      auto opened =
          seal->Open(FrameKind::kResult, step_id,
                     std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(payload.data()),
                                              payload.size()));
      payload = opened.ok() ? *opened : std::string();
    }
    if (!result || !r.ParseFromString(payload)) {
      r.mutable_status()->set_code(static_cast<int>(absl::StatusCode::kDataLoss));
      r.mutable_status()->set_message("no step result frame");
    }
    return r;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<uint16_t> kinds_;
  std::deque<uint64_t> steps_;
  std::deque<std::string> payloads_;
};

TEST(MalformedTest, MemoryNodeRejectsBadControlAndDataMessages) {
  const std::string root = RunfilesRoot();
  const int control = FreePort(), data = FreePort();
  // No scheduler answers at the given address: the node keeps trying to register, which
  // does not stop it from serving its own RPCs.
  const pid_t pid = SpawnProcess(
      {root + "/memory_node/memory_node", absl::StrCat("--scheduler=127.0.0.1:", FreePort()),
       absl::StrCat("--port=", control), absl::StrCat("--data_address=127.0.0.1:", data),
       "--ucx_tls=tcp", "--ucx_net_devices=lo", "--kv_budget_mib=16", "--threads=1",
       "--prefault_kv=false", ClusterSecretFlag()},
      {"OMP_NUM_THREADS=1"});
  ASSERT_TRUE(WaitForHealth(control, true));

  // Control plane: garbage and truncated protos, with and without credentials. (Without,
  // gRPC's parse of the request fails before the handler's credential check runs.)
  EXPECT_FALSE(RawUnary(control, "/strata.control.MemoryNode/Configure", Garbage(300, 1)).ok());
  EXPECT_FALSE(
      RawUnary(control, "/strata.control.MemoryNode/Configure", Garbage(300, 1), false).ok());
  control::MemoryConfig config;
  config.set_epoch(5);
  config.mutable_model()->set_num_layers(2);
  config.mutable_model()->set_num_heads(4);
  config.mutable_model()->set_num_kv_heads(2);
  config.mutable_model()->set_head_dim(64);
  config.mutable_model()->set_kv_dtype("bf16");
  config.set_num_slots(100);
  const std::string serialized = config.SerializeAsString();
  EXPECT_FALSE(RawUnary(control, "/strata.control.MemoryNode/Configure",
                        serialized.substr(0, serialized.size() - 3))
                   .ok());
  // A well-formed but unusable configuration is refused too.
  {
    control::MemoryConfig bad = config;
    bad.mutable_model()->set_num_kv_heads(3);
    grpc::ClientContext context;
    TestClusterAuth()->Attach(&context);
    control::MemoryConfigAck ack;
    EXPECT_FALSE(
        control::MemoryNode::NewStub(Channel(control))->Configure(&context, bad, &ack).ok());
  }
  // A good one works.
  {
    grpc::ClientContext context;
    TestClusterAuth()->Attach(&context);
    control::MemoryConfigAck ack;
    ASSERT_TRUE(
        control::MemoryNode::NewStub(Channel(control))->Configure(&context, config, &ack).ok());
    EXPECT_EQ(ack.num_slots(), 100u);
  }
  // Junk on the data plane's bootstrap port, and a connection that sends nothing.
  for (int i = 0; i < 3; ++i) {
    const std::string reply = RawExchange(data, Garbage(64 + 500 * i, 10 + i), /*timeout_s=*/3);
    EXPECT_TRUE(reply.empty());
  }
  // Bad frames over a real UCX connection.
  transport::TransportConfig tc;
  tc.ucx_options = {{"TLS", "tcp"}, {"NET_DEVICES", "lo"}};
  tc.auth_key = TestClusterAuth()->data_plane_key();
  auto client = transport::Transport::Create(tc);
  ASSERT_TRUE(client.ok());
  Collector collector;
  (*client)->SetHandler(transport::kFrameTag, &collector);
  auto peer = (*client)->Connect(absl::StrCat("127.0.0.1:", data));
  ASSERT_TRUE(peer.ok()) << peer.status();
  auto send = [&](const FrameHeader& h, const std::string& payload) {
    const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(payload.data()),
                                         payload.size());
    ASSERT_TRUE(transport::SendAndWait(**client, *peer, transport::kFrameTag, transport::AsBytes(h),
                                       {bytes}, absl::Seconds(10))
                    .ok());
  };
  const uint16_t error = static_cast<uint16_t>(FrameKind::kError);
  FrameHeader step;
  step.kind = static_cast<uint16_t>(FrameKind::kStep);
  step.step_id = 1;
  step.epoch = 5;
  const std::string junk = Garbage(200, 3);
  step.payload_bytes = junk.size();
  step.checksum = transport::PayloadChecksum(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(junk.data()), junk.size()));
  send(step, junk);
  EXPECT_EQ(collector.Next(), error) << "garbage descriptor";
  step.checksum ^= 0xFF;
  send(step, junk);
  EXPECT_EQ(collector.Next(), error) << "bad checksum";
  FrameHeader truncated = step;
  truncated.payload_bytes = 1000;
  send(truncated, junk);
  EXPECT_EQ(collector.Next(), error) << "truncated";
  // A valid step still works afterwards.
  StepShare share;
  share.step_id = 2;
  share.epoch = 5;
  share.pool = PoolIndex(0);
  share.num_layers = 2;
  share.plan.assignments.push_back({SequenceId(9), PoolIndex(0), 0, {1, 2, 3}});
  for (int p = 0; p < 3; ++p) share.plan.rows.push_back({SequenceId(9), PoolIndex(0), p, -1});
  share.minibatch_rows = {3};
  const std::string body = EncodeStepShare(share);
  step.step_id = 2;
  step.payload_bytes = body.size();
  step.checksum = transport::PayloadChecksum(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(body.data()), body.size()));
  send(step, body);
  const MinibatchLayout m = LayoutMinibatches(share, {2, 4, 2, 64})[0];
  const std::string rows(m.request_bytes(), '\0');
  FrameHeader layer;
  layer.kind = static_cast<uint16_t>(FrameKind::kLayer);
  layer.step_id = 2;
  layer.epoch = 5;
  layer.rows = 3;
  layer.payload_bytes = rows.size();
  layer.checksum = transport::PayloadChecksum(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(rows.data()), rows.size()));
  send(layer, rows);
  EXPECT_EQ(collector.Next(), static_cast<uint16_t>(FrameKind::kLayerResult));
  // A layer frame whose claim no row fills (80 MiB for one row): refused for that, before
  // its payload is received (past what the node holds a copy of), and the node goes on.
  {
    const std::string giant(size_t{80} << 20, '\1');
    FrameHeader claim = layer;
    claim.step_id = 3;
    claim.rows = 1;
    claim.payload_bytes = giant.size();
    claim.checksum = 0;
    send(claim, giant);
    std::string text;
    EXPECT_EQ(collector.Next(&text), error);
    EXPECT_NE(text.find("its rows fill"), std::string::npos) << text;
    send(layer, rows);  // step 2's layer again: the node serves
    EXPECT_EQ(collector.Next(), static_cast<uint16_t>(FrameKind::kLayerResult));
  }
  client->reset();

  // Fuzz, with credentials: random and mutated Configure payloads and bootstrap messages.
  // None may crash the node or change its configuration (100 slots) unless it parsed into a
  // configuration the node accepted.
  std::mt19937 rng(42);
  int accepted = 0;
  for (int i = 0; i < 150; ++i) {
    std::string payload = i % 2 == 0 ? Garbage(rng() % 2000, rng()) : serialized;
    if (i % 2 == 1) {
      for (int flips = 1 + rng() % 8; flips > 0; --flips)
        payload[rng() % payload.size()] ^= 1 << (rng() % 8);
      payload.resize(rng() % (payload.size() + 1));
    }
    accepted += RawUnary(control, "/strata.control.MemoryNode/Configure", payload).ok();
  }
  for (int i = 0; i < 20; ++i) {
    std::string junk(4, '\0');
    const uint32_t magic = 0x53545242;  // the bootstrap's, so the junk gets past the first check
    std::memcpy(junk.data(), &magic, 4);
    junk += Garbage(rng() % 200, rng());
    RawExchange(data, junk, /*timeout_s=*/2);
  }
  {
    grpc::ClientContext context;
    TestClusterAuth()->Attach(&context);
    control::HealthResponse health;
    ASSERT_TRUE(control::MemoryNode::NewStub(Channel(control))
                    ->Health(&context, control::HealthRequest(), &health)
                    .ok());
    if (accepted == 0) EXPECT_EQ(health.status().kv_slots_total(), 100u);
  }

  // Still alive and answering.
  EXPECT_EQ(kill(pid, 0), 0);
  EXPECT_TRUE(WaitForHealth(control, true));
  StopProcess(pid);
}

TEST(MalformedTest, ComputeNodeRejectsBadPlansAndGarbage) {
  auto model = TestModel("tiny");
  ASSERT_TRUE(model.ok()) << model.status();
  const std::string root = RunfilesRoot();
  const int control = FreePort();
  const pid_t pid = SpawnProcess(
      {root + "/compute_node/compute_node", "--model=" + *model,
       absl::StrCat("--scheduler=127.0.0.1:", FreePort()), absl::StrCat("--port=", control),
       "--threads=1", "--kv_budget_mib=16", "--prefault_kv=false", ClusterSecretFlag()},
      {"OMP_NUM_THREADS=1"});
  ASSERT_TRUE(WaitForHealth(control, false));
  EXPECT_FALSE(RawUnary(control, "/strata.control.ComputeNode/Configure", Garbage(100, 4)).ok());
  EXPECT_FALSE(
      RawUnary(control, "/strata.control.ComputeNode/Configure", Garbage(100, 4), false).ok());
  // A plan that does not parse ends the stream without being run.
  EXPECT_FALSE(RawStreamGotReply(control, "/strata.control.ComputeNode/RunSteps", Garbage(400, 5)));
  EXPECT_FALSE(
      RawStreamGotReply(control, "/strata.control.ComputeNode/RunSteps", Garbage(400, 5), false));
  // Configure co-located, then send plans that parse but make no sense.
  control::ComputeConfig config;
  config.set_epoch(3);
  ASSERT_TRUE(Configure(control, config).ok());
  auto run = [&](const control::StepPlan& plan) {
    grpc::ClientContext context;
    TestClusterAuth()->Attach(&context);
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    auto stream = control::ComputeNode::NewStub(Channel(control))->RunSteps(&context);
    control::StepResult result;
    EXPECT_TRUE(stream->Write(plan));
    EXPECT_TRUE(stream->Read(&result));
    stream->WritesDone();
    stream->Finish();
    return result;
  };
  control::StepPlan plan;
  plan.set_step_id(1);
  plan.set_epoch(3);
  auto* chunk = plan.add_chunks();
  chunk->set_request_id(77);  // no setup
  chunk->add_tokens(5);
  EXPECT_NE(run(plan).status().code(), 0);
  plan.mutable_chunks(0)->set_request_id(1);
  auto* setup = plan.add_setups();
  setup->set_request_id(1);
  setup->set_prompt_len(1);
  auto* assign = plan.add_assignments();
  assign->set_request_id(1);
  assign->add_slots(0);
  plan.mutable_chunks(0)->set_tokens(0, 1 << 30);  // outside the vocabulary
  EXPECT_NE(run(plan).status().code(), 0);
  plan.mutable_chunks(0)->set_tokens(0, 5);
  plan.mutable_assignments(0)->set_slots(0, 1 << 30);  // outside the KV store
  EXPECT_NE(run(plan).status().code(), 0);
  plan.set_epoch(4);  // another scheduler's plan
  EXPECT_NE(run(plan).status().code(), 0);
  // Fuzz, with credentials: random and truncated Configure and RunSteps payloads. None may
  // crash the node or change its configuration, unless it parsed into one it accepted.
  std::mt19937 rng(7);
  const std::string good_config = config.SerializeAsString();
  int accepted = 0;
  for (int i = 0; i < 100; ++i) {
    std::string payload = Garbage(rng() % 1500, rng());
    if (i % 3 == 0) payload = good_config.substr(0, rng() % (good_config.size() + 1)) + payload;
    accepted += RawUnary(control, "/strata.control.ComputeNode/Configure", payload).ok();
    if (i % 10 == 0) {
      RawStreamGotReply(control, "/strata.control.ComputeNode/RunSteps", payload);
    }
  }
  if (accepted > 0) ASSERT_TRUE(Configure(control, config).ok());
  // A sound plan still runs.
  plan.set_epoch(3);
  plan.mutable_assignments(0)->set_slots(0, 0);
  plan.mutable_chunks(0)->add_samples()->set_request_id(1);
  const control::StepResult ok = run(plan);
  EXPECT_EQ(ok.status().code(), 0) << ok.status().message();
  EXPECT_EQ(ok.tokens_size(), 1);
  EXPECT_EQ(kill(pid, 0), 0);
  EXPECT_TRUE(WaitForHealth(control, false));
  StopProcess(pid);
}

// The compute node's step channel (plans over the data plane): junk on its bootstrap port, a
// client without the deployment's key, a plan that is not sealed, frames that are not plans,
// that fail their checksum or do not parse, plans that make no sense, and a fuzz loop. Each
// frame is answered with an error result in its turn; the node keeps running, and a sound
// plan still runs.
TEST(MalformedTest, ComputeNodeStepChannelRejectsBadFramesAndGarbage) {
  auto model = TestModel("tiny");
  ASSERT_TRUE(model.ok()) << model.status();
  const std::string root = RunfilesRoot();
  const int control = FreePort(), steps = FreePort();
  const pid_t pid = SpawnProcess(
      {root + "/compute_node/compute_node", "--model=" + *model,
       absl::StrCat("--scheduler=127.0.0.1:", FreePort()), absl::StrCat("--port=", control),
       absl::StrCat("--step_address=127.0.0.1:", steps), "--ucx_net_devices=lo", "--threads=1",
       "--kv_budget_mib=16", "--prefault_kv=false", ClusterSecretFlag()},
      {"OMP_NUM_THREADS=1"});
  ASSERT_TRUE(WaitForHealth(control, false));
  control::ComputeConfig config;
  config.set_epoch(3);
  ASSERT_TRUE(Configure(control, config).ok());
  // Junk on the bootstrap port.
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(RawExchange(steps, Garbage(64 + 500 * i, 20 + i), /*timeout_s=*/3).empty());
  }
  transport::TransportConfig tc;
  tc.ucx_options = {{"TLS", "tcp"}, {"NET_DEVICES", "lo"}};
  // Without the key: no connection.
  {
    transport::TransportConfig stranger = tc;
    stranger.auth_key = "fedcba9876543210fedcba9876543210";
    stranger.connect_timeout = absl::Seconds(5);
    auto client = transport::Transport::Create(stranger);
    ASSERT_TRUE(client.ok());
    EXPECT_FALSE((*client)->Connect(absl::StrCat("127.0.0.1:", steps)).ok());
  }
  tc.auth_key = TestClusterAuth()->data_plane_key();
  auto client = transport::Transport::Create(tc);
  ASSERT_TRUE(client.ok());
  Collector collector;
  (*client)->SetHandler(transport::kFrameTag, &collector);
  auto peer = (*client)->Connect(absl::StrCat("127.0.0.1:", steps));
  ASSERT_TRUE(peer.ok()) << peer.status();
  // The deployment has a secret, so the node takes only sealed plans (step_frame.h): this
  // connection's seal seals what the test sends as a scheduler would (`sealed`), and opens
  // the node's answers.
  auto seal = std::make_shared<FrameSeal>(tc.auth_key, (*client)->PeerSecret(*peer));
  auto send = [&](FrameHeader h, const std::string& payload, bool sealed,
                  bool fix_checksum = true) {
    std::string bytes = payload;
    if (sealed) {
      auto s = seal->Seal(FrameKind::kPlan, h.step_id, payload);
      ASSERT_TRUE(s.ok()) << s.status();
      bytes = *s;
    }
    const std::span<const uint8_t> span(reinterpret_cast<const uint8_t*>(bytes.data()),
                                        bytes.size());
    h.payload_bytes = bytes.size();
    if (fix_checksum) h.checksum = transport::PayloadChecksum(span);
    ASSERT_TRUE(transport::SendAndWait(**client, *peer, transport::kFrameTag, transport::AsBytes(h),
                                       {span}, absl::Seconds(10))
                    .ok());
  };
  control::StepPlan plan;
  plan.set_step_id(2);
  plan.set_epoch(3);
  auto* chunk = plan.add_chunks();
  chunk->set_request_id(1);
  chunk->add_tokens(5);
  chunk->add_samples()->set_request_id(1);
  auto* setup = plan.add_setups();
  setup->set_request_id(1);
  setup->set_prompt_len(1);
  plan.add_assignments()->set_request_id(1);
  plan.mutable_assignments(0)->add_slots(0);
  FrameHeader header;
  header.kind = static_cast<uint16_t>(FrameKind::kPlan);
  header.step_id = 2;
  // A sound plan that is not sealed: refused.
  send(header, plan.SerializeAsString(), /*sealed=*/false);
  control::StepResult r = collector.NextResult(seal.get());
  EXPECT_EQ(r.step_id(), 2u);
  EXPECT_EQ(r.status().code(), static_cast<int>(absl::StatusCode::kPermissionDenied))
      << r.status().message();
  header.step_id = 1;
  const std::string junk = Garbage(300, 6);
  send(header, junk, /*sealed=*/true);  // sealed, but not a StepPlan
  r = collector.NextResult(seal.get());
  EXPECT_EQ(r.step_id(), 1u);
  EXPECT_EQ(r.status().code(), static_cast<int>(absl::StatusCode::kInvalidArgument))
      << r.status().message();
  header.step_id = 2;
  FrameHeader corrupt = header;
  corrupt.checksum = 12345;
  // Sealed as a scheduler would, and refused before the seal is looked at: its number is
  // lost, which costs only this frame.
  send(corrupt, plan.SerializeAsString(), /*sealed=*/true, /*fix_checksum=*/false);
  r = collector.NextResult(seal.get());
  EXPECT_EQ(r.step_id(), 2u);
  EXPECT_EQ(r.status().code(), static_cast<int>(absl::StatusCode::kDataLoss));
  FrameHeader layer = header;
  layer.kind = static_cast<uint16_t>(FrameKind::kLayer);
  send(layer, plan.SerializeAsString(), /*sealed=*/false);
  r = collector.NextResult(seal.get());
  EXPECT_EQ(r.step_id(), 2u);
  EXPECT_EQ(r.status().code(), static_cast<int>(absl::StatusCode::kInvalidArgument))
      << "a layer frame was taken for a plan: " << r.status().message();
  // A plan that parses but makes no sense: another scheduler's, then a slot outside the KV.
  control::StepPlan stale = plan;
  stale.set_epoch(4);
  send(header, stale.SerializeAsString(), /*sealed=*/true);
  r = collector.NextResult(seal.get());
  EXPECT_EQ(r.step_id(), 2u);
  EXPECT_NE(r.status().code(), 0);
  control::StepPlan outside = plan;
  outside.mutable_assignments(0)->set_slots(0, 1 << 30);
  send(header, outside.SerializeAsString(), /*sealed=*/true);
  r = collector.NextResult(seal.get());
  EXPECT_EQ(r.step_id(), 2u);
  EXPECT_NE(r.status().code(), 0);
  EXPECT_NE(r.status().message(), "no step result frame");
  // Fuzz: random and truncated plans under valid headers, sealed; and random bytes that
  // are not sealed. Each gets one answer.
  std::mt19937 rng(11);
  const std::string good = plan.SerializeAsString();
  for (int i = 0; i < 60; ++i) {
    std::string payload = Garbage(rng() % 800, rng());
    if (i % 2 == 0) payload = good.substr(0, rng() % (good.size() + 1)) + payload;
    header.step_id = 100 + i;
    send(header, payload, /*sealed=*/i % 3 != 0);
    const control::StepResult fuzzed = collector.NextResult(seal.get());
    EXPECT_NE(fuzzed.status().message(), "no step result frame") << "fuzz frame " << i;
    EXPECT_EQ(fuzzed.step_id(), static_cast<uint64_t>(100 + i)) << "fuzz frame " << i;
    // Each carries another frame's step id than the plan inside it, if any parses.
    EXPECT_NE(fuzzed.status().code(), 0) << "fuzz frame " << i;
  }
  // A sound plan still runs, and samples one token.
  header.step_id = 2;
  send(header, good, /*sealed=*/true);
  r = collector.NextResult(seal.get());
  EXPECT_EQ(r.status().code(), 0) << r.status().message();
  EXPECT_EQ(r.tokens_size(), 1);
  EXPECT_EQ(kill(pid, 0), 0);
  EXPECT_TRUE(WaitForHealth(control, false));
  StopProcess(pid);
}

}  // namespace
}  // namespace strata::testing
