// Disaggregated mode: attention runs on memory nodes over the data plane.
//
// Per step, each memory node that holds rows of the batch (or has slot-table changes) gets
// a step descriptor with its share; then, per layer, one frame per mini-batch with the q,
// k and v rows of its requests, and it answers with the attention output rows. All
// mini-batches of all memory nodes are sent before any answer is awaited, so the transfer
// of mini-batch i+1 overlaps attention on mini-batch i at the memory node, and answers
// stream back while later mini-batches compute.
//
// Prefill chunks follow the policy (docs/architecture.md, "A step of decoding"):
//   "split"  (Lamina): for a chunk starting at position s, the memory node folds the tiles
//            below ceil(s / 64) (the cached prefix, and the chunk's share of the tile that
//            straddles s) and returns the fold state; this node continues the fold over the
//            chunk's own tiles from the chunk's k/v rows, and computes whole chunks that
//            start at 0 itself (the memory node only stores their k/v).
//   "memory": memory nodes compute all attention.
// Both give the same bits as co-located attention: the fold over tiles is the same, only
// where each tile is folded changes.
//
// Failures: a memory node that cannot be reached, closes, answers an error, sends a frame
// that fails its checks, or misses the per-layer deadline loses only its own rows: their
// requests are reported by EndStep (the dead or hung node among dead_pools), their output
// rows are zeros, and the step goes on for everyone else.
//
// Rotational pipelining (rotation.h): a lane with an endpoint id announces it to every
// memory node it connects to (a kHello frame). A routed step's layer frames name the
// endpoint of the replica that runs the batch's next slice, and the memory nodes answer
// there; the receiving lane registers what it expects with ExpectLayer and learns that it
// has all of it from LayerSettled (or the on_settled callback). Answers that arrive before
// this lane has its plan (the plan travels on another connection) are kept and replayed.
// Rotated steps leave all attention to the memory nodes (prefill policy "memory").
//
// Thread-safety: BeginStep/Attend/EndStep from the step thread; SetMemoryNodes from any.
#ifndef STRATA_COMPUTE_NODE_REMOTE_ATTENTION_H_
#define STRATA_COMPUTE_NODE_REMOTE_ATTENTION_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/base/enum_names.h"
#include "common/base/stopwatch.h"
#include "common/model/model_config.h"
#include "common/protocol/attention_wire.h"
#include "common/protocol/node_config.h"
#include "common/transport/frame.h"
#include "common/transport/transport.h"
#include "compute_node/attention_backend.h"

namespace strata {

// Where a prefill chunk attends to itself: kSplit on the compute node (the cached prefix on
// the memory node, the two merged), kMemory all on the memory node.
enum class PrefillPolicy { kSplit, kMemory };
inline constexpr EnumName<PrefillPolicy> kPrefillPolicyNames[] = {
    {PrefillPolicy::kSplit, "split"}, {PrefillPolicy::kMemory, "memory"}};
inline bool AbslParseFlag(absl::string_view text, PrefillPolicy* out, std::string* error) {
  return ParseEnumName(text, kPrefillPolicyNames, out, error);
}
inline std::string AbslUnparseFlag(PrefillPolicy p) { return EnumNameOf(p, kPrefillPolicyNames); }

struct RemoteAttentionOptions {
  transport::TransportConfig transport;
  int minibatches = 2;          // per memory node and layer; 1: no overlap
  int min_minibatch_rows = 16;  // fewer rows than this per mini-batch: fewer of them
  PrefillPolicy prefill_policy = PrefillPolicy::kSplit;
  absl::Duration layer_timeout = absl::Seconds(10);
  // How long WaitLayer progresses the transport on the step thread, waiting for a layer's
  // answers, before it sleeps until the transport thread wakes it (Transport::ProgressUntil).
  // Zero: it sleeps at once.
  absl::Duration answer_spin = absl::Microseconds(200);
  bool verify_checksums = true;
  // Called on the step thread after each layer with the seconds from its first send to its
  // last answer (the attention round trip); may be empty.
  std::function<void(double seconds)> on_layer_round_trip;
  // Rotational pipelining: this lane's endpoint id (not zero), and a callback, from the
  // transport thread, for when the layer this lane expects has every answer in (or a peer
  // is lost). It is not called once the destructor has begun.
  uint64_t endpoint = 0;
  std::function<void()> on_settled;
};

struct RemoteAttentionStats {
  uint64_t steps = 0;
  uint64_t layer_frames = 0;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t checksum_failures = 0;
  uint64_t error_frames = 0;
  uint64_t stale_frames = 0;
  uint64_t timeouts = 0;
  uint64_t early_frames = 0;  // routed answers that came before their plan (kept)
  // Answers the waiting step thread took off the transport itself (answer_spin), rather
  // than the transport thread.
  uint64_t answers_polled = 0;
  // The transport thread's sleeps that missed a wake-up (Transport::LostWakeups; 0 unless
  // something is wrong).
  int64_t lost_wakeups = 0;
  struct PeerBytes {
    uint64_t sent = 0;
    uint64_t received = 0;
  };
  std::map<std::string, PeerBytes> by_peer;  // by memory-node name (filled by stats())

  // Adds another data plane's counters (a compute node's lanes each have one).
  RemoteAttentionStats& operator+=(const RemoteAttentionStats& o) {
    steps += o.steps;
    layer_frames += o.layer_frames;
    bytes_sent += o.bytes_sent;
    bytes_received += o.bytes_received;
    checksum_failures += o.checksum_failures;
    error_frames += o.error_frames;
    stale_frames += o.stale_frames;
    timeouts += o.timeouts;
    early_frames += o.early_frames;
    answers_polled += o.answers_polled;
    lost_wakeups += o.lost_wakeups;
    for (const auto& [peer, bytes] : o.by_peer) {
      by_peer[peer].sent += bytes.sent;
      by_peer[peer].received += bytes.received;
    }
    return *this;
  }
};

class RemoteAttention : public AttentionBackend, public transport::MessageHandler {
 public:
  static absl::StatusOr<std::unique_ptr<RemoteAttention>> Create(const ModelConfig& config,
                                                                 RemoteAttentionOptions options);
  ~RemoteAttention() override;

  // The memory nodes of the current scheduler epoch, by pool. Nodes whose address changed
  // are reconnected at the next step.
  void SetMemoryNodes(uint64_t epoch, const std::vector<MemoryNodeAddress>& nodes);
  transport::Capabilities capabilities() const { return transport_->capabilities(); }
  RemoteAttentionStats stats() const;

  absl::Status BeginStep(const StepKvPlan& plan) override;
  absl::Status Attend(int layer, BatchBuffers& b, int64_t m) override;
  absl::Status SendLayer(int layer, BatchBuffers& b, int64_t m) override;
  absl::Status WaitLayer(int layer, BatchBuffers& b, int64_t m) override;
  AttentionStepOutcome EndStep() override;
  // Gives up the step in flight: no answer lands in its buffers after this returns (the
  // buffers may then be freed). The next BeginStep starts afresh.
  void AbandonStep();

  // Rotational pipelining. A routed step: `send_descriptors` on the replica that runs the
  // step's first slice (the others only lay out the shares, to know what to expect), with
  // `reply_to` the endpoint that gets layer 0's answers (and the memory nodes' complaints
  // about the descriptor).
  absl::Status BeginRoutedStep(const StepKvPlan& plan, bool send_descriptors,
                               uint64_t reply_to) override;
  // Sends the layer's frames with answers going to endpoint `reply_to`; expects nothing.
  absl::Status SendLayerTo(int layer, BatchBuffers& b, int64_t m, uint64_t reply_to) override;
  // Expects the answers of `layer`, sent by another replica, into b.attn; the deadline
  // counts from here. WaitLayer then completes it.
  absl::Status ExpectLayer(int layer, BatchBuffers& b, int64_t m) override;
  // Whether every answer of the expected layer is in (or its peer is dead), or its deadline
  // (LayerDeadline) has passed.
  bool LayerSettled() const override;
  absl::Time LayerDeadline() const override;
  void ContextArrivedAt(absl::Time when) override;
  // Connects to every memory node now (a routed answer needs this lane's hello there first).
  void ConnectAll();
  // The pools whose shares failed in this step, which the context handed on names, so that
  // the replicas after this one expect no answers from them.
  std::vector<PoolIndex> FailedPools() const override;
  void FailPools(std::span<const PoolIndex> pools, const absl::Status& why) override;
  void Abandon() override { AbandonStep(); }

  // transport::MessageHandler (the transport thread).
  std::span<uint8_t> Place(transport::PeerId from, std::span<const uint8_t> header,
                           size_t payload_bytes) override;
  void Deliver(transport::PeerId from, std::span<const uint8_t> header,
               std::span<const uint8_t> payload, absl::Status status) override;

 private:
  struct Pool {
    std::string name;
    std::string address;
    transport::PeerId peer = 0;  // 0: not connected
  };
  // One memory node's part of the current step.
  struct Share {
    PoolIndex pool;
    transport::PeerId peer = 0;
    int first_row = 0;  // rows [first_row, first_row + rows) of the batch
    StepShare share;
    std::vector<MinibatchLayout> layouts;
    bool failed = false;
    absl::Status why;  // why it failed, with the memory node's code where it sent one
  };
  // An answer this node waits for: one per (share, mini-batch) of the current layer.
  struct Expected {
    size_t share = 0;
    int minibatch = 0;
    transport::PeerId peer = 0;
    std::span<uint8_t> dest;  // where the result payload lands: staging's bytes
    // Shared with placed_ while the transport may still write it, so that it outlives a
    // wait that gave up.
    std::shared_ptr<std::vector<uint8_t>> staging;
    bool arrived = false;
    absl::Status status;
  };
  // Rows whose attention this node computes (split prefill).
  struct LocalRow {
    int row = 0;  // batch row
    int32_t position = 0;
    int32_t first_tile = 0;  // fold tiles [first_tile, end) here; 0: all of it here
    size_t slots = 0;        // index into local_slots_
  };

  RemoteAttention(const ModelConfig& config, RemoteAttentionOptions options);
  // Whether a batch of m rows is the current step's.
  absl::Status CheckRows(int64_t m) const;
  // Whether every answer of the current layer is in, or its peer is dead (mu_ held).
  bool LayerSettledLocked() const;
  void FailShare(Share& share, const absl::Status& why, bool dead);
  absl::Status ConnectPool(PoolIndex pool, Share& share);
  void RunLocal(const std::vector<const LocalRow*>& rows, BatchBuffers& b, const float* states);
  // Lays out the step's shares; sends each memory node its descriptor when `send` (with
  // `reply_to` in its header).
  absl::Status StartStep(const StepKvPlan& plan, bool send, uint64_t reply_to);
  // Fails the shares whose memory node gave up on the step (an error frame).
  void FailSharesWithErrors();
  // Calls options_.on_settled unless this object is being destroyed (mu_ held).
  void NotifySettledLocked();
  // Registers the answers of `layer`, each into a buffer of its own (mu_ held).
  void ExpectLocked(int layer);
  // Deliver's work once the frame is parsed (mu_ held).
  void DeliverLocked(transport::PeerId from, const transport::FrameHeader& h,
                     std::span<const uint8_t> payload, const absl::Status& status);

  ModelConfig config_;
  AttentionDims dims_;
  RemoteAttentionOptions options_;
  std::unique_ptr<transport::Transport> transport_;

  std::mutex connect_mu_;  // held while connecting to a pool
  std::mutex config_mu_;
  uint64_t epoch_ = 0;
  std::atomic<uint64_t> epoch_now_{0};  // epoch_, readable under mu_
  bool expecting_routed_ = false;       // the layer waited for was sent by another replica
  std::map<PoolIndex, Pool> pools_;

  // Step state (step thread), with `expected_` and the counters shared with the transport
  // thread under mu_.
  uint64_t step_id_ = 0;
  int rows_ = 0;
  std::vector<Share> shares_;
  std::vector<LocalRow> local_rows_;
  std::vector<std::vector<int32_t>> local_slots_;  // per chunk: position -> batch row
  AttentionStepOutcome outcome_;
  Stopwatch layer_watch_;  // from the first send of the layer in flight

  // The RemoteAttention whose WaitLayer is polling the transport on this thread (answers
  // delivered meanwhile count as answers_polled); null elsewhere.
  static thread_local const RemoteAttention* polling_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int layer_ = -1;
  std::vector<Expected> expected_;
  // When the wait for the layer in flight gives up on answers still out (InfiniteFuture
  // once it is over): a layer timeout after its first send, or after ExpectLayer, or after
  // its context came (ContextArrivedAt).
  absl::Time expected_deadline_ = absl::InfiniteFuture();
  // The buffers Place gave the transport, by address, until it delivers their frames (a
  // peer that dies mid-transfer may leave its buffer here for good).
  std::unordered_map<const uint8_t*, std::shared_ptr<std::vector<uint8_t>>> placed_;
  std::unordered_map<transport::PeerId, bool> dead_peers_;
  std::unordered_map<transport::PeerId, absl::Status> pending_errors_;  // step-level errors
  // Bytes per connection (under mu_), named by memory node in stats().
  struct PeerTraffic {
    std::string name;
    RemoteAttentionStats::PeerBytes bytes;
  };
  std::unordered_map<transport::PeerId, PeerTraffic> peer_traffic_;
  RemoteAttentionStats stats_;
  bool closing_ = false;
  // Routed answers of steps this lane has not begun yet (mu_), replayed by ExpectLayer.
  struct Early {
    transport::PeerId from = 0;
    transport::FrameHeader header;
    std::vector<uint8_t> payload;
    absl::Status status;
  };
  std::vector<Early> early_;
  static constexpr size_t kMaxEarly = 256;
};

}  // namespace strata

#endif  // STRATA_COMPUTE_NODE_REMOTE_ATTENTION_H_
