#include "memory_node/attention_engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "kernels/cpu/rope_shift.h"

namespace strata {

int PreparedStep::CountKind(int begin, int end, RowKind kind) const {
  int n = 0;
  for (int i = begin; i < end; ++i) n += kinds_[i] == kind;
  return n;
}

absl::StatusOr<std::unique_ptr<AttentionEngine>> AttentionEngine::Create(
    const AttentionEngineConfig& config) {
  if (config.num_heads <= 0 || config.store.num_kv_heads <= 0 ||
      config.num_heads % config.store.num_kv_heads != 0) {
    return absl::InvalidArgumentError("num_heads must be a positive multiple of num_kv_heads");
  }
  auto engine = std::unique_ptr<AttentionEngine>(new AttentionEngine(config));
  ASSIGN_OR_RETURN(engine->store_, KvStore::Create(config.store));
  engine->params_.num_heads = config.num_heads;
  engine->params_.num_kv_heads = config.store.num_kv_heads;
  engine->params_.head_dim = config.store.head_dim;
  engine->params_.scale =
      config.scale > 0 ? config.scale : 1.0f / std::sqrt(static_cast<float>(config.store.head_dim));
  engine->params_.kv_dtype = config.store.dtype;
  return engine;
}

int64_t AttentionEngine::num_assigned_positions() const {
  int64_t n = 0;
  for (const auto& [id, table] : tables_) n += static_cast<int64_t>(table->size());
  return n;
}

absl::StatusOr<PreparedStep> AttentionEngine::Prepare(const StepKvPlan& plan) {
  const int64_t num_slots = store_->num_slots();
  auto invalid = [&](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("step ", plan.step_id, ": ", parts...));
  };
  // Validate the whole plan against the table sizes it would produce, so that a bad plan
  // changes nothing.
  std::unordered_map<SequenceId, int64_t> size_after;  // -1: released
  auto current_size = [&](SequenceId id) -> int64_t {
    auto it = size_after.find(id);
    if (it != size_after.end()) return it->second;
    auto table = tables_.find(id);
    return table == tables_.end() ? -1 : static_cast<int64_t>(table->second->size());
  };
  for (const TableRelease& r : plan.releases) size_after[r.request_id] = -1;
  for (const SlotAssignment& a : plan.assignments) {
    const int64_t existing = std::max<int64_t>(0, current_size(a.request_id));
    if (a.start < 0 || a.start > existing) {
      return invalid("request ", a.request_id, " assigns from position ", a.start,
                     " but its table has ", existing, " entries");
    }
    for (int32_t slot : a.slots) {
      if (slot < 0 || slot >= num_slots) {
        return invalid("slot ", slot, " of request ", a.request_id, " is outside the store's ",
                       num_slots, " slots");
      }
    }
    const int64_t end = a.start + static_cast<int64_t>(a.slots.size());
    // Each position of a table has a slot of its own: a longer table is no plan's, and
    // would only grow this node's memory (a peer repeating a slot).
    if (end > num_slots) {
      return invalid("request ", a.request_id, "'s table would hold ", end,
                     " positions, more than the store's ", num_slots, " slots");
    }
    for (const KvShift& shift : a.shifts) {
      if (shift.position < a.start ||
          shift.position + static_cast<int64_t>(shift.from.size()) > end) {
        return invalid("request ", a.request_id, " shifts KV to positions [", shift.position, ", ",
                       shift.position + shift.from.size(), ") outside its assignment [", a.start,
                       ", ", end, ")");
      }
      if (static_cast<int64_t>(shift.cos.size()) != config_.store.head_dim / 2 ||
          shift.sin.size() != shift.cos.size()) {
        return invalid("request ", a.request_id, " shifts KV with ", shift.cos.size(), "/",
                       shift.sin.size(), " angles; the head has ", config_.store.head_dim / 2,
                       " pairs");
      }
      for (int32_t slot : shift.from) {
        if (slot < 0 || slot >= num_slots) {
          return invalid("request ", a.request_id, " shifts KV from slot ", slot,
                         ", outside the store's ", num_slots, " slots");
        }
      }
    }
    size_after[a.request_id] = end;
  }
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    const AttentionRowPlan& r = plan.rows[i];
    const int64_t size = current_size(r.request_id);
    if (size < 0) {
      return invalid("row ", i, " names request ", r.request_id, " which has no slot table");
    }
    if (r.position < 0 || r.position >= size) {
      return invalid("row ", i, " of request ", r.request_id, " is at position ", r.position,
                     " beyond its ", size, " assigned slots");
    }
    if (r.tile_limit < -1) return invalid("row ", i, " has tile limit ", r.tile_limit);
  }

  for (const TableRelease& r : plan.releases) tables_.erase(r.request_id);
  for (const SlotAssignment& a : plan.assignments) {
    std::shared_ptr<std::vector<int32_t>>& table = tables_[a.request_id];
    if (table == nullptr) {
      table = std::make_shared<std::vector<int32_t>>();
    } else if (table.use_count() > 1) {
      table = std::make_shared<std::vector<int32_t>>(*table);  // a live step still reads it
    }
    table->resize(a.start);
    table->insert(table->end(), a.slots.begin(), a.slots.end());
    for (const KvShift& shift : a.shifts) {
      ApplyShift(shift, a.slots.data() + (shift.position - a.start));
    }
  }
  PreparedStep step;
  step.step_id_ = plan.step_id;
  step.rows_.reserve(plan.rows.size());
  for (const AttentionRowPlan& r : plan.rows) {
    const std::shared_ptr<std::vector<int32_t>>& table = tables_.at(r.request_id);
    kernels::AttentionRow row;
    row.slots = table->data();
    row.kv_end = r.position + 1;
    row.tile_begin = 0;
    const int32_t all_tiles = kernels::AttentionNumTiles(row.kv_end);
    row.tile_end = r.tile_limit < 0 ? all_tiles : std::min(r.tile_limit, all_tiles);
    step.kinds_.push_back(r.tile_limit < 0    ? RowKind::kFinal
                          : r.tile_limit == 0 ? RowKind::kWrite
                                              : RowKind::kPartial);
    step.rows_.push_back(row);
    step.write_slots_.push_back((*table)[r.position]);
    step.tables_.push_back(table);
  }
  return step;
}

absl::Status AttentionEngine::AttendRows(const PreparedStep& step, int layer, int begin, int end,
                                         const uint16_t* q, const uint16_t* k, const uint16_t* v,
                                         uint16_t* out, float* partial) {
  if (layer < 0 || layer >= config_.store.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", layer, " out of range"));
  }
  if (begin < 0 || end > step.num_rows() || begin > end) {
    return absl::InvalidArgumentError(
        absl::StrCat("rows [", begin, ", ", end, ") of a step of ", step.num_rows()));
  }
  if (begin == end) return absl::OkStatus();
  store_->WriteRows(layer, end - begin, step.write_slots_.data() + begin, k, v);

  const kernels::AttentionParams& p = params_;
  const size_t q_row = static_cast<size_t>(p.num_heads) * p.head_dim;
  const size_t state_row = static_cast<size_t>(p.num_heads) * (p.head_dim + 2);
  // Attending rows in order, and where each kind's q sits among them.
  std::vector<int> final_q, partial_q;
  int attending = 0;
  for (int i = begin; i < end; ++i) {
    if (step.kinds_[i] == RowKind::kFinal) final_q.push_back(attending++);
    if (step.kinds_[i] == RowKind::kPartial) partial_q.push_back(attending++);
  }
  if (!partial_q.empty() && partial == nullptr) {
    return absl::InvalidArgumentError("rows with a partial state but no state buffer");
  }
  auto run = [&](RowKind kind, const std::vector<int>& which, float* state_out) -> absl::Status {
    if (which.empty()) return absl::OkStatus();
    const int m = static_cast<int>(which.size());
    const uint16_t* q_rows = q;
    if (m != attending) {
      q_gather_.resize(m * q_row);
      for (int i = 0; i < m; ++i) {
        std::memcpy(q_gather_.data() + i * q_row, q + which[i] * q_row, q_row * 2);
      }
      q_rows = q_gather_.data();
    }
    kernel_rows_.clear();
    for (int i = begin; i < end; ++i) {
      if (step.kinds_[i] == kind) kernel_rows_.push_back(step.rows_[i]);
    }
    float* state = state_out;
    if (state == nullptr) {
      state_.resize(m * state_row);
      state = state_.data();
    }
    kernels::AttentionStateInit(p, m, state);
    const int rc = kernels::AttentionFold(p, m, q_rows, kernel_rows_.data(), store_->k(layer),
                                          store_->v(layer), state);
    if (rc != kernels::kAttentionOk) {
      return absl::InternalError(absl::StrCat("attention kernel error ", rc));
    }
    if (kind == RowKind::kFinal) kernels::AttentionFinish(p, m, state, out);
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(run(RowKind::kFinal, final_q, nullptr));
  return run(RowKind::kPartial, partial_q, partial);
}

void AttentionEngine::ApplyShift(const KvShift& shift, const int32_t* to) {
  const KvStoreConfig& c = config_.store;
  const int64_t n = static_cast<int64_t>(shift.from.size());
  const int64_t row = store_->row_elements();
  // In batches of rows, so that the buffer stays small whatever the shift's length.
  constexpr int64_t kBatch = 1024;
  shift_rows_.resize(static_cast<size_t>(std::min(n, kBatch) * row));
  for (int layer = 0; layer < c.num_layers; ++layer) {
    for (int64_t begin = 0; begin < n; begin += kBatch) {
      const int64_t m = std::min(kBatch, n - begin);
      const int32_t* from = shift.from.data() + begin;
      // Gathered first. The scheduler's sources (held cached blocks) and targets (fresh
      // slots) are disjoint; a plan where they overlap gets wrong KV, never a bad access.
      for (int64_t i = 0; i < m; ++i) {
        std::memcpy(shift_rows_.data() + i * row, store_->k(layer) + from[i] * row, row * 2);
      }
      kernels::ShiftRope(m, c.num_kv_heads, c.head_dim, c.dtype, shift.cos.data(), shift.sin.data(),
                         shift_rows_.data(), shift_rows_.data());
      for (int64_t i = 0; i < m; ++i) {
        std::memcpy(store_->k(layer) + to[begin + i] * row, shift_rows_.data() + i * row, row * 2);
      }
      for (int64_t i = 0; i < m; ++i) {
        std::memcpy(shift_rows_.data() + i * row, store_->v(layer) + from[i] * row, row * 2);
      }
      for (int64_t i = 0; i < m; ++i) {
        std::memcpy(store_->v(layer) + to[begin + i] * row, shift_rows_.data() + i * row, row * 2);
      }
    }
  }
  shifted_positions_ += n;
}

void AttentionEngine::Reset() {
  current_ = PreparedStep();
  tables_.clear();
}

absl::Status AttentionEngine::BeginStep(const StepKvPlan& plan) {
  current_ = PreparedStep();  // let go of the previous step's tables first
  ASSIGN_OR_RETURN(current_, Prepare(plan));
  return absl::OkStatus();
}

absl::Status AttentionEngine::AttendLayer(int layer, const uint16_t* q, const uint16_t* k,
                                          const uint16_t* v, uint16_t* out, float* partial_state) {
  const int n = current_.num_rows();
  if (n == 0) return absl::OkStatus();
  const kernels::AttentionParams& p = params_;
  const size_t q_row = static_cast<size_t>(p.num_heads) * p.head_dim;
  const int finals = current_.CountKind(0, n, RowKind::kFinal);
  const int attending = finals + current_.CountKind(0, n, RowKind::kPartial);
  if (attending == n && finals == n) {
    return AttendRows(current_, layer, 0, n, q, k, v, out, partial_state);
  }
  // Rows of mixed kinds: compact q over the attending rows and scatter the final outputs.
  std::vector<uint16_t> q_compact(static_cast<size_t>(attending) * q_row);
  std::vector<int> final_rows;
  int a = 0;
  for (int i = 0; i < n; ++i) {
    if (current_.kind(i) == RowKind::kWrite) continue;
    std::memcpy(q_compact.data() + a++ * q_row, q + i * q_row, q_row * 2);
    if (current_.kind(i) == RowKind::kFinal) final_rows.push_back(i);
  }
  out_gather_.resize(static_cast<size_t>(finals) * q_row);
  RETURN_IF_ERROR(
      AttendRows(current_, layer, 0, n, q_compact.data(), k, v, out_gather_.data(), partial_state));
  for (int i = 0; i < finals; ++i) {
    std::memcpy(out + final_rows[i] * q_row, out_gather_.data() + i * q_row, q_row * 2);
  }
  return absl::OkStatus();
}

}  // namespace strata
