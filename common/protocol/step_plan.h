// The KV side of a step: the ids of sequences and KV pools, and what changes in the pools'
// slot tables. The scheduler's StepPlan (step.h) carries these types as they are, and the
// attention side (a memory node, or the co-located compute node) gets them in a
// StepKvPlan, with one AttentionRowPlan per row of the batch. Plain structs: protos are
// converted to these at the transport and gRPC edges.
#ifndef STRATA_COMMON_PROTOCOL_STEP_PLAN_H_
#define STRATA_COMMON_PROTOCOL_STEP_PLAN_H_

#include <cstdint>
#include <vector>

#include "common/base/strong_id.h"

namespace strata {

// A sequence: one request's token stream and the KV it owns (a request with n > 1 choices
// has one per choice). The scheduler's request id.
using SequenceId = StrongId<struct SequenceIdTag, uint64_t>;
// A KV pool: a memory node, or (co-located mode) the compute node's own cache.
using PoolIndex = StrongId<struct PoolIndexTag, uint32_t>;

// The scheduler sends a sequence's full table once, then only new extents
// (docs/architecture.md: diffs). Cutting a table back serves preemption and re-prefill.
// Context truncation: KV that moves to positions [position, position + from.size()) of a
// table, copied from the pool's slots `from` (where it sat `shift` positions later: the
// kept tail of a conversation whose middle was dropped). K is re-rotated by the angles of
// `shift` (RoPE was applied before storage); V is copied as is. The plan carries the
// rotation's cos and sin ([head_dim / 2] each), so the attention side needs no model config.
struct KvShift {
  int32_t position = 0;
  int32_t shift = 0;  // new position minus old: negative
  std::vector<int32_t> from;
  std::vector<float> cos, sin;
};

// table[start + i] = slots[i] for the sequence, after truncating its table to `start`
// entries; then `shifts` fill some of the new positions (before any row of the step).
struct SlotAssignment {
  SequenceId request_id;
  PoolIndex pool;  // the pool that holds the table
  int32_t start = 0;
  std::vector<int32_t> slots;
  std::vector<KvShift> shifts;
};

// The sequence's table in `pool` is dropped (it finished, or moved).
struct TableRelease {
  SequenceId request_id;
  PoolIndex pool;
};

// One row of the batch: its token's sequence and absolute position. The row attends
// positions [0, position]; its own k/v goes into slot table[position].
struct AttentionRowPlan {
  SequenceId request_id;
  PoolIndex pool;
  int32_t position = 0;
  // Fold only tiles [0, tile_limit) here and return the partial state (split prefill);
  // -1 means all tiles and a final output; 0 means only write the row's k/v.
  int32_t tile_limit = -1;
};

// Layer-wise pre-loading: the sequence's earlier KV is still being read from the pool's
// disk tier under `ticket`; attention of layer l waits until that layer is in DRAM.
struct PendingLoad {
  SequenceId request_id;
  PoolIndex pool;
  uint64_t ticket = 0;
};

struct StepKvPlan {
  uint64_t step_id = 0;
  std::vector<TableRelease> releases;  // applied first
  std::vector<SlotAssignment> assignments;
  std::vector<AttentionRowPlan> rows;
  std::vector<PendingLoad> loads;  // of this pool's rows
};

}  // namespace strata

#endif  // STRATA_COMMON_PROTOCOL_STEP_PLAN_H_
