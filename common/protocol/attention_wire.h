// What a compute node and a memory node agree on for one step: the memory node's share of
// the step (its descriptor) and the byte layout of each mini-batch's layer frames.
//
// A layer frame (compute -> memory) carries, for the rows of one mini-batch:
//   q of the rows that attend (final and partial rows), then k of every row, then v.
// A layer-result frame (memory -> compute) carries:
//   the bf16 output of the final rows, then the f32 fold state of the partial rows.
// Both directions are the theoretical minimum for what they carry, plus the 64-byte
// frame header (common/transport/frame.h).
#ifndef STRATA_COMMON_PROTOCOL_ATTENTION_WIRE_H_
#define STRATA_COMMON_PROTOCOL_ATTENTION_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/protocol/step_plan.h"

namespace strata {

// The attention-side shape of the model.
struct AttentionDims {
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  size_t q_row_bytes() const { return static_cast<size_t>(num_heads) * head_dim * 2; }
  size_t kv_row_bytes() const { return static_cast<size_t>(num_kv_heads) * head_dim * 2; }
  size_t state_row_bytes() const { return static_cast<size_t>(num_heads) * (head_dim + 2) * 4; }
};

struct StepShare {
  uint64_t step_id = 0;
  uint64_t epoch = 0;
  PoolIndex pool;
  uint32_t num_layers = 0;
  StepKvPlan plan;  // releases, assignments and rows of this pool only
  std::vector<uint32_t> minibatch_rows;
};

// The rows of one mini-batch and the sizes of its frames' payloads.
struct MinibatchLayout {
  int begin = 0, end = 0;  // rows [begin, end) of the share
  int finals = 0, partials = 0, writes = 0;
  size_t q_bytes = 0, kv_bytes = 0;  // kv_bytes: k (or v) of all rows
  size_t out_bytes = 0, state_bytes = 0;
  size_t request_bytes() const { return q_bytes + 2 * kv_bytes; }
  size_t result_bytes() const { return out_bytes + state_bytes; }
};

std::string EncodeStepShare(const StepShare& share);
// Parses and checks the descriptor's own consistency (array lengths, mini-batch sums).
absl::StatusOr<StepShare> DecodeStepShare(std::span<const uint8_t> bytes);

std::vector<MinibatchLayout> LayoutMinibatches(const StepShare& share, const AttentionDims& dims);

// Splits `rows` rows into at most `count` mini-batches of near-equal size (none empty).
std::vector<uint32_t> SplitMinibatches(int rows, int count);

}  // namespace strata

#endif  // STRATA_COMMON_PROTOCOL_ATTENTION_WIRE_H_
