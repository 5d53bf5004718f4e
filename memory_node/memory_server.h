// The memory node: a KV store plus the attention over it, served on the data plane.
//
// Compute nodes connect to its transport and send, per step, a step descriptor (their
// share of the step: slot-table changes and rows) and then one layer frame per layer and
// mini-batch (common/protocol/attention_wire.h). For each layer frame the server writes the
// rows' k/v into the slots the scheduler assigned, runs attention, and answers with a
// layer-result frame, or an error frame that says why. Frames are checked (header,
// step, sizes, checksum) before anything is written; a bad frame is answered with an
// error and counted, and the server keeps serving. Its slot tables are changed only by
// descriptors, and it writes only to slots a descriptor assigned. A layer frame's claim
// (its rows and size) is checked against the configuration (MemoryConfig::max_step_rows,
// the model's row sizes) before a buffer is placed for its payload, and the frames of one
// peer received and not yet finished hold at most a budget of bytes
// (MemoryServerOptions::max_held_bytes_per_peer): past it a frame is refused
// (ResourceExhausted), not queued.
//
// Rotational pipelining (compute_node/rotation.h) routes a step: its descriptor and layer
// frames carry the endpoint id of the compute replica that runs the next slice of the batch
// (FrameHeader::reserved), and the server answers that endpoint, which announced itself
// with a kHello frame on its own connection, instead of the sender. A routed step is keyed
// by its id, since its layers arrive from different replicas; it is let go once every layer
// frame has been answered, or when more than kMaxRoutedSteps are open (the oldest first:
// a replica died mid-rotation).
//
// Threads: the transport thread receives frames into pooled buffers; a frame with nothing
// ahead of it runs right there, and frames that arrive while one runs are posted to the
// worker's event loop, in arrival order (attention itself uses the OpenMP team of the
// thread that runs it). So a mini-batch's transfer overlaps the previous mini-batch's
// attention. A layer frame whose step's loads have not brought its layer into DRAM does
// not wait on that thread: it is parked, with its peer's later frames behind it, and runs
// on the worker once the load gate moves (other peers' frames go on meanwhile).
//
// Thread-safety: public methods may be called from any thread.
#ifndef STRATA_MEMORY_NODE_MEMORY_SERVER_H_
#define STRATA_MEMORY_NODE_MEMORY_SERVER_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/event_loop.h"
#include "common/base/trace.h"
#include "common/protocol/attention_wire.h"
#include "common/protocol/node_config.h"
#include "common/transport/frame.h"
#include "common/transport/transport.h"
#include "memory_node/attention_engine.h"
#include "memory_node/kv_disk_host.h"

namespace strata {

struct MemoryServerOptions {
  transport::TransportConfig transport;
  std::string data_address = "127.0.0.1:0";  // where compute nodes connect
  bool verify_checksums = true;
  bool prefault_kv = true;
  // A frame with nothing queued ahead of it runs on the transport thread that received
  // it, which saves a thread wake-up per frame; frames that arrive meanwhile queue for the
  // worker thread (and overlap with the attention). memory_node's main sets it only for a
  // single attention thread: otherwise two threads would run parallel regions.
  bool run_on_transport_thread = true;
  // Records each layer frame's attention on the track of the connection it came on (one per
  // compute node lane); null: nothing is recorded. Must outlive the server.
  TraceRecorder* trace = nullptr;
  // The disk tier under the KV store (dir empty: none). It is opened, empty, at each
  // configuration that asks for one (MemoryConfig::disk_block_tokens).
  KvDiskTierOptions disk;
  // The bytes of one peer's frames received and not yet finished (queued behind a frame
  // that runs, or waiting for the disk). 0: kFramesPerPeer of the largest layer frame the
  // configuration allows, and at least the largest other frame. A compute node has a few
  // layer frames in flight here at once (its lanes' mini-batches of one layer).
  uint64_t max_held_bytes_per_peer = 0;
  // The same over all peers together. 0: kPeersAtBudget peers' budgets.
  uint64_t max_held_bytes = 0;
};

struct MemoryServerStats {
  uint64_t steps = 0;
  uint64_t layer_frames = 0;
  uint64_t rows = 0;
  uint64_t bytes_received = 0;
  uint64_t bytes_sent = 0;
  uint64_t checksum_failures = 0;
  uint64_t malformed_frames = 0;  // bad header, size, step or layer
  uint64_t rejected_steps = 0;    // descriptors that did not apply
  double attention_seconds = 0;
  int64_t kv_slots = 0;
  int64_t kv_positions = 0;  // assigned positions over all tables
  uint64_t tables = 0;
  uint64_t peers = 0;
  uint64_t peers_left = 0;
  uint64_t departed_frames = 0;      // delivered after their sender left, dropped
  uint64_t frames_over_budget = 0;   // refused: their peer's, or all peers', budget was full
  uint64_t held_bytes_peak = 0;      // the most bytes one peer's frames held at once
  uint64_t held_bytes_all_peak = 0;  // the most bytes all peers' frames held at once
  uint64_t parked_frames = 0;        // now: waiting behind a layer frame that waits for loads
  uint64_t inline_frames = 0;        // taken on the transport thread (a parked peer's queue there)
};

class MemoryServer : public transport::MessageHandler {
 public:
  // Starts the transport and listens; attention starts once configured.
  static absl::StatusOr<std::unique_ptr<MemoryServer>> Create(MemoryServerOptions options);
  ~MemoryServer() override;

  const std::string& data_address() const { return data_address_; }
  transport::Capabilities capabilities() const { return transport_->capabilities(); }

  // From the scheduler: the model shape and the number of KV slots. A new epoch drops every
  // table of the previous one (the KV store is reused when its shape is unchanged).
  absl::StatusOr<MemoryConfigAck> Configure(const MemoryConfig& config);
  NodeStatus Status() const;
  MemoryServerStats stats() const;

  // From the scheduler: moves between the KV store and the disk tier (kv_disk_tier.h), one
  // status each. FailedPrecondition for another epoch or without a disk tier.
  absl::StatusOr<std::vector<absl::Status>> MoveKv(uint64_t epoch, uint64_t tier,
                                                   std::span<const KvMove> moves,
                                                   absl::Time deadline = absl::InfiniteFuture());
  // The disk tier (its counters: disk().stats()).
  const KvDiskHost& disk() const { return disk_; }
  // Where layer frames of loading requests wait for their layers (layer-wise pre-loading).
  LoadGate& load_gate() { return disk_.gate(); }

  // transport::MessageHandler (the transport thread).
  std::span<uint8_t> Place(transport::PeerId from, std::span<const uint8_t> header,
                           size_t payload_bytes) override;
  void Deliver(transport::PeerId from, std::span<const uint8_t> header,
               std::span<const uint8_t> payload, absl::Status status) override;

 private:
  struct Work {
    transport::PeerId peer = 0;
    std::vector<uint8_t> header;
    // The header as parsed once, on arrival (Deliver), and what is wrong with it; a peer's
    // departure has none.
    transport::FrameHeader frame;
    absl::Status parsed = absl::InvalidArgumentError("no frame header");
    std::shared_ptr<std::vector<uint8_t>> payload;
    absl::Status status;
    uint64_t held = 0;  // bytes counted against the peer's budget until it is finished
    // A layer frame of a step with loads: when it was first parked for them (never:
    // InfiniteFuture), and the load gate's verdict once it goes on.
    absl::Time parked_since = absl::InfiniteFuture();
    absl::Status gate;
    bool over_budget = false;  // refused for its peer's budget (counted as such, not malformed)
  };
  struct PeerState {
    bool has_step = false;
    StepShare share;
    PreparedStep prepared;
    std::vector<MinibatchLayout> layouts;
    absl::Status error;      // not OK: the step failed; its layer frames get this error
    size_t frames_left = 0;  // routed steps: layer frames not yet answered
  };
  static constexpr size_t kMaxRoutedSteps = 64;
  // Frames other than a layer's (step descriptors, hellos, errors) are small: a descriptor
  // carries a step's rows and slot assignments. Past this they are refused without a copy.
  static constexpr uint64_t kMaxSmallFrame = uint64_t{64} << 20;

  explicit MemoryServer(MemoryServerOptions options)
      : options_(std::move(options)), disk_(options_.disk) {}
  // Runs `work` inline (nothing ahead of it but parked frames) or posts it to the worker.
  void Enqueue(Work work);
  // Handles `work` unless the server is stopping, then lets its buffer go and counts it done;
  // or parks it (ParkForLoads), or queues it behind its peer's parked frames.
  void Finish(Work& work, bool is_inline);
  // Lets `work`'s buffer go and counts it done.
  void Done(Work& work, bool is_inline);
  // Under pending_mu_: a frame left the caller's hands (finished or parked); an inline one
  // frees the transport thread for the next. Wakes whoever waits on pending_cv_.
  void LeftLocked(bool is_inline);
  // Layer-wise pre-loading: a layer frame whose step's loads do not have its layer in DRAM
  // yet is parked (true: `work` is moved into parked_) instead of holding up the thread, so
  // that other peers' frames go on meanwhile; else its gate verdict is set (false).
  bool ParkForLoads(Work& work);
  // On the worker: runs each peer's parked frames, in order, up to one that must wait still.
  // Called when the load gate changes, and at the deadline of a parked frame's loads.
  void ResumeParked();
  // Posts one ResumeParked to the worker, unless one is posted and has not started yet.
  void PostResume();
  void Handle(Work& work);
  void HandleStep(transport::PeerId peer, const transport::FrameHeader& header,
                  std::span<const uint8_t> payload);
  void HandleLayer(transport::PeerId peer, const transport::FrameHeader& header,
                   std::span<const uint8_t> payload, const absl::Status& gate);
  void SendError(transport::PeerId peer, const transport::FrameHeader& about,
                 const absl::Status& why);
  // The step a frame belongs to: the sender's, or the routed step of that id (engine_mu_
  // held); null if none.
  PeerState* FindStepLocked(transport::PeerId peer, const transport::FrameHeader& header);
  // Where the answer to a frame goes: the sender, or the endpoint it names (engine_mu_
  // held); 0 if that endpoint is not connected.
  transport::PeerId ReplyPeerLocked(transport::PeerId peer, const transport::FrameHeader& header);
  std::shared_ptr<std::vector<uint8_t>> Buffer(size_t bytes);
  // Hands a buffer back for reuse once nothing else holds it.
  void Recycle(std::shared_ptr<std::vector<uint8_t>> buffer);
  // Whether a layer frame's claim (its rows and payload size) fits a step this node could be
  // given: at most max_step_rows rows, a payload its rows fill. Checked before a buffer is
  // placed for it, so that a claim past the configuration allocates nothing.
  absl::Status LayerClaimFits(const transport::FrameHeader& header, size_t payload_bytes) const;
  uint64_t MaxStepRows() const;  // the configuration's (0: not bounded)
  // Counts `bytes` more of `peer`'s frames as held, unless that would pass its budget or
  // the budget of all peers' frames.
  bool Hold(transport::PeerId peer, uint64_t bytes);
  void Unhold(transport::PeerId peer, uint64_t bytes);
  // A departed peer's frames count no more against all peers' budget: those the transport
  // still delivers are dropped, and one placed but never delivered would count for good.
  void Forget(transport::PeerId peer);
  uint64_t HeldBudget() const;                      // per peer
  uint64_t HeldBudgetAll(uint64_t per_peer) const;  // all peers together, from HeldBudget()
  // Deliver: why a layer frame Place gave no buffer is refused for its claim (OK: it is not
  // a layer frame whose claim could be judged, or its claim fits).
  absl::Status UnplacedLayerClaim(const Work& work, size_t payload_bytes) const;

  MemoryServerOptions options_;
  std::unique_ptr<transport::Transport> transport_;
  std::string data_address_;

  // The disk tier, reopened at each configuration (closed before the store may go).
  KvDiskHost disk_;

  // Engine and configuration, guarded by engine_mu_ (worker and Configure).
  mutable std::mutex engine_mu_;
  std::unique_ptr<AttentionEngine> engine_;
  AttentionDims dims_;
  // The frame dtype of the k and v rows this node takes: its store's (bf16 or f16).
  std::atomic<uint16_t> kv_frame_dtype_{0};
  uint64_t epoch_ = 0;
  PoolIndex pool_;
  std::unordered_map<transport::PeerId, PeerState> peers_;
  std::map<uint64_t, PeerState> routed_;                       // by step id
  std::unordered_map<uint64_t, transport::PeerId> endpoints_;  // announced by kHello
  // Peers that left (their ids are never reused): what the transport still delivers of
  // theirs afterwards is dropped, not applied to a step let go of already.
  std::unordered_set<transport::PeerId> departed_;

  // What a layer frame may claim, set by Configure (before it: nothing is placed).
  struct FrameLimits {
    uint64_t max_rows = 0;  // 0: not bounded by rows
    size_t row_min = 0;     // bytes of a row's k and v (a row that only writes)
    size_t row_max = 0;     // and its q; 0: not configured
  };
  mutable std::mutex limits_mu_;
  FrameLimits limits_;  // guarded by limits_mu_

  // Buffers placed and not yet delivered, by data pointer (transport thread only). Each
  // leaves in its Deliver, which comes for every placed payload, with an error if its
  // sender died mid-transfer (Transport's contract, where the transport detects dead peers).
  std::unordered_map<const uint8_t*, std::shared_ptr<std::vector<uint8_t>>> placed_;

  // Frames that could not run inline run here, in arrival order.
  EventLoop worker_{"memory-worker"};
  std::mutex pending_mu_;
  std::condition_variable pending_cv_;
  int pending_ = 0;              // frames handed on and not yet finished; guarded by pending_mu_
  bool inline_busy_ = false;     // a frame runs on the transport thread; guarded by pending_mu_
  bool resume_waiting_ = false;  // ResumeParked waits for inline_busy_; guarded by pending_mu_
  bool stop_ = false;            // guarded by pending_mu_
  // Bytes of each peer's frames received and not yet finished; guarded by pending_mu_.
  std::unordered_map<transport::PeerId, uint64_t> held_;
  uint64_t held_all_ = 0;  // their sum; guarded by pending_mu_
  // Peers whose layer frame waits for its loads: that frame first, then the peer's frames
  // that came after it, in order; guarded by pending_mu_ (each counts in pending_).
  std::unordered_map<transport::PeerId, std::deque<Work>> parked_;
  // Frames in parked_, read by the gate's listener; changed under pending_mu_.
  std::atomic<size_t> parked_count_{0};
  std::atomic<uint64_t> inline_frames_{0};  // MemoryServerStats::inline_frames
  std::atomic<bool> resume_posted_{false};
  absl::Time next_wake_ = absl::InfiniteFuture();  // of the timer armed; guarded by pending_mu_
  // Layer frames Place refused for their peer's budget, by peer and header, until Deliver
  // (transport thread only).
  std::set<std::pair<transport::PeerId, std::string>> refused_for_budget_;

  std::mutex pool_mu_;
  std::vector<std::shared_ptr<std::vector<uint8_t>>> free_buffers_;

  mutable std::mutex stats_mu_;
  MemoryServerStats stats_;
  // Readable without engine_mu_ (heartbeats).
  void PublishKvLocked();
  std::atomic<bool> ready_{false};
  std::atomic<int64_t> kv_slots_{0}, kv_positions_{0};
  std::atomic<uint64_t> tables_{0};
};

}  // namespace strata

#endif  // STRATA_MEMORY_NODE_MEMORY_SERVER_H_
