// Attention backends for benchmarks that time decode steps without a prefill: co-located
// attention with a KV cache already filled, and attention that does nothing.
#ifndef STRATA_COMPUTE_NODE_BENCH_FILLED_ATTENTION_H_
#define STRATA_COMPUTE_NODE_BENCH_FILLED_ATTENTION_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "common/model/model_config.h"
#include "compute_node/attention_backend.h"

namespace strata::bench {

// Attention for sequences 1..`batch`, each holding `positions` slots in one contiguous run
// (pre-faulted), begun for a step. Every slot's K is random in [-1, 1] and its V is -K:
// attention's cost does not depend on the values.
absl::StatusOr<std::unique_ptr<LocalAttention>> FilledLocalAttention(const ModelConfig& config,
                                                                     int batch, int64_t positions);

// One decode step of those sequences, each one row at `position` (in pool 0).
StepKvPlan FilledDecodePlan(int batch, int position);

// Attention that does nothing: the GEMM-only baseline.
class NoAttention : public AttentionBackend {
 public:
  absl::Status BeginStep(const StepKvPlan&) override { return absl::OkStatus(); }
  absl::Status Attend(int, BatchBuffers&, int64_t) override { return absl::OkStatus(); }
};

}  // namespace strata::bench

#endif  // STRATA_COMPUTE_NODE_BENCH_FILLED_ATTENTION_H_
