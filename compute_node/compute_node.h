// The compute node: model weights plus the forward pass, driven by step plans.
//
// It loads and repacks the model at creation. The scheduler's Configure decides where
// attention runs: with no memory nodes, in a local KV cache sized by the node's KV budget
// (co-located mode); otherwise on the memory nodes over the data-plane transport.
//
// Rotational pipelining (rotation.h; options.rotation_batches > 0): the node listens for
// contexts on its own data-plane address (context_address(), reported at registration),
// has one routed lane per batch slot, and runs rotated plans only, by RunRotation. It needs
// memory nodes. One stream at a time drives the lanes.
//
// Thread-safety: lane stages are serialised internally; Configure may be called between
// stages from another thread. A new scheduler (epoch) fails the plans that
// lanes still run.
#ifndef STRATA_COMPUTE_NODE_COMPUTE_NODE_H_
#define STRATA_COMPUTE_NODE_COMPUTE_NODE_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/protocol/node_config.h"
#include "common/protocol/step.h"
#include "compute_node/attention_backend.h"
#include "compute_node/model_runner.h"
#include "compute_node/model_weights.h"
#include "compute_node/remote_attention.h"
#include "compute_node/rotation.h"
#include "compute_node/step_engine.h"
#include "compute_node/step_pipeline.h"
#include "memory_node/kv_disk_host.h"

namespace strata {

struct ComputeNodeOptions {
  std::string model_dir;
  std::string served_model_name;
  int64_t max_model_len = 0;                  // 0: the model's max_position_embeddings
  int64_t max_batch_rows = 2048;              // rows per step
  int64_t local_kv_budget_bytes = 1LL << 30;  // co-located mode
  bool prefault_kv = true;
  // The KV cache's element type, kBF16 or kF16 (ModelConfig::kv_cache_dtype): the scheduler
  // refuses a node whose type is not its own.
  DType kv_cache_dtype = DType::kBF16;
  // Co-located mode: a disk tier under the local KV cache (dir empty: none), opened empty at
  // each configuration that asks for one (ComputeConfig::disk_block_tokens).
  KvDiskTierOptions disk;
  RemoteAttentionOptions remote;  // disaggregated mode
  // Batches in flight in disaggregated mode: 1, or 2 for "--pipelining two" (each lane has
  // its own data-plane connections; see step_pipeline.h). Co-located mode runs one.
  int lanes = 1;
  // Rotational pipelining: batch slots (n; 0: off), where the context exchange listens, and
  // how long a slice waits for its context before failing its batch (main sets it to
  // HandoffTimeout of the attention timeout).
  int rotation_batches = 0;
  std::string context_address = "127.0.0.1:0";
  absl::Duration handoff_timeout = absl::Seconds(10);
  // The timeline of the step engine's lanes (step_engine.h); null: none. Must outlive the node.
  TraceRecorder* trace = nullptr;
  // Called after every step (step thread), e.g. for metrics; may be empty.
  std::function<void(const StepResult&)> on_step;
};

class ComputeNode {
 public:
  static absl::StatusOr<std::unique_ptr<ComputeNode>> Create(const ComputeNodeOptions& options);

  // Sets the topology. Co-located: allocates the local KV cache (once) and opens the disk
  // tier under it, empty. Disaggregated: (re)points the data plane at the memory nodes.
  absl::StatusOr<ComputeConfigAck> Configure(const ComputeConfig& config);
  // Co-located mode: moves between the local KV cache and its disk tier (as a memory node's,
  // memory_node/kv_disk_host.h), one status each.
  absl::StatusOr<std::vector<absl::Status>> MoveKv(uint64_t epoch, uint64_t tier,
                                                   std::span<const KvMove> moves,
                                                   absl::Time deadline = absl::InfiniteFuture());
  // Co-located mode: the disk tier (its counters: disk().stats()).
  const KvDiskHost& disk() const { return *disk_; }
  // Runs plans from `queue` with as many batches in flight as the engine has lanes (two in
  // disaggregated mode with options.lanes = 2, else one), until the queue is closed.
  // Several streams may call it (a scheduler reopens its stream after a failure while the
  // old one drains): the lanes belong to one stream at a time, from its first plan begun to
  // its last lane idle; another stream's next plan waits for that.
  void RunPipelined(PlanQueue& queue, const PlanWaitObserver& on_wait);
  // Before a stream's plans arrive in `queue` (rotational pipelining wakes its driver on
  // them).
  void PrepareQueue(PlanQueue& queue);
  // Rotational pipelining: where the context exchange listens ("" when off).
  std::string context_address() const;
  bool rotational() const { return options_.rotation_batches > 0; }
  // Rotational pipelining: the context exchange's counters (zeros when off).
  ContextExchangeStats context_stats() const;

  ModelShape shape() const;
  NodeStatus Status() const;
  // Null in co-located mode.
  const RemoteAttention* remote() const { return remote_.get(); }
  // The data plane's counters over every lane.
  RemoteAttentionStats remote_stats() const;
  const ModelConfig& model_config() const { return weights_->config; }
  int64_t max_model_len() const { return max_model_len_; }
  int64_t local_kv_slots() const;

 private:
  ComputeNode() = default;
  // After a step on the step thread: counters, the on_step hook, the local KV gauge.
  void AfterStep(const StepResult& result);
  // The lane stages of RunPipelined for the stream `owner` (see Lanes in compute_node.cc).
  class Lanes;
  int NumLanes() const;
  std::optional<StepResult> BeginLane(uint64_t owner, int lane, const StepPlan& plan);
  bool AdvanceLane(int lane);
  StepResult FinishLane(int lane);
  void ReleaseLaneLocked();

  ComputeNodeOptions options_;
  std::unique_ptr<ModelWeights> weights_;
  std::unique_ptr<ModelRunner> runner_;
  int64_t max_model_len_ = 0;
  std::unique_ptr<GrammarVocabulary> grammar_vocabulary_;  // null: no tokenizer

  mutable std::mutex mu_;
  uint64_t epoch_ = 0;
  // Closed before local_'s store goes (a move in progress finishes first).
  std::unique_ptr<KvDiskHost> disk_;
  std::unique_ptr<LocalAttention> local_;
  std::unique_ptr<RemoteAttention> remote_;
  std::unique_ptr<RemoteAttention> remote_second_;  // the second lane's data plane
  std::unique_ptr<StepEngine> engine_;
  uint64_t engine_generation_ = 0;  // counts engines made: lanes of an older one are void
  std::vector<uint64_t> lane_generation_ = std::vector<uint64_t>(2, 0);
  std::vector<uint64_t> lane_step_ = std::vector<uint64_t>(2, 0);  // for an aborted result
  // The stream (RunPipelined call) whose plans the lanes run, and how many; 0: none.
  uint64_t lanes_owner_ = 0;
  int owner_busy_lanes_ = 0;
  std::condition_variable lanes_free_;  // with mu_
  std::atomic<uint64_t> next_owner_{1};
  std::atomic<uint64_t> steps_{0};
  // What heartbeats report, readable without the step lock.
  std::atomic<bool> ready_{false};
  std::atomic<int64_t> kv_slots_total_{0};
  std::atomic<int64_t> kv_slots_used_{0};
  // Disaggregated and configured for this epoch: a new memory-node list for it is applied
  // without the step lock, so that a step waiting on a node that is gone stops waiting.
  // remote_ lives as long as the node once made.
  std::atomic<RemoteAttention*> remote_ready_{nullptr};
  std::atomic<RemoteAttention*> remote_second_ready_{nullptr};
  std::atomic<uint64_t> remote_epoch_{0};

  // Rotational pipelining: made at Create, configured by every Configure. The wakeup goes
  // last: the lanes' and the exchange's transports notify it while they close.
  void RunRotated(PlanQueue& queue);
  // The lanes go before the engine whose buffers their answers land in.
  std::unique_ptr<Wakeup> wakeup_;
  std::unique_ptr<ContextExchange> exchange_;
  std::unique_ptr<StepEngine> rotated_engine_;
  std::vector<std::unique_ptr<RemoteAttention>> rotated_lanes_;
  std::mutex rotation_mu_;  // held by the stream that drives the rotated lanes
  // The epoch rotated plans must carry (Configure's), and that of the rotated engine's
  // cached requests (guarded by rotation_mu_).
  std::atomic<uint64_t> rotated_epoch_{0};
  uint64_t rotated_cached_epoch_ = 0;
  std::atomic<bool> stopping_{false};

 public:
  ~ComputeNode();
};

}  // namespace strata

#endif  // STRATA_COMPUTE_NODE_COMPUTE_NODE_H_
