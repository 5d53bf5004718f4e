#include "compute_node/attention_backend.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/enum_names.h"
#include "common/base/status_macros.h"

namespace strata {

absl::StatusOr<DType> ParseKvCacheType(absl::string_view name) {
  kernels::KvDType kv;
  std::string error;
  if (!ParseEnumName(name, kernels::kKvDTypeNames, &kv, &error)) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache type: ", error));
  }
  return kv == kernels::KvDType::kF16 ? DType::kF16 : DType::kBF16;
}

absl::StatusOr<std::unique_ptr<LocalAttention>> LocalAttention::Create(const ModelConfig& c,
                                                                       int64_t num_slots,
                                                                       bool prefault) {
  AttentionEngineConfig config;
  config.store.num_layers = static_cast<int>(c.num_layers);
  config.store.num_kv_heads = static_cast<int>(c.num_kv_heads);
  config.store.head_dim = static_cast<int>(c.head_dim);
  config.store.num_slots = num_slots;
  config.store.prefault = prefault;
  config.store.dtype = KvCacheType(c);
  config.num_heads = static_cast<int>(c.num_heads);
  auto local = std::make_unique<LocalAttention>();
  ASSIGN_OR_RETURN(local->engine_, AttentionEngine::Create(config));
  return local;
}

absl::Status LocalAttention::BeginStep(const StepKvPlan& plan) {
  tickets_.clear();
  for (const PendingLoad& l : plan.loads) tickets_.push_back(l.ticket);
  return engine_->BeginStep(plan);
}

absl::Status LocalAttention::Attend(int layer, BatchBuffers& b, int64_t m) {
  if (m != engine_->num_rows()) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch has ", m, " rows but the step plan ", engine_->num_rows()));
  }
  if (gate_ != nullptr && !tickets_.empty()) RETURN_IF_ERROR(gate_->Wait(tickets_, layer));
  return engine_->AttendLayer(layer, b.q.data(), b.k.data(), b.v.data(), b.attn.data(), nullptr);
}

absl::Status ForwardLayers(const ModelRunner& runner, AttentionBackend& attention, BatchBuffers& b,
                           const StepKvPlan& plan, const int32_t* tokens) {
  const int64_t m = static_cast<int64_t>(plan.rows.size());
  if (m > b.max_rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch of ", m, " rows exceeds the buffer's ", b.max_rows));
  }
  RETURN_IF_ERROR(attention.BeginStep(plan));
  std::vector<int32_t> positions(m);
  for (int64_t r = 0; r < m; ++r) positions[r] = plan.rows[r].position;
  runner.Embed(b, m, tokens, positions.data());
  for (int layer = 0; layer < runner.config().num_layers; ++layer) {
    runner.PreAttention(b, m, layer);
    RETURN_IF_ERROR(attention.Attend(layer, b, m));
    runner.PostAttention(b, m, layer);
  }
  return absl::OkStatus();
}

}  // namespace strata
