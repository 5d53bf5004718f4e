// Where a compute node's attention runs: locally over its own KV cache (co-located mode)
// or on memory nodes over the transport (disaggregated mode). The forward pass calls it
// once per layer between PreAttention and PostAttention.
#ifndef STRATA_COMPUTE_NODE_ATTENTION_BACKEND_H_
#define STRATA_COMPUTE_NODE_ATTENTION_BACKEND_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/protocol/step_plan.h"
#include "compute_node/model_runner.h"
#include "memory_node/attention_engine.h"
#include "memory_node/load_gate.h"

namespace strata {

// What went wrong for part of a step, and what the step cost on the wire.
struct AttentionStepOutcome {
  std::vector<PoolIndex> dead_pools;  // memory nodes found dead or hung during the step
  // Requests whose rows got no attention output (their results must be discarded).
  std::vector<std::pair<SequenceId, absl::Status>> failed;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t wait_us = 0;   // time spent waiting for memory nodes
  uint64_t send_us = 0;   // building and posting layer frames (checksums included)
  uint64_t merge_us = 0;  // after the answers: scattering and local continuation
};

class AttentionBackend {
 public:
  virtual ~AttentionBackend() = default;
  // Once per step, before layer 0. The plan's rows are the batch's rows, in order, grouped
  // by pool.
  virtual absl::Status BeginStep(const StepKvPlan& plan) = 0;
  // Reads b.q, b.k, b.v for rows [0, m) and writes b.attn. An error fails the whole step;
  // a memory node that fails only fails its own rows (see EndStep).
  virtual absl::Status Attend(int layer, BatchBuffers& b, int64_t m) = 0;
  // Attend in two halves, so that the calling thread can do other work while a layer's
  // attention is away (two batches in flight, step_engine.h): SendLayer starts it (reads
  // b.q, b.k, b.v), WaitLayer completes it (writes b.attn). Between them nothing may touch
  // `b`. A backend that computes in place does all of it in SendLayer.
  virtual absl::Status SendLayer(int layer, BatchBuffers& b, int64_t m) {
    return Attend(layer, b, m);
  }
  virtual absl::Status WaitLayer(int /*layer*/, BatchBuffers& /*b*/, int64_t /*m*/) {
    return absl::OkStatus();
  }
  // After the last layer (or after a failure): partial failures and costs of the step.
  virtual AttentionStepOutcome EndStep() { return {}; }

  // Rotational pipelining (compute_node/rotation.h): a layer's answers go to the replica
  // that runs the batch's next slice. Only RemoteAttention routes; the others say so.
  virtual absl::Status BeginRoutedStep(const StepKvPlan& /*plan*/, bool /*send_descriptors*/,
                                       uint64_t /*reply_to*/) {
    return absl::UnimplementedError("this attention backend cannot route answers");
  }
  virtual absl::Status SendLayerTo(int /*layer*/, BatchBuffers& /*b*/, int64_t /*m*/,
                                   uint64_t /*reply_to*/) {
    return absl::UnimplementedError("this attention backend cannot route answers");
  }
  virtual absl::Status ExpectLayer(int /*layer*/, BatchBuffers& /*b*/, int64_t /*m*/) {
    return absl::UnimplementedError("this attention backend cannot route answers");
  }
  virtual bool LayerSettled() const { return true; }
  // When the wait for the expected layer gives up on the answers still out (LayerSettled
  // turns true then); InfiniteFuture when no layer is expected.
  virtual absl::Time LayerDeadline() const { return absl::InfiniteFuture(); }
  // The context of the expected layer came at `when`: the answers routed here left the
  // replica before with it, so their wait's deadline counts from then at the latest (a
  // replica before may have waited a whole deadline itself for a hung memory node).
  virtual void ContextArrivedAt(absl::Time /*when*/) {}
  // The pools whose memory nodes failed their share of the routed step: their rows go on
  // with zero attention, and their requests are among EndStep's failed.
  virtual std::vector<PoolIndex> FailedPools() const { return {}; }
  // Fails the shares of `pools`, whose memory nodes failed the step on a replica before
  // this one (`why`): no answers of theirs are expected any more.
  virtual void FailPools(std::span<const PoolIndex> /*pools*/, const absl::Status& /*why*/) {}
  // Gives up the step in flight: no answer lands in the batch's buffers afterwards.
  virtual void Abandon() {}
};

// The attention kernels' type of the model's KV cache (ModelConfig::kv_cache_dtype).
inline kernels::KvDType KvCacheType(const ModelConfig& c) {
  return c.kv_cache_dtype == DType::kF16 ? kernels::KvDType::kF16 : kernels::KvDType::kBF16;
}

// The KV cache type named `name` (kernels::kKvDTypeNames: "bf16" or "f16") as a
// ModelConfig::kv_cache_dtype, or InvalidArgument naming the choices.
absl::StatusOr<DType> ParseKvCacheType(absl::string_view name);

// Co-located mode: the memory node's AttentionEngine, in process.
class LocalAttention : public AttentionBackend {
 public:
  static absl::StatusOr<std::unique_ptr<LocalAttention>> Create(const ModelConfig& config,
                                                                int64_t num_slots, bool prefault);
  absl::Status BeginStep(const StepKvPlan& plan) override;
  absl::Status Attend(int layer, BatchBuffers& b, int64_t m) override;
  AttentionEngine& engine() { return *engine_; }
  // Layer-wise pre-loading: each layer waits here for the step's loads (the node's disk
  // tier publishes their progress).
  void set_load_gate(LoadGate* gate) { gate_ = gate; }

 private:
  std::unique_ptr<AttentionEngine> engine_;
  LoadGate* gate_ = nullptr;
  std::vector<uint64_t> tickets_;  // of the step in progress
};

// Runs embedding and every layer for the batch (no logits).
absl::Status ForwardLayers(const ModelRunner& runner, AttentionBackend& attention, BatchBuffers& b,
                           const StepKvPlan& plan, const int32_t* tokens);

}  // namespace strata

#endif  // STRATA_COMPUTE_NODE_ATTENTION_BACKEND_H_
