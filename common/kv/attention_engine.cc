#include "common/kv/attention_engine.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"

namespace strata {

absl::StatusOr<std::unique_ptr<AttentionEngine>> AttentionEngine::Create(
    const AttentionEngineConfig& config) {
  auto engine = std::unique_ptr<AttentionEngine>(new AttentionEngine(config));
  ASSIGN_OR_RETURN(engine->store_, KvStore::Create(config.store));
  engine->params_.num_heads = config.num_heads;
  engine->params_.num_kv_heads = config.store.num_kv_heads;
  engine->params_.head_dim = config.store.head_dim;
  engine->params_.scale =
      config.scale > 0 ? config.scale : 1.0f / std::sqrt(static_cast<float>(config.store.head_dim));
  engine->params_.kv_dtype = config.store.dtype;
  if (config.num_heads <= 0 || config.num_heads % config.store.num_kv_heads != 0) {
    return absl::InvalidArgumentError("num_heads must be a positive multiple of num_kv_heads");
  }
  return engine;
}

int64_t AttentionEngine::num_assigned_positions() const {
  int64_t n = 0;
  for (const auto& [id, table] : tables_) n += static_cast<int64_t>(table.size());
  return n;
}

absl::Status AttentionEngine::BeginStep(const StepKvPlan& plan) {
  const int64_t num_slots = store_->num_slots();
  auto invalid = [&](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("step ", plan.step_id, ": ", parts...));
  };
  // Validate the whole plan against the table sizes it would produce, so that a bad plan
  // changes nothing.
  std::unordered_map<uint64_t, int64_t> size_after;  // -1: released
  auto current_size = [&](uint64_t id) -> int64_t {
    auto it = size_after.find(id);
    if (it != size_after.end()) return it->second;
    auto table = tables_.find(id);
    return table == tables_.end() ? -1 : static_cast<int64_t>(table->second.size());
  };
  for (uint64_t id : plan.released) size_after[id] = -1;
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
    size_after[a.request_id] = a.start + static_cast<int64_t>(a.slots.size());
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
  }

  for (uint64_t id : plan.released) tables_.erase(id);
  for (const SlotAssignment& a : plan.assignments) {
    std::vector<int32_t>& table = tables_[a.request_id];
    table.resize(a.start);
    table.insert(table.end(), a.slots.begin(), a.slots.end());
  }
  rows_.clear();
  write_slots_.clear();
  final_rows_.clear();
  partial_rows_.clear();
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    const AttentionRowPlan& r = plan.rows[i];
    const std::vector<int32_t>& table = tables_.at(r.request_id);
    kernels::AttentionRow row;
    row.slots = table.data();  // stable until the next BeginStep
    row.kv_end = r.position + 1;
    row.tile_begin = 0;
    const int32_t all_tiles = kernels::AttentionNumTiles(row.kv_end);
    row.tile_end = r.tile_limit < 0 ? all_tiles : std::min(r.tile_limit, all_tiles);
    (r.tile_limit < 0 ? final_rows_ : partial_rows_).push_back(static_cast<int>(i));
    rows_.push_back(row);
    write_slots_.push_back(table[r.position]);
  }
  num_partial_ = static_cast<int>(partial_rows_.size());
  return absl::OkStatus();
}

absl::Status AttentionEngine::AttendLayer(int layer, const uint16_t* q, const uint16_t* k,
                                          const uint16_t* v, uint16_t* out, float* partial_state) {
  if (layer < 0 || layer >= config_.store.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", layer, " out of range"));
  }
  const int n = num_rows();
  if (n == 0) return absl::OkStatus();
  if (num_partial_ > 0 && partial_state == nullptr) {
    return absl::InvalidArgumentError("plan has partial rows but no state buffer was given");
  }
  store_->WriteRows(layer, n, write_slots_.data(), k, v);

  const kernels::AttentionParams& p = params_;
  const size_t q_row = static_cast<size_t>(p.num_heads) * p.head_dim;
  const size_t state_row = static_cast<size_t>(p.num_heads) * (p.head_dim + 2);
  auto run = [&](const std::vector<int>& which, bool finish, float* state_out) -> absl::Status {
    if (which.empty()) return absl::OkStatus();
    const int m = static_cast<int>(which.size());
    const bool contiguous = m == n;  // all rows, in order
    std::vector<kernels::AttentionRow> rows;
    const uint16_t* q_rows = q;
    if (!contiguous) {
      q_gather_.resize(m * q_row);
      for (int i = 0; i < m; ++i) {
        std::memcpy(q_gather_.data() + i * q_row, q + which[i] * q_row, q_row * 2);
      }
      q_rows = q_gather_.data();
    }
    rows.reserve(m);
    for (int i : which) rows.push_back(rows_[i]);
    float* state = state_out;
    if (finish) {
      state_.resize(m * state_row);
      state = state_.data();
    }
    kernels::AttentionStateInit(p, m, state);
    const int rc = kernels::AttentionFold(p, m, q_rows, rows.data(), store_->k(layer),
                                          store_->v(layer), state);
    if (rc != kernels::kAttentionOk) {
      return absl::InternalError(absl::StrCat("attention kernel error ", rc));
    }
    if (!finish) return absl::OkStatus();
    if (contiguous) {
      kernels::AttentionFinish(p, m, state, out);
    } else {
      out_gather_.resize(m * q_row);
      kernels::AttentionFinish(p, m, state, out_gather_.data());
      for (int i = 0; i < m; ++i) {
        std::memcpy(out + which[i] * q_row, out_gather_.data() + i * q_row, q_row * 2);
      }
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(run(final_rows_, /*finish=*/true, nullptr));
  return run(partial_rows_, /*finish=*/false, partial_state);
}

}  // namespace strata
