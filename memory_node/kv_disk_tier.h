// A memory node's disk tier: the block file (kv_disk.h) and the block mover (kv_block_io.h)
// over its KV store, executing the moves the scheduler orders (proto KvMove): saves of
// blocks from DRAM to disk extents, loads back into DRAM slots, and drops. The scheduler
// allocated every slot and extent named (server/disk_ledger.h); this class only executes,
// and reports each move's outcome:
//   - a save that fails (a full disk: ResourceExhausted; an I/O error) leaves the block
//     "not on disk", and its DRAM copy untouched;
//   - a load that fails its header, key or checksum is DataLoss, and its slots must not be
//     read (the scheduler recomputes them);
//   - a malformed move (a slot or extent out of range) is InvalidArgument.
// Moves run in order, consecutive saves (or loads) batched through the staging buffers, so
// that several blocks' I/O is in flight at once.
//
// Thread-safety: Execute and stats may be called from any thread; moves run one batch at a
// time. The store must outlive the tier, and the slots a move names must not be written by
// anything else until it is done (the scheduler guarantees it).
#ifndef STRATA_MEMORY_NODE_KV_DISK_TIER_H_
#define STRATA_MEMORY_NODE_KV_DISK_TIER_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/protocol/node_config.h"
#include "memory_node/kv_block_io.h"
#include "memory_node/kv_disk.h"
#include "memory_node/kv_store.h"
#include "memory_node/load_gate.h"

namespace strata {

struct KvDiskTierOptions {
  std::string dir;  // empty: no disk tier
  uint64_t budget_bytes = 0;
  uint64_t staging_bytes = 64ull << 20;  // DRAM for blocks in flight, beside the KV budget
  int queue_depth = 8;
  bool allow_buffered = false;
  // Layer-wise pre-loading: loads under a ticket publish their progress here, layer by
  // layer (load_gate.h). Null: tickets are ignored and such loads run whole.
  LoadGate* gate = nullptr;
};

struct KvDiskTierStats {
  uint64_t extents = 0;
  uint64_t block_bytes = 0;
  uint64_t staging_bytes = 0;
  uint64_t saves = 0;
  uint64_t failed_saves = 0;
  uint64_t loads = 0;
  uint64_t failed_loads = 0;
  uint64_t drops = 0;
  uint64_t used_extents = 0;  // saved and not dropped since configuration
  uint64_t bytes_written = 0;
  uint64_t bytes_read = 0;
  uint64_t checksum_failures = 0;
  // Time spent in batches of each kind (I/O and the copies to and from the store).
  double save_seconds = 0;
  double load_seconds = 0;
};

class KvDiskTier {
 public:
  // Opens the tier's directory for blocks of `block_tokens` tokens of `store`, empty.
  // `fingerprint` names the model and KV dtype.
  static absl::StatusOr<std::unique_ptr<KvDiskTier>> Open(const KvDiskTierOptions& options,
                                                          KvStore* store, int block_tokens,
                                                          const std::string& fingerprint);

  // Runs `moves` in order; one status per move. Saves and loads not begun by `deadline`
  // (the caller's) are DeadlineExceeded, and touch no slot (kv_block_io.h).
  std::vector<absl::Status> Execute(std::span<const KvMove> moves,
                                    absl::Time deadline = absl::InfiniteFuture());

  KvDiskTierStats stats() const;
  uint64_t extents() const { return disk_->num_extents(); }
  uint64_t block_bytes() const { return disk_->block_bytes(); }
  bool direct() const { return disk_->direct(); }

 private:
  KvDiskTier() = default;
  void Run(KvMove::Kind kind, std::span<const KvMove> moves, std::span<absl::Status> out,
           absl::Time deadline);
  // Loads under tickets, layer by layer, publishing each ticket's progress to the gate.
  void LoadByLayer(std::span<BlockIo> blocks, std::span<const uint64_t> tickets,
                   absl::Time deadline);

  LoadGate* gate_ = nullptr;

  std::mutex mu_;  // one batch at a time
  std::unique_ptr<KvDisk> disk_;
  std::unique_ptr<KvBlockIo> io_;
  void Mark(uint64_t extent, bool used);
  std::vector<bool> used_;  // extents holding a saved block
  uint64_t used_count_ = 0;

  mutable std::mutex stats_mu_;
  KvDiskTierStats stats_;
};

}  // namespace strata

#endif  // STRATA_MEMORY_NODE_KV_DISK_TIER_H_
