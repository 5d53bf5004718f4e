// The memory server's test fixture: a compute node's side of the wire written against the
// transport directly (Client), and a server of the test's own, configured as the scheduler
// would, with the frames and reference answers the cases build.
#ifndef STRATA_MEMORY_NODE_TESTING_MEMORY_SERVER_FIXTURE_H_
#define STRATA_MEMORY_NODE_TESTING_MEMORY_SERVER_FIXTURE_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/bfloat16.h"
#include "gtest/gtest.h"
#include "memory_node/memory_server.h"

namespace strata::memory_server_testing {

using transport::FrameHeader;
using transport::FrameKind;

constexpr int kLayers = 2, kHeads = 4, kKvHeads = 2, kDim = 64;
constexpr uint64_t kEpoch = 7;
constexpr int kMaxStepRows = 256;  // the scheduler's max_num_batched_tokens

struct Reply {
  FrameHeader header;
  std::vector<uint8_t> payload;
};

// A compute node's side of the wire, written against the transport directly.
class Client : public transport::MessageHandler {
 public:
  explicit Client(const std::string& address) {
    transport::TransportConfig config;
    config.backend = transport::Backend::kInproc;
    transport_ = *transport::Transport::Create(config);
    transport_->SetHandler(transport::kFrameTag, this);
    auto peer = transport_->Connect(address);
    EXPECT_TRUE(peer.ok()) << peer.status();
    peer_ = *peer;
  }
  ~Client() override { transport_.reset(); }

  std::span<uint8_t> Place(transport::PeerId, std::span<const uint8_t>, size_t) override {
    return {};
  }
  void Deliver(transport::PeerId, std::span<const uint8_t> header, std::span<const uint8_t> payload,
               absl::Status) override {
    Reply r;
    EXPECT_TRUE(transport::ParseFrameHeader(header, &r.header).ok());
    r.payload.assign(payload.begin(), payload.end());
    std::lock_guard<std::mutex> lock(mu_);
    replies_.push_back(std::move(r));
    cv_.notify_all();
  }

  void SendRaw(std::span<const uint8_t> header, std::span<const uint8_t> payload) {
    ASSERT_TRUE(transport::SendAndWait(*transport_, peer_, transport::kFrameTag, header, {payload},
                                       absl::Seconds(10))
                    .ok());
  }
  void Send(FrameHeader header, std::span<const uint8_t> payload, bool fix_checksum = true) {
    header.payload_bytes = payload.size();
    if (fix_checksum) header.checksum = transport::PayloadChecksum(payload);
    SendRaw(transport::AsBytes(header), payload);
  }
  // Whether a reply came within `wait` (it stays queued for Next).
  bool Any(absl::Duration wait) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoNanoseconds(wait), [&] { return !replies_.empty(); });
  }
  Reply Next() {
    std::unique_lock<std::mutex> lock(mu_);
    EXPECT_TRUE(cv_.wait_for(lock, absl::ToChronoNanoseconds(absl::Seconds(20)), [&] {
      return !replies_.empty();
    })) << "no reply";
    if (replies_.empty()) return {};
    Reply r = std::move(replies_.front());
    replies_.pop_front();
    return r;
  }

 private:
  std::unique_ptr<transport::Transport> transport_;
  transport::PeerId peer_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Reply> replies_;
};

inline int counter = 0;  // names each test's server

// Each case runs twice: frames with nothing ahead of them handled on the transport thread
// (memory_node's choice for one attention thread), and every frame posted to the worker
// loop (its choice otherwise).
class MemoryServerTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    Restart([](MemoryServerOptions&) {});
  }
  // A server (and client_) of the test's own, configured, with the options `adjust` sets.
  void Restart(const std::function<void(MemoryServerOptions&)>& adjust) {
    client_.reset();
    server_.reset();
    MemoryServerOptions options;
    options.transport.backend = transport::Backend::kInproc;
    options.data_address = "memory-test-" + std::to_string(++counter);
    options.prefault_kv = false;
    options.run_on_transport_thread = GetParam();
    adjust(options);
    auto server = MemoryServer::Create(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    ASSERT_TRUE(server_->Configure(Config()).ok());
    client_ = std::make_unique<Client>(server_->data_address());
  }
  void TearDown() override {
    client_.reset();
    server_.reset();
  }

  // The scheduler's configuration of this node: pool 3, 1000 slots, steps of 256 rows.
  static MemoryConfig Config() {
    MemoryConfig config;
    config.epoch = kEpoch;
    config.pool = PoolIndex(3);
    config.model.num_layers = kLayers;
    config.model.num_heads = kHeads;
    config.model.num_kv_heads = kKvHeads;
    config.model.head_dim = kDim;
    config.model.kv_dtype = "bf16";
    config.num_slots = 1000;
    config.max_step_rows = kMaxStepRows;
    return config;
  }
  // An independent engine, given the same rows, computes the reference answers.
  static std::unique_ptr<AttentionEngine> ReferenceEngine() {
    AttentionEngineConfig config;
    config.store = {kLayers, kKvHeads, kDim, kernels::KvDType::kBF16, 1000, false};
    config.num_heads = kHeads;
    return *AttentionEngine::Create(config);
  }
  // The answer to mini-batch `m` of `layer` whose layer frame carried `payload`.
  static std::vector<uint8_t> Expected(AttentionEngine& engine, PreparedStep& prepared, int layer,
                                       const MinibatchLayout& m,
                                       const std::vector<uint8_t>& payload) {
    std::vector<uint8_t> want(m.out_bytes);
    const auto* p = reinterpret_cast<const uint16_t*>(payload.data());
    EXPECT_TRUE(engine
                    .AttendRows(prepared, layer, m.begin, m.end, p, p + m.q_bytes / 2,
                                p + (m.q_bytes + m.kv_bytes) / 2,
                                reinterpret_cast<uint16_t*>(want.data()), nullptr)
                    .ok());
    return want;
  }

  // A step of one request: positions [0, n) as a prefill chunk all on the memory node.
  static StepShare Share(uint64_t step, int n) {
    StepShare share;
    share.step_id = step;
    share.epoch = kEpoch;
    share.pool = PoolIndex(3);
    share.num_layers = kLayers;
    std::vector<int32_t> slots(n);
    for (int i = 0; i < n; ++i) slots[i] = 999 - 3 * i;
    share.plan.assignments.push_back({SequenceId(1), PoolIndex(3), 0, slots});
    for (int i = 0; i < n; ++i) share.plan.rows.push_back({SequenceId(1), PoolIndex(3), i, -1});
    share.minibatch_rows = SplitMinibatches(n, 2);
    return share;
  }
  // Share(step, 8) in one mini-batch; with a load ticket (non-zero), that the gate expects.
  StepShare OneMinibatch(uint64_t step, uint64_t ticket = 0) {
    StepShare share = Share(step, 8);
    share.minibatch_rows = {8};
    if (ticket != 0) {
      share.plan.loads.push_back({SequenceId(1), PoolIndex(3), ticket});
      EXPECT_TRUE(server_->load_gate().Expect(ticket, absl::Now() + absl::Seconds(60)));
    }
    return share;
  }
  // From `via` (default: client_).
  void SendStep(const StepShare& share, Client* via = nullptr) {
    const std::string body = EncodeStepShare(share);
    FrameHeader h;
    h.kind = static_cast<uint16_t>(FrameKind::kStep);
    h.step_id = share.step_id;
    h.epoch = kEpoch;
    (via != nullptr ? via : client_.get())
        ->Send(h, {reinterpret_cast<const uint8_t*>(body.data()), body.size()});
  }
  static std::vector<uint8_t> RandomRows(size_t bytes, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    std::vector<uint8_t> out(bytes);
    auto* p = reinterpret_cast<uint16_t*>(out.data());
    for (size_t i = 0; i < bytes / 2; ++i) p[i] = FloatToBf16(normal(rng));
    return out;
  }
  static FrameHeader LayerHeader(uint64_t step, int layer, int minibatch, int rows) {
    FrameHeader h;
    h.kind = static_cast<uint16_t>(FrameKind::kLayer);
    h.step_id = step;
    h.epoch = kEpoch;
    h.layer = layer;
    h.minibatch = minibatch;
    h.rows = rows;
    return h;
  }

  std::unique_ptr<MemoryServer> server_;
  std::unique_ptr<Client> client_;
};

}  // namespace strata::memory_server_testing

#endif  // STRATA_MEMORY_NODE_TESTING_MEMORY_SERVER_FIXTURE_H_
