// The memory server against a raw data-plane client: correct frames get the attention an
// independent engine computes; malformed, truncated, corrupted or out-of-order frames get
// an error frame and a counter, and the server keeps serving. (What bounds a peer's claims
// and held frames: memory_server_limits_test.cc.)
#include "memory_node/memory_server.h"

#include <thread>

#include "memory_node/testing/memory_server_fixture.h"

namespace strata {
namespace {

using namespace memory_server_testing;  // NOLINT: the fixture's client, frames and constants

TEST_P(MemoryServerTest, AnswersLayersWithTheEngineResult) {
  const int n = 70;
  const StepShare share = Share(1, n);
  SendStep(share);
  const AttentionDims dims{kLayers, kHeads, kKvHeads, kDim};
  const auto layouts = LayoutMinibatches(share, dims);
  // An independent engine given the same rows computes the reference.
  auto engine = ReferenceEngine();
  auto prepared = *engine->Prepare(share.plan);
  for (int layer = 0; layer < kLayers; ++layer) {
    for (size_t j = 0; j < layouts.size(); ++j) {
      const MinibatchLayout& m = layouts[j];
      const auto payload = RandomRows(m.request_bytes(), 100 * layer + j);
      client_->Send(LayerHeader(1, layer, j, m.end - m.begin), payload);
      const Reply reply = client_->Next();
      ASSERT_EQ(reply.header.kind, static_cast<uint16_t>(FrameKind::kLayerResult));
      EXPECT_EQ(reply.header.layer, static_cast<uint32_t>(layer));
      EXPECT_EQ(reply.header.minibatch, j);
      ASSERT_TRUE(transport::CheckFramePayload(reply.header, reply.payload, true).ok());
      EXPECT_EQ(reply.payload, Expected(*engine, prepared, layer, m, payload))
          << "layer " << layer << " mini-batch " << j;
    }
  }
  const MemoryServerStats stats = server_->stats();
  EXPECT_EQ(stats.layer_frames, 2u * layouts.size());
  EXPECT_EQ(stats.kv_positions, n);
  EXPECT_EQ(stats.malformed_frames, 0u);
}

// Configured with an f16 KV cache (the scheduler's --kv_cache_dtype=f16), the node takes
// layer frames whose k and v rows are f16 (q stays bf16) and answers with what an engine on
// an f16 store computes from the same rows; a frame of bf16 rows is refused, as an f16 one
// is by a bf16 node: its bits would be read as the other type.
TEST_P(MemoryServerTest, AnF16CacheTakesF16RowsAndAnswersWithTheEngineResult) {
  MemoryConfig config = Config();
  config.model.kv_dtype = "f16";
  ASSERT_TRUE(server_->Configure(config).ok());
  const int n = 21;
  const StepShare share = Share(1, n);
  SendStep(share);
  const AttentionDims dims{kLayers, kHeads, kKvHeads, kDim};
  const auto layouts = LayoutMinibatches(share, dims);
  AttentionEngineConfig reference_config;
  reference_config.store = {kLayers, kKvHeads, kDim, kernels::KvDType::kF16, 1000, false};
  reference_config.num_heads = kHeads;
  auto engine = *AttentionEngine::Create(reference_config);
  auto prepared = *engine->Prepare(share.plan);
  for (int layer = 0; layer < kLayers; ++layer) {
    for (size_t j = 0; j < layouts.size(); ++j) {
      const MinibatchLayout& m = layouts[j];
      // q in bf16, then k and v in f16.
      std::vector<uint8_t> payload = RandomRows(m.request_bytes(), 100 * layer + j);
      std::mt19937 rng(7 + layer);
      std::normal_distribution<float> normal;
      auto* kv = reinterpret_cast<uint16_t*>(payload.data() + m.q_bytes);
      for (size_t i = 0; i < 2 * m.kv_bytes / 2; ++i) kv[i] = FloatToF16(normal(rng));
      FrameHeader h = LayerHeader(1, layer, j, m.end - m.begin);
      h.dtype = static_cast<uint16_t>(transport::FrameDType::kF16);
      client_->Send(h, payload);
      const Reply reply = client_->Next();
      ASSERT_EQ(reply.header.kind, static_cast<uint16_t>(FrameKind::kLayerResult));
      EXPECT_EQ(reply.payload, Expected(*engine, prepared, layer, m, payload))
          << "layer " << layer << " mini-batch " << j;
    }
  }
  // bf16 rows at an f16 node, and f16 rows at a bf16 node.
  for (const char* kv_dtype : {"f16", "bf16"}) {
    config.model.kv_dtype = kv_dtype;
    ASSERT_TRUE(server_->Configure(config).ok());
    SendStep(Share(2, n));
    const MinibatchLayout& m = layouts[0];
    FrameHeader h = LayerHeader(2, 0, 0, m.end - m.begin);
    h.dtype = static_cast<uint16_t>(std::string(kv_dtype) == "f16" ? transport::FrameDType::kBF16
                                                                   : transport::FrameDType::kF16);
    client_->Send(h, RandomRows(m.request_bytes(), 3));
    const Reply r = client_->Next();
    EXPECT_EQ(r.header.kind, static_cast<uint16_t>(FrameKind::kError)) << kv_dtype;
    const absl::Status status = transport::ErrorFrameStatus(r.header, r.payload);
    EXPECT_NE(status.message().find("rows of dtype"), std::string::npos) << status;
  }
}

// Frames sent without waiting queue behind the one that runs and are answered in the
// order they came, each with the engine's result.
TEST_P(MemoryServerTest, FramesSentBackToBackAreAnsweredInOrder) {
  const int n = 70;
  const StepShare share = Share(1, n);
  SendStep(share);
  const AttentionDims dims{kLayers, kHeads, kKvHeads, kDim};
  const auto layouts = LayoutMinibatches(share, dims);
  ASSERT_GT(layouts.size(), 1u);
  auto engine = ReferenceEngine();
  auto prepared = *engine->Prepare(share.plan);
  std::vector<std::vector<uint8_t>> expected;
  for (int layer = 0; layer < kLayers; ++layer) {
    for (size_t j = 0; j < layouts.size(); ++j) {
      const MinibatchLayout& m = layouts[j];
      const auto payload = RandomRows(m.request_bytes(), 700 + 10 * layer + j);
      client_->Send(LayerHeader(1, layer, j, m.end - m.begin), payload);
      expected.push_back(Expected(*engine, prepared, layer, m, payload));
    }
  }
  for (int layer = 0; layer < kLayers; ++layer) {
    for (size_t j = 0; j < layouts.size(); ++j) {
      const Reply reply = client_->Next();
      ASSERT_EQ(reply.header.kind, static_cast<uint16_t>(FrameKind::kLayerResult));
      EXPECT_EQ(reply.header.layer, static_cast<uint32_t>(layer));
      EXPECT_EQ(reply.header.minibatch, j);
      EXPECT_EQ(reply.payload, expected[layer * layouts.size() + j])
          << "layer " << layer << " mini-batch " << j;
    }
  }
  EXPECT_EQ(server_->stats().layer_frames, static_cast<uint64_t>(kLayers) * layouts.size());
}

// Layer-wise pre-loading: a layer frame of a step whose descriptor names a load ticket is
// answered only once the node's load gate has that layer of the ticket in DRAM (or the
// load is over), and the answer is the engine's.
TEST_P(MemoryServerTest, ALayerOfALoadingRequestWaitsForThatLayer) {
  const StepShare share = OneMinibatch(2, /*ticket=*/41);
  SendStep(share);
  const AttentionDims dims{kLayers, kHeads, kKvHeads, kDim};
  const MinibatchLayout m = LayoutMinibatches(share, dims)[0];
  auto engine = ReferenceEngine();
  auto prepared = *engine->Prepare(share.plan);
  for (int layer = 0; layer < kLayers; ++layer) {
    const auto payload = RandomRows(m.request_bytes(), 300 + layer);
    client_->Send(LayerHeader(2, layer, 0, 8), payload);
    EXPECT_FALSE(client_->Any(absl::Milliseconds(150)))
        << "layer " << layer << " answered before it was in DRAM";
    if (layer == 0) {
      server_->load_gate().Advance(41, 1);
    } else {
      EXPECT_TRUE(server_->load_gate().Finish(41, true));
    }
    const Reply reply = client_->Next();
    ASSERT_EQ(reply.header.kind, static_cast<uint16_t>(FrameKind::kLayerResult));
    EXPECT_EQ(reply.header.layer, static_cast<uint32_t>(layer));
    EXPECT_EQ(reply.payload, Expected(*engine, prepared, layer, m, payload));
  }
  EXPECT_EQ(server_->load_gate().stats().waited_layers, static_cast<uint64_t>(kLayers));
  EXPECT_EQ(server_->load_gate().stats().abandoned, 0u);
}

// A layer frame that waits for its step's loads holds up no other peer: another compute
// node's frames are answered meanwhile, and the waiting peer's own later frames stay behind
// its waiting one, in order. A peer that leaves while it waits has its departure queued
// behind them (the frames it sent before it left still run, as they did before frames were
// parked), and a server stopped with frames waiting stops.
TEST_P(MemoryServerTest, AFrameWaitingForTheDiskHoldsUpNoOtherPeer) {
  const StepShare share = OneMinibatch(2, /*ticket=*/41);
  SendStep(share);
  const AttentionDims dims{kLayers, kHeads, kKvHeads, kDim};
  const MinibatchLayout m = LayoutMinibatches(share, dims)[0];
  const auto layer0 = RandomRows(m.request_bytes(), 60);
  const auto layer1 = RandomRows(m.request_bytes(), 61);
  client_->Send(LayerHeader(2, 0, 0, 8), layer0);
  client_->Send(LayerHeader(2, 1, 0, 8), layer1);
  // Another compute node, with a step of its own and no loads.
  auto other = std::make_unique<Client>(server_->data_address());
  const absl::Time parked_by = absl::Now() + absl::Seconds(10);
  while (server_->stats().parked_frames < 2 && absl::Now() < parked_by) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  const uint64_t inline_before = server_->stats().inline_frames;
  SendStep(OneMinibatch(9), other.get());
  const auto rows = RandomRows(m.request_bytes(), 62);
  other->Send(LayerHeader(9, 0, 0, 8), rows);
  const Reply answered = other->Next();
  ASSERT_EQ(answered.header.kind, static_cast<uint16_t>(FrameKind::kLayerResult))
      << "the other peer waited behind the load";
  // Where frames may run on the transport thread, its frames did, the parked ones aside:
  // nothing ran ahead of them.
  EXPECT_EQ(server_->stats().inline_frames - inline_before, GetParam() ? 2u : 0u);
  EXPECT_FALSE(client_->Any(absl::Milliseconds(50))) << "the waiting peer was answered early";
  // The load brings layer 0, then the rest: the waiting peer's frames are answered in order.
  auto engine = ReferenceEngine();
  auto prepared = *engine->Prepare(share.plan);
  server_->load_gate().Advance(41, 1);
  const Reply first = client_->Next();
  ASSERT_EQ(first.header.kind, static_cast<uint16_t>(FrameKind::kLayerResult));
  EXPECT_EQ(first.header.layer, 0u);
  EXPECT_EQ(first.payload, Expected(*engine, prepared, 0, m, layer0));
  EXPECT_FALSE(client_->Any(absl::Milliseconds(50))) << "layer 1 ran before it was in DRAM";
  EXPECT_TRUE(server_->load_gate().Finish(41, true));
  const Reply second = client_->Next();
  ASSERT_EQ(second.header.kind, static_cast<uint16_t>(FrameKind::kLayerResult));
  EXPECT_EQ(second.header.layer, 1u);
  EXPECT_EQ(second.payload, Expected(*engine, prepared, 1, m, layer1));
  EXPECT_EQ(server_->load_gate().stats().waited_layers, 2u);

  // The other peer now waits for a load of its own, and leaves while it waits.
  SendStep(OneMinibatch(10, /*ticket=*/42), other.get());
  other->Send(LayerHeader(10, 0, 0, 8), rows);
  other->Send(LayerHeader(10, 1, 0, 8), rows);
  auto wait_for = [&](auto done) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (!done(server_->stats()) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(2));
    return done(server_->stats());
  };
  ASSERT_TRUE(wait_for([](const MemoryServerStats& s) { return s.parked_frames == 2; }));
  const MemoryServerStats before = server_->stats();
  other.reset();
  // Its departure queues behind them: the first peer is served meanwhile.
  ASSERT_TRUE(wait_for([&](const MemoryServerStats& s) { return s.parked_frames == 3; }));
  SendStep(OneMinibatch(5));
  client_->Send(LayerHeader(5, 0, 0, 8), rows);
  ASSERT_EQ(client_->Next().header.kind, static_cast<uint16_t>(FrameKind::kLayerResult));
  EXPECT_EQ(server_->stats().peers_left, before.peers_left);
  // Its load done, the frames it sent before it left run (their answers have nowhere to
  // go), then its departure.
  EXPECT_TRUE(server_->load_gate().Finish(42, true));
  ASSERT_TRUE(wait_for([&](const MemoryServerStats& s) {
    return s.parked_frames == 0 && s.peers_left == before.peers_left + 1;
  }));
  EXPECT_EQ(server_->stats().layer_frames, before.layer_frames + 3);
  EXPECT_EQ(server_->stats().departed_frames, before.departed_frames);
  // The first peer is still served.
  SendStep(OneMinibatch(3));
  client_->Send(LayerHeader(3, 0, 0, 8), rows);
  ASSERT_EQ(client_->Next().header.kind, static_cast<uint16_t>(FrameKind::kLayerResult));
  // A server stopped with a frame waiting for its loads stops.
  SendStep(OneMinibatch(4, /*ticket=*/43));
  client_->Send(LayerHeader(4, 0, 0, 8), rows);
  ASSERT_TRUE(wait_for([](const MemoryServerStats& s) { return s.parked_frames == 1; }));
  const absl::Time stopping = absl::Now();
  client_.reset();
  server_.reset();
  EXPECT_LT(absl::Now() - stopping, absl::Seconds(5));
}

// Parked frames resume on the worker while another peer's frames run on the transport
// thread (nothing but parked frames is ahead of them). The waiting peer's frames, which now
// also come in on the transport thread and queue behind its parked one there, still run in
// order, each with the answer of its own rows.
TEST_P(MemoryServerTest, ParkedFramesResumeWhileAnotherPeersFramesRun) {
  constexpr int kParkedSteps = 6, kOtherSteps = 40;
  const AttentionDims dims{kLayers, kHeads, kKvHeads, kDim};
  auto engine = ReferenceEngine();
  // This peer's steps each wait for a load of their own, all behind the first.
  std::vector<std::vector<uint8_t>> want;
  for (int i = 0; i < kParkedSteps; ++i) {
    const uint64_t step = 100 + i;
    const StepShare share = OneMinibatch(step, /*ticket=*/200 + i);
    SendStep(share);
    const MinibatchLayout m = LayoutMinibatches(share, dims)[0];
    auto prepared = *engine->Prepare(share.plan);
    for (int layer = 0; layer < kLayers; ++layer) {
      const auto rows = RandomRows(m.request_bytes(), 500 + 2 * i + layer);
      client_->Send(LayerHeader(step, layer, 0, 8), rows);
      want.push_back(Expected(*engine, prepared, layer, m, rows));
    }
  }
  auto other = std::make_unique<Client>(server_->data_address());
  std::thread traffic([&] {
    for (int i = 0; i < kOtherSteps; ++i) {
      const StepShare share = OneMinibatch(300 + i);
      SendStep(share, other.get());
      const MinibatchLayout m = LayoutMinibatches(share, dims)[0];
      for (int layer = 0; layer < kLayers; ++layer) {
        other->Send(LayerHeader(300 + i, layer, 0, 8), RandomRows(m.request_bytes(), 900 + i));
        const Reply r = other->Next();
        ASSERT_EQ(r.header.kind, static_cast<uint16_t>(FrameKind::kLayerResult)) << "step " << i;
      }
    }
  });
  for (int i = 0; i < kParkedSteps; ++i) {
    absl::SleepFor(absl::Milliseconds(3));
    EXPECT_TRUE(server_->load_gate().Finish(200 + i, true));
  }
  for (size_t f = 0; f < want.size(); ++f) {
    const Reply r = client_->Next();
    ASSERT_EQ(r.header.kind, static_cast<uint16_t>(FrameKind::kLayerResult)) << "frame " << f;
    EXPECT_EQ(r.header.step_id, 100 + f / kLayers);
    EXPECT_EQ(r.payload, want[f]) << "frame " << f;
  }
  traffic.join();
}

// The transport may deliver a peer's frames after telling of its departure (a frame held
// behind a payload still arriving when the peer went). They are dropped: applying a step
// descriptor then would hold its slot tables for a peer that is gone, for ever.
TEST_P(MemoryServerTest, FramesDeliveredAfterTheirPeerLeftAreDropped) {
  auto wait_for = [&](auto done) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (!done(server_->stats()) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(2));
    return done(server_->stats());
  };
  SendStep(Share(1, 10));
  ASSERT_TRUE(wait_for([](const MemoryServerStats& s) { return s.steps == 1; }));
  const uint64_t tables = server_->stats().tables;
  client_.reset();  // the server's only peer, its first: id 1
  ASSERT_TRUE(wait_for([](const MemoryServerStats& s) { return s.peers_left == 1; }));
  const StepShare late = Share(2, 10);
  const std::string body = EncodeStepShare(late);
  FrameHeader h;
  h.kind = static_cast<uint16_t>(FrameKind::kStep);
  h.step_id = late.step_id;
  h.epoch = kEpoch;
  h.payload_bytes = body.size();
  h.checksum = transport::PayloadChecksum(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(body.data()), body.size()));
  server_->Deliver(1, transport::AsBytes(h),
                   {reinterpret_cast<const uint8_t*>(body.data()), body.size()}, absl::OkStatus());
  ASSERT_TRUE(
      wait_for([](const MemoryServerStats& s) { return s.departed_frames + s.steps >= 2; }));
  const MemoryServerStats stats = server_->stats();
  EXPECT_EQ(stats.departed_frames, 1u);
  EXPECT_EQ(stats.steps, 1u) << "a departed peer's step was applied";
  EXPECT_EQ(stats.tables, tables);
}

TEST_P(MemoryServerTest, BadFramesGetErrorsAndTheServerKeepsServing) {
  const StepShare share = Share(5, 10);
  SendStep(share);
  const AttentionDims dims{kLayers, kHeads, kKvHeads, kDim};
  const MinibatchLayout m = LayoutMinibatches(share, dims)[0];
  const auto payload = RandomRows(m.request_bytes(), 1);
  const uint16_t error = static_cast<uint16_t>(FrameKind::kError);
  // Every error frame carries the memory node's status code, not only its text.
  auto expect_error = [&](const std::string& what, absl::StatusCode code) {
    const Reply r = client_->Next();
    EXPECT_EQ(r.header.kind, error) << what;
    EXPECT_FALSE(r.payload.empty()) << what;
    const absl::Status status = transport::ErrorFrameStatus(r.header, r.payload);
    EXPECT_EQ(status.code(), code) << what << ": " << status;
    EXPECT_EQ(status.message(),
              std::string(reinterpret_cast<const char*>(r.payload.data()), r.payload.size()))
        << what;
  };

  // Corrupted payload: the checksum catches it.
  FrameHeader h = LayerHeader(5, 0, 0, m.end - m.begin);
  h.payload_bytes = payload.size();
  h.checksum = transport::PayloadChecksum(payload) ^ 1;
  client_->SendRaw(transport::AsBytes(h), payload);
  expect_error("bad checksum", absl::StatusCode::kDataLoss);
  // Truncated payload.
  h.checksum = transport::PayloadChecksum(payload);
  client_->SendRaw(transport::AsBytes(h), std::span<const uint8_t>(payload).first(100));
  expect_error("truncated", absl::StatusCode::kDataLoss);
  // Wrong magic, and a header too short to read.
  FrameHeader bad = h;
  bad.magic = 0xDEADBEEF;
  client_->SendRaw(transport::AsBytes(bad), payload);
  expect_error("bad magic", absl::StatusCode::kInvalidArgument);
  const uint8_t junk[5] = {1, 2, 3, 4, 5};
  client_->SendRaw(junk, payload);  // nothing to answer to: dropped and counted
  // Layer beyond the model, unknown mini-batch, wrong row count, wrong step.
  client_->Send(LayerHeader(5, kLayers, 0, m.end - m.begin), payload);
  expect_error("layer out of range", absl::StatusCode::kInvalidArgument);
  client_->Send(LayerHeader(5, 0, 9, m.end - m.begin), payload);
  expect_error("unknown mini-batch", absl::StatusCode::kInvalidArgument);
  client_->Send(LayerHeader(5, 0, 0, 1), payload);
  expect_error("row count", absl::StatusCode::kInvalidArgument);
  client_->Send(LayerHeader(77, 0, 0, m.end - m.begin), payload);
  expect_error("no descriptor", absl::StatusCode::kFailedPrecondition);
  // A descriptor that is not a descriptor, one for another pool, and one with a bad plan.
  FrameHeader step;
  step.kind = static_cast<uint16_t>(FrameKind::kStep);
  step.step_id = 6;
  step.epoch = kEpoch;
  client_->Send(step, junk);
  expect_error("garbage descriptor", absl::StatusCode::kInvalidArgument);
  StepShare other = Share(6, 4);
  other.pool = PoolIndex(4);
  SendStep(other);
  expect_error("wrong pool", absl::StatusCode::kInvalidArgument);
  StepShare beyond = Share(6, 4);
  beyond.plan.rows.push_back({SequenceId(1), PoolIndex(3), 40, -1});  // position beyond its table
  beyond.minibatch_rows = {5};
  SendStep(beyond);
  expect_error("bad plan", absl::StatusCode::kInvalidArgument);
  StepShare stale = Share(6, 4);
  stale.epoch = kEpoch + 1;
  SendStep(stale);
  expect_error("wrong epoch", absl::StatusCode::kFailedPrecondition);
  // A descriptor frame past the size any step needs: refused without a copy.
  const std::vector<uint8_t> giant((size_t{64} << 20) + 1, 0);
  FrameHeader giant_step = step;
  giant_step.step_id = 7;
  client_->Send(giant_step, giant);
  expect_error("giant descriptor", absl::StatusCode::kInvalidArgument);

  const MemoryServerStats stats = server_->stats();
  EXPECT_GE(stats.checksum_failures, 1u);
  EXPECT_GE(stats.malformed_frames, 8u);
  EXPECT_GE(stats.rejected_steps, 4u);
  EXPECT_EQ(stats.kv_positions, 10) << "a rejected plan changed the tables";

  // Still serving: a fresh, correct step works.
  const StepShare good = Share(8, 10);
  SendStep(good);
  client_->Send(LayerHeader(8, 0, 0, m.end - m.begin), payload);
  const Reply r = client_->Next();
  EXPECT_EQ(r.header.kind, static_cast<uint16_t>(FrameKind::kLayerResult));
  EXPECT_EQ(r.payload.size(), m.out_bytes);
}

TEST_P(MemoryServerTest, RejectsAnUnusableConfiguration) {
  MemoryConfig config;
  config.epoch = 1;
  config.model.num_layers = 2;
  config.model.num_heads = 3;
  config.model.num_kv_heads = 2;  // does not divide
  config.model.head_dim = 64;
  config.model.kv_dtype = "bf16";
  config.num_slots = 10;
  EXPECT_FALSE(server_->Configure(config).ok());
  config.model.num_heads = 4;
  config.model.kv_dtype = "fp8";
  EXPECT_FALSE(server_->Configure(config).ok());
  config.model.kv_dtype = "bf16";
  config.num_slots = 0;
  EXPECT_FALSE(server_->Configure(config).ok());
  // Sizes that would wrap: slots times bytes per token, and a shape past every real model.
  config.num_slots = (uint64_t{1} << 58) + 1;
  config.model.head_dim = 16;
  config.model.num_layers = 1;
  config.model.num_kv_heads = 1;
  config.model.num_heads = 1;
  EXPECT_EQ(server_->Configure(config).status().code(), absl::StatusCode::kInvalidArgument);
  config.num_slots = 10;
  config.model.num_layers = 1u << 31;
  EXPECT_EQ(server_->Configure(config).status().code(), absl::StatusCode::kInvalidArgument);
  // The previous configuration still serves.
  EXPECT_TRUE(server_->Status().ready);
}

// Rotational pipelining's routed steps: the descriptor and layer 0 come from one
// connection, layer 1 from another, and each layer's answers go to the endpoint the frame
// names (announced with a hello on a third connection), with the same bits as an
// independent engine. A routed frame to an endpoint that never said hello, or of another
// epoch, is refused with an error to whoever should hear of it; a new configuration drops
// routed steps.
TEST_P(MemoryServerTest, RoutedStepsAnswerTheNamedEndpoint) {
  auto sender_a = std::make_unique<Client>(server_->data_address());  // slice 0's replica
  auto sender_b = std::make_unique<Client>(server_->data_address());  // slice 1's replica
  auto receiver = std::make_unique<Client>(server_->data_address());  // gets the answers
  constexpr uint64_t kEndpoint = 0xE0D1;
  FrameHeader hello;
  hello.kind = static_cast<uint16_t>(FrameKind::kHello);
  hello.reserved = kEndpoint;
  receiver->Send(hello, {});
  absl::SleepFor(absl::Milliseconds(50));  // the hello is handled before the routed frames

  const int n = 9;
  const StepShare share = Share(21, n);
  const std::string body = EncodeStepShare(share);
  FrameHeader step;
  step.kind = static_cast<uint16_t>(FrameKind::kStep);
  step.step_id = 21;
  step.epoch = kEpoch;
  step.reserved = kEndpoint;
  sender_a->Send(step, {reinterpret_cast<const uint8_t*>(body.data()), body.size()});
  const AttentionDims dims{kLayers, kHeads, kKvHeads, kDim};
  const auto layouts = LayoutMinibatches(share, dims);
  auto engine = ReferenceEngine();
  auto prepared = *engine->Prepare(share.plan);
  for (int layer = 0; layer < kLayers; ++layer) {
    Client& sender = layer == 0 ? *sender_a : *sender_b;
    for (size_t j = 0; j < layouts.size(); ++j) {
      const MinibatchLayout& m = layouts[j];
      const auto payload = RandomRows(m.request_bytes(), 300 + 10 * layer + j);
      FrameHeader h = LayerHeader(21, layer, j, m.end - m.begin);
      h.reserved = kEndpoint;
      sender.Send(h, payload);
      const Reply reply = receiver->Next();
      ASSERT_EQ(reply.header.kind, static_cast<uint16_t>(FrameKind::kLayerResult))
          << std::string(reply.payload.begin(), reply.payload.end());
      EXPECT_EQ(reply.header.layer, static_cast<uint32_t>(layer));
      EXPECT_EQ(reply.payload, Expected(*engine, prepared, layer, m, payload))
          << "layer " << layer << " mini-batch " << j;
    }
  }

  // To an endpoint that never said hello: the sender hears why.
  FrameHeader lost_step = step;
  lost_step.step_id = 22;
  lost_step.reserved = 0xBAD;
  const StepShare share22 = Share(22, n);
  const std::string body22 = EncodeStepShare(share22);
  sender_a->Send(lost_step, {reinterpret_cast<const uint8_t*>(body22.data()), body22.size()});
  FrameHeader lost = LayerHeader(22, 0, 0, layouts[0].end - layouts[0].begin);
  lost.reserved = 0xBAD;
  sender_a->Send(lost, RandomRows(layouts[0].request_bytes(), 1));
  Reply error = sender_a->Next();
  ASSERT_EQ(error.header.kind, static_cast<uint16_t>(FrameKind::kError));
  EXPECT_NE(std::string(error.payload.begin(), error.payload.end()).find("not said hello"),
            std::string::npos);

  // Another epoch's routed step does not take this epoch's place, and its frames are refused.
  FrameHeader stale = step;
  stale.step_id = 23;
  stale.epoch = kEpoch - 1;
  const StepShare share23 = Share(23, n);
  const std::string body23 = EncodeStepShare(share23);
  sender_a->Send(stale, {reinterpret_cast<const uint8_t*>(body23.data()), body23.size()});
  error = receiver->Next();
  ASSERT_EQ(error.header.kind, static_cast<uint16_t>(FrameKind::kError));
  EXPECT_NE(std::string(error.payload.begin(), error.payload.end()).find("epoch"),
            std::string::npos);
  FrameHeader stale_layer = LayerHeader(23, 0, 0, layouts[0].end - layouts[0].begin);
  stale_layer.epoch = kEpoch - 1;
  stale_layer.reserved = kEndpoint;
  sender_a->Send(stale_layer, RandomRows(layouts[0].request_bytes(), 2));
  error = receiver->Next();
  ASSERT_EQ(error.header.kind, static_cast<uint16_t>(FrameKind::kError));
  EXPECT_NE(std::string(error.payload.begin(), error.payload.end()).find("epoch"),
            std::string::npos);

  // A routed step open when the scheduler reconfigures the node is gone after it.
  FrameHeader open_step = step;
  open_step.step_id = 24;
  const StepShare share24 = Share(24, n);
  const std::string body24 = EncodeStepShare(share24);
  sender_a->Send(open_step, {reinterpret_cast<const uint8_t*>(body24.data()), body24.size()});
  absl::SleepFor(absl::Milliseconds(50));
  ASSERT_TRUE(server_->Configure(Config()).ok());
  FrameHeader late = LayerHeader(24, 0, 0, layouts[0].end - layouts[0].begin);
  late.reserved = kEndpoint;
  sender_a->Send(late, RandomRows(layouts[0].request_bytes(), 3));
  error = receiver->Next();
  ASSERT_EQ(error.header.kind, static_cast<uint16_t>(FrameKind::kError));
  EXPECT_NE(std::string(error.payload.begin(), error.payload.end()).find("without its descriptor"),
            std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(InlineOrWorker, MemoryServerTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "FirstFrameInline" : "AllOnWorker";
                         });

}  // namespace
}  // namespace strata
