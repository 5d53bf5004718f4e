// What the attention side (a memory node, or the co-located compute node) needs to know
// about one step of one batch: which requests' KV slot tables change, and which request and
// position each row of the batch belongs to. Plain structs: protos are converted to these
// at the transport edge.
#ifndef STRATA_COMMON_PROTOCOL_STEP_PLAN_H_
#define STRATA_COMMON_PROTOCOL_STEP_PLAN_H_

#include <cstdint>
#include <vector>

namespace strata {

// table[start + i] = slots[i] for the request, after truncating its table to `start`
// entries. The scheduler sends a request's full table once, then only new extents
// (docs/architecture.md: diffs). Truncation serves preemption and re-prefill.
struct SlotAssignment {
  uint64_t request_id = 0;
  int32_t start = 0;
  std::vector<int32_t> slots;
  uint32_t pool = 0;  // the KV pool (memory node) that holds the table
};

// One row of the batch: its token's request and absolute position. The row attends
// positions [0, position]; its own k/v goes into slot table[position].
struct AttentionRowPlan {
  uint64_t request_id = 0;
  int32_t position = 0;
  // Fold only tiles [0, tile_limit) here and return the partial state (split prefill);
  // -1 means all tiles and a final output; 0 means only write the row's k/v.
  int32_t tile_limit = -1;
  uint32_t pool = 0;
};

struct TableRelease {
  uint64_t request_id = 0;
  uint32_t pool = 0;
};

struct StepKvPlan {
  uint64_t step_id = 0;
  std::vector<TableRelease> released;  // tables dropped, applied first
  std::vector<SlotAssignment> assignments;
  std::vector<AttentionRowPlan> rows;
};

}  // namespace strata

#endif  // STRATA_COMMON_PROTOCOL_STEP_PLAN_H_
