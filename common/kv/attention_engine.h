// Runs the attention operator of every layer over a node's KV store: the whole job of a
// memory node, and the attention part of a compute node in co-located mode.
//
// Per step: BeginStep applies the plan (released tables, slot assignments) and validates
// it against the store; AttendLayer then, for each layer in order, writes the rows' new k/v
// into their assigned slots and computes attention for every row. A plan that names an
// unknown request, a position beyond its table or a slot outside the store is rejected
// with InvalidArgument before anything is written, and the engine stays usable.
//
// Thread-safety: one step at a time (the caller serialises); kernels use OpenMP inside.
#ifndef STRATA_COMMON_KV_ATTENTION_ENGINE_H_
#define STRATA_COMMON_KV_ATTENTION_ENGINE_H_

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "common/kv/kv_store.h"
#include "common/kv/step_plan.h"
#include "kernels/cpu/attention.h"

namespace strata {

struct AttentionEngineConfig {
  KvStoreConfig store;
  int num_heads = 0;  // query heads
  float scale = 0.0f;
};

class AttentionEngine {
 public:
  static absl::StatusOr<std::unique_ptr<AttentionEngine>> Create(
      const AttentionEngineConfig& config);

  const AttentionEngineConfig& config() const { return config_; }
  const KvStore& store() const { return *store_; }
  const kernels::AttentionParams& params() const { return params_; }

  absl::Status BeginStep(const StepKvPlan& plan);

  // Number of rows of the current step, and how many of them end with a partial state.
  int num_rows() const { return static_cast<int>(rows_.size()); }
  int num_partial_rows() const { return num_partial_; }

  // For one layer of the current step:
  //   q:   [rows][num_heads][head_dim] bf16
  //   k,v: [rows][num_kv_heads][head_dim] bf16 (the rows' new tokens)
  //   out: [rows][num_heads][head_dim] bf16; rows with a partial state are left untouched
  //   partial_state: [num_partial_rows][num_heads][head_dim + 2] f32, in row order, for rows
  //                  whose plan has tile_limit >= 0 (may be null if there are none)
  absl::Status AttendLayer(int layer, const uint16_t* q, const uint16_t* k, const uint16_t* v,
                           uint16_t* out, float* partial_state);

  // Requests with a slot table, and live (assigned) token positions across them.
  size_t num_tables() const { return tables_.size(); }
  int64_t num_assigned_positions() const;

 private:
  explicit AttentionEngine(const AttentionEngineConfig& config) : config_(config) {}

  AttentionEngineConfig config_;
  kernels::AttentionParams params_;
  std::unique_ptr<KvStore> store_;
  std::unordered_map<uint64_t, std::vector<int32_t>> tables_;

  // The current step, resolved.
  std::vector<kernels::AttentionRow> rows_;
  std::vector<int32_t> write_slots_;  // slot of each row's own token
  std::vector<int> final_rows_, partial_rows_;
  int num_partial_ = 0;
  std::vector<uint16_t> q_gather_, out_gather_;
  std::vector<float> state_;
};

}  // namespace strata

#endif  // STRATA_COMMON_KV_ATTENTION_ENGINE_H_
