// How the scheduler's disk-tier moves reach a memory node (proto KvMove): saves of KV blocks
// from DRAM slots to disk extents, loads back, and drops. The scheduler decides every move
// (server/disk_ledger.h); the node executes them (memory_node/kv_disk_tier.h) and reports
// each one's outcome.
#ifndef STRATA_SERVER_KV_MOVER_H_
#define STRATA_SERVER_KV_MOVER_H_

#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "common/protocol/node_config.h"

namespace strata {

// One status per move, in order; called on a mover thread.
using KvMovesDone = std::function<void(std::vector<absl::Status>)>;

class KvMover {
 public:
  virtual ~KvMover() = default;
  // Runs `moves` on the node, in order, and calls `done` exactly once, when they are all
  // done: each with its outcome, or all failed if the node could not be reached. Batches
  // of loads may overtake batches of saves and drops (never the other way round within a
  // kind). `background`: nobody waits for these (saves, drops, prefetches): they never
  // hold up loads a request waits for.
  virtual void Submit(std::vector<KvMove> moves, KvMovesDone done, bool background) = 0;
};

}  // namespace strata

#endif  // STRATA_SERVER_KV_MOVER_H_
