#include "compute_node/bench/filled_attention.h"

#include <random>

#include "common/base/bfloat16.h"

namespace strata::bench {

absl::StatusOr<std::unique_ptr<LocalAttention>> FilledLocalAttention(const ModelConfig& config,
                                                                     int batch, int64_t positions) {
  auto local = LocalAttention::Create(config, batch * positions, /*prefault=*/true);
  if (!local.ok()) return local.status();
  KvStore& store = const_cast<KvStore&>((*local)->engine().store());
  std::mt19937 rng(1);
  const int64_t n = batch * positions * store.row_elements();
  // In the cache's own type.
  const auto to_kv = config.kv_cache_dtype == DType::kF16 ? FloatToF16 : FloatToBf16;
  for (int l = 0; l < config.num_layers; ++l) {
    for (int64_t i = 0; i < n; ++i) {
      const float x = static_cast<float>(static_cast<int32_t>(rng() % 2001) - 1000) / 1000.0f;
      store.k(l)[i] = to_kv(x);
      store.v(l)[i] = to_kv(-x);
    }
  }
  StepKvPlan setup;
  for (int b = 0; b < batch; ++b) {
    SlotAssignment a;
    a.request_id = SequenceId(b + 1);
    for (int64_t p = 0; p < positions; ++p) {
      a.slots.push_back(static_cast<int32_t>(b * positions + p));
    }
    setup.assignments.push_back(a);
  }
  if (absl::Status s = (*local)->BeginStep(setup); !s.ok()) return s;
  return local;
}

StepKvPlan FilledDecodePlan(int batch, int position) {
  StepKvPlan plan;
  for (int b = 0; b < batch; ++b) {
    plan.rows.push_back({SequenceId(static_cast<uint64_t>(b + 1)), PoolIndex(0), position, -1});
  }
  return plan;
}

}  // namespace strata::bench
