// A node's disk tier across its configurations: a memory node's, and a compute node's in
// co-located mode, where its own KV cache is the pool. Each configuration closes the tier
// and opens a fresh, empty one over the node's KV store (the scheduler's index starts empty
// with it); moves are executed only when stamped with the epoch and the tier id that Open
// returned, so moves ordered for a tier that a reconfiguration replaced never run.
//
// Thread-safety: every method may be called from any thread. Moves hold the host while they
// run; Close waits for them, so the store may be freed once Close returns. A batch with
// loads (a step may be waiting for them) goes before the rest of a batch of saves or
// drops, which holds the host kMovesPerTurn moves at a time.
#ifndef STRATA_MEMORY_NODE_KV_DISK_HOST_H_
#define STRATA_MEMORY_NODE_KV_DISK_HOST_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/protocol/node_config.h"
#include "memory_node/kv_disk_tier.h"
#include "memory_node/kv_store.h"
#include "memory_node/load_gate.h"

namespace strata {

// The disk index's model fingerprint: the model, its KV shape and dtype.
std::string KvDiskFingerprint(const std::string& model, uint32_t layers, uint32_t kv_heads,
                              uint32_t head_dim, const std::string& kv_dtype);

class KvDiskHost {
 public:
  explicit KvDiskHost(KvDiskTierOptions options);

  // Whether the node was given a directory (--kv_disk_dir).
  bool enabled() const { return !options_.dir.empty(); }

  // Closes the tier once the moves in progress are done. Moves fail until the next Open.
  void Close();

  // Closes the tier, then opens a fresh one over `store` for moves stamped `epoch` and the
  // returned tier id (never 0).
  absl::StatusOr<DiskTierAck> Open(uint64_t epoch, KvStore* store, int block_tokens,
                                   const std::string& fingerprint);

  // The scheduler's moves, one status each. FailedPrecondition for another epoch or tier, or
  // while no tier is open; DeadlineExceeded, with nothing run, if `deadline` (the caller's)
  // passed while they waited for the moves ahead: the caller has given up on them and may
  // have reused their slots and extents. A batch without loads runs in turns: if one of
  // those passes (its deadline, a reconfiguration) between two turns, the moves run keep
  // their outcomes and the rest get the refusal, each.
  absl::StatusOr<std::vector<absl::Status>> Move(uint64_t epoch, uint64_t tier,
                                                 std::span<const KvMove> moves,
                                                 absl::Time deadline = absl::InfiniteFuture());

  // Counters since the node started, over every tier it opened, and the open tier's space
  // (none: zero); nullopt if it never opened one.
  std::optional<KvDiskTierStats> stats() const;

  // Where attention waits for layer-wise pre-loads (the node's AttentionEngine users).
  LoadGate& gate() { return gate_; }
  const LoadGate& gate() const { return gate_; }

 private:
  // Drops the open tier, keeping its counters (mu_ and ptr_mu_ held).
  void RetireLocked();
  // Why moves stamped `epoch` and `tier` may not run now (mu_ held); OK if they may.
  absl::Status RefusedLocked(uint64_t epoch, uint64_t tier, absl::Time deadline) const;

  // Moves of a batch without loads that run before loads waiting meanwhile go first.
  static constexpr size_t kMovesPerTurn = 16;

  const KvDiskTierOptions options_;
  LoadGate gate_;  // outlives every tier (steps wait on it across configurations)
  // Held by Open, Close and moves (which take long: never under a node's engine lock, so
  // attention goes on meanwhile). ptr_mu_ only guards the pointer, for stats.
  std::mutex mu_;
  std::condition_variable turn_cv_;    // a batch of loads let go of mu_
  std::atomic<int> loads_waiting_{0};  // batches with loads waiting for mu_ or running
  mutable std::mutex ptr_mu_;
  std::shared_ptr<KvDiskTier> tier_;
  std::optional<KvDiskTierStats> retired_;  // guarded by ptr_mu_
  uint64_t epoch_ = 0;                      // guarded by mu_
  uint64_t tier_id_ = 0;                    // of the open tier; guarded by mu_
  uint64_t next_id_;                        // guarded by mu_
};

}  // namespace strata

#endif  // STRATA_MEMORY_NODE_KV_DISK_HOST_H_
