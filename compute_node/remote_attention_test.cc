// Remote attention against a real memory server over the in-process transport: how a
// memory node's share of a step is cut into mini-batches (the count asked for, but none
// smaller than min_minibatch_rows), and that the cut never changes the output.
#include "compute_node/remote_attention.h"

#include <cstring>
#include <random>

#include "compute_node/model_runner.h"
#include "gtest/gtest.h"
#include "memory_node/memory_server.h"

namespace strata {
namespace {

constexpr uint64_t kEpoch = 3;

ModelConfig Shape() {
  ModelConfig c;
  c.hidden_size = 128;
  c.intermediate_size = 256;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 32;
  c.vocab_size = 64;
  return c;
}

// One memory server and a remote attention client with the given mini-batching.
struct Pair {
  std::unique_ptr<MemoryServer> server;
  std::unique_ptr<RemoteAttention> remote;

  // Over the in-process transport unless `data_plane` is given (then UCX, as deployed).
  Pair(const ModelConfig& c, int minibatches, int min_rows, int64_t slots,
       const transport::TransportConfig* data_plane = nullptr,
       absl::Duration answer_spin = RemoteAttentionOptions().answer_spin, uint64_t endpoint = 0) {
    static int instance = 0;
    MemoryServerOptions server_options;
    server_options.transport.backend = transport::Backend::kInproc;
    server_options.data_address = "remote-attention-test-" + std::to_string(++instance);
    if (data_plane != nullptr) {
      server_options.transport = *data_plane;
      server_options.data_address = "127.0.0.1:0";
    }
    server_options.prefault_kv = false;
    server = std::move(*MemoryServer::Create(server_options));
    MemoryConfig mc;
    mc.epoch = kEpoch;
    mc.pool = PoolIndex(0);
    mc.model.name = "test";
    mc.model.num_layers = c.num_layers;
    mc.model.num_heads = c.num_heads;
    mc.model.num_kv_heads = c.num_kv_heads;
    mc.model.head_dim = c.head_dim;
    mc.model.kv_dtype = "bf16";
    mc.num_slots = slots;
    EXPECT_TRUE(server->Configure(mc).ok());
    RemoteAttentionOptions options;
    options.transport.backend = transport::Backend::kInproc;
    if (data_plane != nullptr) options.transport = *data_plane;
    options.answer_spin = answer_spin;
    options.endpoint = endpoint;  // rotational pipelining's lanes have one
    if (endpoint != 0) options.prefill_policy = PrefillPolicy::kMemory;
    options.minibatches = minibatches;
    options.min_minibatch_rows = min_rows;
    remote = std::move(*RemoteAttention::Create(c, options));
    remote->SetMemoryNodes(kEpoch, {{PoolIndex(0), "memory-0", server->data_address()}});
  }
};

// Runs `steps` decode steps of `requests` sequences (positions 0..steps-1) through `pair`
// with q/k/v drawn from `seed`; returns the attention output rows of every step and layer
// and adds the layer frames sent to `*frames`.
std::vector<uint16_t> Decode(Pair& pair, const ModelConfig& c, int requests, int steps,
                             uint32_t seed, uint64_t* frames) {
  BatchBuffers b(c, requests);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> bits(0x3c00, 0x4040);  // bf16 in about [0.008, 3]
  std::vector<uint16_t> outputs;
  const uint64_t frames_before = pair.remote->stats().layer_frames;
  for (int step = 0; step < steps; ++step) {
    StepKvPlan plan;
    plan.step_id = 100 + step;
    for (int r = 0; r < requests; ++r) {
      if (step == 0) {
        SlotAssignment a;
        a.request_id = SequenceId(r + 1);
        for (int p = 0; p < steps; ++p) a.slots.push_back(r * steps + p);
        plan.assignments.push_back(a);
      }
      plan.rows.push_back({SequenceId(static_cast<uint64_t>(r + 1)), PoolIndex(0), step, -1});
    }
    EXPECT_TRUE(pair.remote->BeginStep(plan).ok());
    for (int layer = 0; layer < c.num_layers; ++layer) {
      for (size_t i = 0; i < requests * c.q_size(); ++i) b.q[i] = bits(rng);
      for (size_t i = 0; i < requests * c.kv_size(); ++i) b.k[i] = bits(rng);
      for (size_t i = 0; i < requests * c.kv_size(); ++i) b.v[i] = bits(rng);
      EXPECT_TRUE(pair.remote->Attend(layer, b, requests).ok());
      outputs.insert(outputs.end(), b.attn.begin(), b.attn.begin() + requests * c.q_size());
    }
    const AttentionStepOutcome outcome = pair.remote->EndStep();
    EXPECT_TRUE(outcome.failed.empty()) << outcome.failed.front().second;
  }
  *frames += pair.remote->stats().layer_frames - frames_before;
  return outputs;
}

// The transport writes an answer's payload where Place says, possibly after the wait for it
// gave up (a timeout, AbandonStep). That buffer must never be the batch's own, and must
// stay the receiver's until the frame is delivered: here the test plays the transport,
// placing an answer of a layer that waits for another replica's answers (nothing else
// answers), abandoning the step, then writing the payload and delivering it.
TEST(RemoteAttentionTest, AnAnswerPlacedBeforeTheStepIsAbandonedNeverLandsInTheBatch) {
  const ModelConfig c = Shape();
  Pair pair(c, 1, 1, 16, nullptr, RemoteAttentionOptions().answer_spin, /*endpoint=*/1);
  pair.remote->ConnectAll();
  StepKvPlan plan;
  plan.step_id = 7;
  SlotAssignment a;
  a.request_id = SequenceId(1);
  a.slots = {0};
  plan.assignments.push_back(a);
  plan.rows.push_back({SequenceId(1), PoolIndex(0), 0, -1});
  ASSERT_TRUE(pair.remote->BeginRoutedStep(plan, /*send_descriptors=*/false, /*reply_to=*/0).ok());
  BatchBuffers b(c, 1);
  for (size_t i = 0; i < b.attn.size(); ++i) b.attn[i] = static_cast<uint16_t>(i);
  const std::vector<uint16_t> before(b.attn.begin(), b.attn.end());
  ASSERT_TRUE(pair.remote->ExpectLayer(0, b, 1).ok());
  transport::FrameHeader h;
  h.kind = static_cast<uint16_t>(transport::FrameKind::kLayerResult);
  h.step_id = plan.step_id;
  h.epoch = kEpoch;
  h.layer = 0;
  h.minibatch = 0;
  h.rows = 1;
  const size_t bytes = static_cast<size_t>(c.num_heads) * c.head_dim * 2;  // one final row
  h.payload_bytes = bytes;
  std::span<uint8_t> dest;
  transport::PeerId peer = 1;
  for (; peer <= 8 && dest.empty(); ++peer) dest = pair.remote->Place(peer, AsBytes(h), bytes);
  --peer;
  ASSERT_EQ(dest.size(), bytes) << "no connection took the answer";
  EXPECT_TRUE(pair.remote->Place(peer, AsBytes(h), bytes).empty())
      << "a second frame for the same answer was placed in the same buffer";
  const auto* attn = reinterpret_cast<const uint8_t*>(b.attn.data());
  EXPECT_TRUE(dest.data() + dest.size() <= attn || dest.data() >= attn + b.attn.size() * 2)
      << "the answer was placed inside the batch's attention rows";
  pair.remote->AbandonStep();
  std::memset(dest.data(), 0xAB, dest.size());  // the payload arrives late
  pair.remote->Deliver(peer, AsBytes(h), dest, absl::OkStatus());
  EXPECT_EQ(std::vector<uint16_t>(b.attn.begin(), b.attn.end()), before);
  // The lane goes on: a step after the abandoned one runs as usual.
  uint64_t frames = 0;
  EXPECT_FALSE(Decode(pair, c, 1, 2, 5, &frames).empty());
}

TEST(RemoteAttentionTest, MinibatchesKeepAMinimumSize) {
  const ModelConfig c = Shape();
  struct Case {
    int requests, minibatches, min_rows, frames_per_layer;
  };
  // (rows, asked for, minimum) -> frames: min(asked, rows / minimum), at least 1.
  for (const Case& t : std::vector<Case>{{5, 4, 8, 1},
                                         {16, 4, 8, 2},
                                         {23, 4, 8, 2},
                                         {40, 4, 8, 4},
                                         {40, 4, 1, 4},
                                         {3, 4, 1, 3},
                                         {40, 1, 1, 1}}) {
    Pair pair(c, t.minibatches, t.min_rows, 4 * t.requests);
    uint64_t frames = 0;
    Decode(pair, c, t.requests, 2, 1, &frames);
    EXPECT_EQ(frames, static_cast<uint64_t>(2 * c.num_layers * t.frames_per_layer))
        << t.requests << " rows, " << t.minibatches << " mini-batches of at least " << t.min_rows;
  }
}

TEST(RemoteAttentionTest, MinibatchingDoesNotChangeTheOutput) {
  const ModelConfig c = Shape();
  const int requests = 24, steps = 5;
  Pair whole(c, 1, 1, requests * steps);
  Pair split(c, 3, 1, requests * steps);
  uint64_t whole_frames = 0, split_frames = 0;
  const auto a = Decode(whole, c, requests, steps, 7, &whole_frames);
  const auto b = Decode(split, c, requests, steps, 7, &split_frames);
  EXPECT_EQ(split_frames, 3 * whole_frames);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(a, b);
  // Not all zeros (a failed share would be).
  EXPECT_NE(std::count(a.begin(), a.end(), 0), static_cast<long>(a.size()));
}

// Over UCX, the step thread either polls for each layer's answers
// (RemoteAttentionOptions::answer_spin, Transport::ProgressUntil) and takes them itself, or
// sleeps until the transport thread has them: the outputs are the same bits as over the
// in-process transport, whole and in mini-batches, and no layer times out.
TEST(RemoteAttentionTest, AnswersTakenByTheStepThreadGiveTheSameOutput) {
  const ModelConfig c = Shape();
  const int requests = 12, steps = 4;
  Pair reference(c, 2, 1, requests * steps);
  uint64_t frames = 0;
  const auto want = Decode(reference, c, requests, steps, 11, &frames);
  transport::TransportConfig tcp;
  tcp.ucx_options = {{"TLS", "tcp"}, {"NET_DEVICES", "lo"}};
  tcp.auth_key = "0123456789abcdef0123456789abcdef";
  transport::TransportConfig sm = tcp;
  sm.ucx_options = {{"TLS", "sm,self,tcp"}, {"NET_DEVICES", "lo"}};
  sm.error_mode = transport::ErrorMode::kNone;
  for (const auto* config : {&tcp, &sm}) {
    for (const absl::Duration spin : {absl::ZeroDuration(), absl::Microseconds(200)}) {
      for (const int minibatches : {1, 2}) {
        SCOPED_TRACE(absl::StrCat(config->ucx_options.at("TLS"), ", spin ",
                                  absl::FormatDuration(spin), ", ", minibatches,
                                  " mini-batch(es)"));
        Pair pair(c, minibatches, 1, requests * steps, config, spin);
        const absl::Time start = absl::Now();
        const auto got = Decode(pair, c, requests, steps, 11, &frames);
        EXPECT_EQ(got, want);
        const RemoteAttentionStats stats = pair.remote->stats();
        EXPECT_EQ(stats.timeouts, 0u);
        // A wake-up that never came would have stalled an answer for the transport
        // thread's one-second bound; the layer timeout is far longer.
        EXPECT_EQ(stats.lost_wakeups, 0);
        EXPECT_LT(absl::Now() - start, absl::Seconds(1)) << "a layer's answers stalled";
        // With the spin on, whether the step thread or the transport thread takes an answer
        // is a race that either may win every time over these few layers (transport_test
        // checks over 300 round trips that the waiting thread takes some).
        if (spin == absl::ZeroDuration()) {
          EXPECT_EQ(stats.answers_polled, 0u) << "answers were polled with the spin off";
        }
      }
    }
  }
  EXPECT_NE(std::count(want.begin(), want.end(), 0), static_cast<long>(want.size()));
}

}  // namespace
}  // namespace strata
