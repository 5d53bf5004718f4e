// Runs the attention operator of every layer over a node's KV store: the whole job of a
// memory node, and the attention part of a compute node in co-located mode.
//
// Per step: Prepare applies the plan (released tables, slot assignments and the KV shifts
// they carry), validates it
// against the store and resolves its rows into a PreparedStep; AttendRows then, for each
// layer in order and for consecutive ranges of rows (mini-batches), writes the rows' new
// k/v into their assigned slots and computes attention for the rows that attend here. A
// plan that names an unknown request, a position beyond its table or a slot outside the
// store is rejected with InvalidArgument before anything changes, and the engine stays
// usable.
//
// Rows come in three kinds, by their plan's tile_limit:
//   final   (-1): all tiles here; the output is bf16 attention.
//   partial (>0): tiles [0, tile_limit) here; the output is the f32 fold state, which the
//                 caller continues with the remaining tiles (kernels/cpu/attention.h).
//   write    (0): only the row's k/v is stored; it takes no query and gives no output.
//
// Several prepared steps may be alive at once (one per compute node that shares this
// memory node). Slot tables are shared between them copy-on-write: a step keeps the
// tables it resolved even if a later step of another caller changes them.
//
// Thread-safety: Prepare and AttendRows are called from one thread at a time (kernels use
// OpenMP inside).
#ifndef STRATA_MEMORY_NODE_ATTENTION_ENGINE_H_
#define STRATA_MEMORY_NODE_ATTENTION_ENGINE_H_

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/protocol/step_plan.h"
#include "kernels/cpu/attention.h"
#include "memory_node/kv_store.h"

namespace strata {

struct AttentionEngineConfig {
  KvStoreConfig store;
  int num_heads = 0;  // query heads
  float scale = 0.0f;
};

enum class RowKind : uint8_t { kFinal, kPartial, kWrite };

// A step's rows, resolved against the slot tables.
class PreparedStep {
 public:
  uint64_t step_id() const { return step_id_; }
  int num_rows() const { return static_cast<int>(rows_.size()); }
  RowKind kind(int row) const { return kinds_[row]; }
  // Rows in [begin, end) of each kind.
  int CountKind(int begin, int end, RowKind kind) const;

 private:
  friend class AttentionEngine;
  uint64_t step_id_ = 0;
  std::vector<kernels::AttentionRow> rows_;
  std::vector<RowKind> kinds_;
  std::vector<int32_t> write_slots_;                                 // slot of each row's own token
  std::vector<std::shared_ptr<const std::vector<int32_t>>> tables_;  // keeps slots alive
};

class AttentionEngine {
 public:
  static absl::StatusOr<std::unique_ptr<AttentionEngine>> Create(
      const AttentionEngineConfig& config);

  const AttentionEngineConfig& config() const { return config_; }
  const KvStore& store() const { return *store_; }
  // For the disk tier, which loads blocks into slots no step uses meanwhile.
  KvStore& mutable_store() { return *store_; }
  const kernels::AttentionParams& params() const { return params_; }

  absl::StatusOr<PreparedStep> Prepare(const StepKvPlan& plan);

  // For one layer and rows [begin, end) of a prepared step, in row order within each kind:
  //   q:       [final and partial rows][num_heads][head_dim] bf16
  //   k, v:    [all rows][num_kv_heads][head_dim] bf16 (the rows' new tokens)
  //   out:     [final rows][num_heads][head_dim] bf16
  //   partial: [partial rows][num_heads][head_dim + 2] f32 (may be null if there are none)
  absl::Status AttendRows(const PreparedStep& step, int layer, int begin, int end,
                          const uint16_t* q, const uint16_t* k, const uint16_t* v, uint16_t* out,
                          float* partial);

  // The single-caller interface of co-located mode: BeginStep prepares and keeps the step;
  // AttendLayer runs all its rows, with q/k/v/out laid out over every row (rows that do
  // not attend leave their out rows untouched).
  absl::Status BeginStep(const StepKvPlan& plan);
  int num_rows() const { return current_.num_rows(); }
  absl::Status AttendLayer(int layer, const uint16_t* q, const uint16_t* k, const uint16_t* v,
                           uint16_t* out, float* partial_state);

  // Drops every slot table (the KV contents become unreachable garbage).
  void Reset();

  // Positions whose KV a shift moved (context truncation), since creation.
  int64_t shifted_positions() const { return shifted_positions_; }

  // Requests with a slot table, and live (assigned) token positions across them.
  size_t num_tables() const { return tables_.size(); }
  int64_t num_assigned_positions() const;

 private:
  explicit AttentionEngine(const AttentionEngineConfig& config) : config_(config) {}

  AttentionEngineConfig config_;
  kernels::AttentionParams params_;
  std::unique_ptr<KvStore> store_;
  std::unordered_map<SequenceId, std::shared_ptr<std::vector<int32_t>>> tables_;

  // Copies a shift's KV into slots `to` (one per source slot), K re-rotated.
  void ApplyShift(const KvShift& shift, const int32_t* to);

  PreparedStep current_;  // of BeginStep
  std::vector<uint16_t> shift_rows_;
  int64_t shifted_positions_ = 0;
  std::vector<uint16_t> q_gather_, out_gather_;
  std::vector<float> state_;
  std::vector<kernels::AttentionRow> kernel_rows_;
};

}  // namespace strata

#endif  // STRATA_MEMORY_NODE_ATTENTION_ENGINE_H_
