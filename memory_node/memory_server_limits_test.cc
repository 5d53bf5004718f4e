// What bounds the frames of peers that hold the data-plane key: a layer frame's claim is
// checked against the configuration before anything is placed for it, a step's rows and
// load tickets are bounded, and the frames held at once are bounded per peer and over all
// peers together; past a bound a frame is refused with an error, and the node keeps
// serving.
#include "memory_node/memory_server.h"
#include "memory_node/testing/memory_server_fixture.h"

namespace strata {
namespace {

using namespace memory_server_testing;  // NOLINT: the fixture's client, frames and constants

// A layer frame's claim (its rows, its size) is checked against the configuration before
// the node places a buffer for it or copies it: more rows than a step of this node has, or
// more bytes than its rows fill, get an error that says so (not one about the step found
// after the payload was taken), and the node keeps serving.
TEST_P(MemoryServerTest, ALayerFramesClaimIsCheckedBeforeItsPayloadIsTaken) {
  const StepShare share = Share(5, 10);
  SendStep(share);
  const AttentionDims dims{kLayers, kHeads, kKvHeads, kDim};
  const MinibatchLayout m = LayoutMinibatches(share, dims)[0];
  const size_t row_max = dims.q_row_bytes() + 2 * dims.kv_row_bytes();
  auto expect_refused = [&](const std::string& what, const std::string& says) {
    const Reply r = client_->Next();
    ASSERT_EQ(r.header.kind, static_cast<uint16_t>(FrameKind::kError)) << what;
    const absl::Status status = transport::ErrorFrameStatus(r.header, r.payload);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << what << ": " << status;
    EXPECT_NE(status.message().find(says), std::string::npos) << what << ": " << status;
  };
  // Frames of a step without a descriptor here: before their payload is taken, it is their
  // claim that is refused. More rows than a step of this node can have, in a payload those rows
  // would fill.
  client_->Send(LayerHeader(6, 0, 0, kMaxStepRows + 1),
                RandomRows(row_max * (kMaxStepRows + 1), 2));
  expect_refused("rows past the step", "a step here has 1 to 256");
  // One row, claiming far more than a row fills (and more than the node copies).
  client_->Send(LayerHeader(6, 0, 0, 1), std::vector<uint8_t>(size_t{80} << 20, 0));
  expect_refused("a giant row", "its rows fill");
  // Too few bytes for the rows' k and v.
  client_->Send(LayerHeader(6, 0, 0, 4), RandomRows(2 * dims.kv_row_bytes() * 4 - 2, 3));
  expect_refused("a short payload", "its rows fill");
  EXPECT_EQ(server_->stats().malformed_frames, 3u);

  // Still serving: step 5's own frame is answered.
  const auto payload = RandomRows(m.request_bytes(), 4);
  client_->Send(LayerHeader(5, 0, 0, m.end - m.begin), payload);
  auto engine = ReferenceEngine();
  auto prepared = *engine->Prepare(share.plan);
  const Reply reply = client_->Next();
  ASSERT_EQ(reply.header.kind, static_cast<uint16_t>(FrameKind::kLayerResult));
  EXPECT_EQ(reply.payload, Expected(*engine, prepared, 0, m, payload));
}

// A descriptor may not name more rows than a step of this node has, more loads than it has
// rows, or a load ticket twice: each load ticket is awaited, so they must stay as few as
// the rows the configuration bounds.
TEST_P(MemoryServerTest, AStepsRowsAndLoadTicketsAreBounded) {
  auto expect_rejected = [&](const StepShare& share, const std::string& says) {
    SendStep(share);
    const Reply r = client_->Next();
    ASSERT_EQ(r.header.kind, static_cast<uint16_t>(FrameKind::kError)) << says;
    const absl::Status status = transport::ErrorFrameStatus(r.header, r.payload);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find(says), std::string::npos) << status;
  };
  expect_rejected(Share(1, kMaxStepRows + 1), "a step here has at most 256");
  StepShare loads = Share(2, 2);
  for (uint64_t t = 1; t <= 3; ++t) loads.plan.loads.push_back({SequenceId(1), PoolIndex(3), t});
  expect_rejected(loads, "3 loading requests for 2 rows");
  StepShare twice = Share(3, 2);
  twice.plan.loads = {{SequenceId(1), PoolIndex(3), 9}, {SequenceId(1), PoolIndex(3), 9}};
  expect_rejected(twice, "load ticket 9 twice");
  EXPECT_EQ(server_->stats().rejected_steps, 3u);

  // A step of exactly the bound is applied.
  SendStep(Share(4, kMaxStepRows));
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (server_->stats().steps < 4 && absl::Now() < deadline)
    absl::SleepFor(absl::Milliseconds(2));
  EXPECT_EQ(server_->stats().rejected_steps, 3u);
  EXPECT_EQ(server_->stats().kv_positions, kMaxStepRows);
}

// A peer's frames queued behind one that waits (here for the disk) hold at most the
// node's budget of bytes: past it, a frame is refused at once instead of queued, and once
// the queue drains the peer is served again.
TEST_P(MemoryServerTest, APeersQueuedFramesHoldABoundedBudget) {
  StepShare share = Share(2, 8);
  share.minibatch_rows = {8};
  share.plan.loads.push_back({SequenceId(1), PoolIndex(3), 41});
  const AttentionDims dims{kLayers, kHeads, kKvHeads, kDim};
  const MinibatchLayout m = LayoutMinibatches(share, dims)[0];
  const uint64_t frame = m.request_bytes();
  // A budget of 4 of these frames (and the step's descriptor), for a server of its own.
  Restart([&](MemoryServerOptions& o) { o.max_held_bytes_per_peer = 4 * frame + 4096; });
  ASSERT_TRUE(server_->load_gate().Expect(41, absl::Now() + absl::Seconds(60)));
  SendStep(share);
  // Layer 0 waits for the disk; 9 more frames of the step arrive behind it (3 fit).
  const auto payload = RandomRows(frame, 5);
  for (int i = 0; i < 10; ++i) client_->Send(LayerHeader(2, i == 0 ? 0 : 1, 0, 8), payload);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (server_->stats().frames_over_budget < 6 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  EXPECT_EQ(server_->stats().frames_over_budget, 6u);
  EXPECT_LE(server_->stats().held_bytes_peak, 4 * frame + 4096);
  EXPECT_FALSE(client_->Any(absl::Milliseconds(50))) << "layer 0 ran before it was in DRAM";
  EXPECT_TRUE(server_->load_gate().Finish(41, true));
  auto engine = ReferenceEngine();
  auto prepared = *engine->Prepare(share.plan);
  const Reply first = client_->Next();
  ASSERT_EQ(first.header.kind, static_cast<uint16_t>(FrameKind::kLayerResult));
  EXPECT_EQ(first.payload, Expected(*engine, prepared, 0, m, payload));
  int refused = 0;
  for (int i = 1; i < 10; ++i) {
    const Reply r = client_->Next();
    if (r.header.kind != static_cast<uint16_t>(FrameKind::kError)) continue;
    refused += absl::IsResourceExhausted(transport::ErrorFrameStatus(r.header, r.payload));
  }
  EXPECT_EQ(refused, 6);
  // Drained: a new step of the peer is answered.
  while (server_->stats().layer_frames + server_->stats().malformed_frames +
                 server_->stats().frames_over_budget <
             10 &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  SendStep(OneMinibatch(3));
  client_->Send(LayerHeader(3, 0, 0, 8), payload);
  const Reply reply = client_->Next();
  ASSERT_EQ(reply.header.kind, static_cast<uint16_t>(FrameKind::kLayerResult));
}

// All peers' frames held at once are bounded too: a peer under its own budget has a frame
// refused once the frames of all peers together fill theirs, and is served again once
// they drain.
TEST_P(MemoryServerTest, AllPeersQueuedFramesHoldABoundedBudgetTogether) {
  const StepShare share = OneMinibatch(2);
  const AttentionDims dims{kLayers, kHeads, kKvHeads, kDim};
  const uint64_t frame = LayoutMinibatches(share, dims)[0].request_bytes();
  // Each peer may hold 4 of these frames, and all peers together 6.
  Restart([&](MemoryServerOptions& o) {
    o.max_held_bytes_per_peer = 4 * frame + 4096;
    o.max_held_bytes = 6 * frame + 4096;
  });
  auto other = std::make_unique<Client>(server_->data_address());
  auto wait_for = [&](uint64_t refused) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (server_->stats().frames_over_budget < refused && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(2));
    }
    return server_->stats().frames_over_budget;
  };
  // Each peer's layer 0 waits for the disk, with more of its frames behind it: the first
  // peer's 10 frames fill its own budget (4 held, 6 refused), and 2 of the second peer's 5
  // fill what is left of all peers' (3 refused, though that peer holds only 2).
  const auto payload = RandomRows(frame, 5);
  SendStep(OneMinibatch(2, /*ticket=*/41));
  for (int i = 0; i < 10; ++i) client_->Send(LayerHeader(2, i == 0 ? 0 : 1, 0, 8), payload);
  ASSERT_EQ(wait_for(6), 6u);
  SendStep(OneMinibatch(3, /*ticket=*/42), other.get());
  for (int i = 0; i < 5; ++i) other->Send(LayerHeader(3, i == 0 ? 0 : 1, 0, 8), payload);
  EXPECT_EQ(wait_for(9), 9u);
  EXPECT_LE(server_->stats().held_bytes_all_peak, 6 * frame + 4096);
  EXPECT_GE(server_->stats().held_bytes_all_peak, 6 * frame);
  EXPECT_LE(server_->stats().held_bytes_peak, 4 * frame + 4096);
  EXPECT_TRUE(server_->load_gate().Finish(41, true));
  EXPECT_TRUE(server_->load_gate().Finish(42, true));
  auto count = [](Client& client, int frames, int* answered) {
    int refused = 0;
    for (int i = 0; i < frames; ++i) {
      const Reply r = client.Next();
      if (r.header.kind == static_cast<uint16_t>(FrameKind::kLayerResult)) ++*answered;
      if (r.header.kind != static_cast<uint16_t>(FrameKind::kError)) continue;
      const absl::Status status = transport::ErrorFrameStatus(r.header, r.payload);
      EXPECT_TRUE(absl::IsResourceExhausted(status)) << status;
      ++refused;
    }
    return refused;
  };
  int answered = 0, answered_other = 0;
  EXPECT_EQ(count(*client_, 10, &answered), 6);
  EXPECT_EQ(answered, 4);
  EXPECT_EQ(count(*other, 5, &answered_other), 3);
  EXPECT_EQ(answered_other, 2);
  // Drained: the second peer is served again.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (server_->stats().layer_frames + server_->stats().frames_over_budget < 15 &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  SendStep(OneMinibatch(4), other.get());
  other->Send(LayerHeader(4, 0, 0, 8), payload);
  EXPECT_EQ(other->Next().header.kind, static_cast<uint16_t>(FrameKind::kLayerResult));
}

// A peer that leaves gives its share of all peers' budget back, also for frames the
// transport placed and never delivered (here placed by hand for a peer that then leaves).
TEST_P(MemoryServerTest, APeerThatLeftHoldsNoneOfAllPeersBudget) {
  const StepShare share = OneMinibatch(2);
  const AttentionDims dims{kLayers, kHeads, kKvHeads, kDim};
  const uint64_t frame = LayoutMinibatches(share, dims)[0].request_bytes();
  Restart([&](MemoryServerOptions& o) { o.max_held_bytes = 2 * frame + 4096; });
  constexpr transport::PeerId kGone = 0xDEAD;
  FrameHeader h = LayerHeader(7, 0, 0, 8);
  h.payload_bytes = frame;
  for (int i = 0; i < 2; ++i)
    ASSERT_FALSE(server_->Place(kGone, transport::AsBytes(h), frame).empty());
  const auto payload = RandomRows(frame, 9);
  SendStep(share);
  client_->Send(LayerHeader(2, 0, 0, 8), payload);
  Reply refused = client_->Next();
  ASSERT_EQ(refused.header.kind, static_cast<uint16_t>(FrameKind::kError));
  EXPECT_TRUE(
      absl::IsResourceExhausted(transport::ErrorFrameStatus(refused.header, refused.payload)));
  // The peer leaves (as the transport reports a departure): its frames' bytes go back.
  server_->Deliver(kGone, {}, {}, absl::CancelledError("peer left"));
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (server_->stats().peers_left < 1 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  SendStep(OneMinibatch(3));
  client_->Send(LayerHeader(3, 0, 0, 8), payload);
  EXPECT_EQ(client_->Next().header.kind, static_cast<uint16_t>(FrameKind::kLayerResult));
}

INSTANTIATE_TEST_SUITE_P(InlineOrWorker, MemoryServerTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "FirstFrameInline" : "AllOnWorker";
                         });

}  // namespace
}  // namespace strata
