// The scheduler's ledger of one memory node's disk extents: the disk tier's index
// (groundwork: the scheduler does not use it yet; docs/architecture.md, "The disk tier").
//
// The scheduler stays the only allocator, of DRAM slots (kv_manager.h) and of disk
// extents (here); memory nodes execute the moves it orders (memory_node/kv_block_io.h)
// and report when they are done. Each extent is free, being written (a save in flight),
// ready (a block on disk), or being read (a load in flight; it cannot be evicted then).
//
// Blocks are keyed as in the DRAM prefix index: the chained hash of a full block and
// everything before it, with the block's tokens compared on a hit (a hash collision is a
// miss, never wrong KV).
//   - Saving: BeginSave picks an extent for a block (a free one, else the least recently
//     used ready block's, which is evicted); SaveDone makes it ready, or frees it when the
//     write failed (a full disk, an I/O error: the block is simply not on disk).
//   - Lookup: Match counts the ready blocks that continue a prefix.
//   - Loading: BeginLoad pins a ready block while it is read into DRAM (several readers
//     may pin it at once); LoadDone unpins it, or, when the read found its bytes bad or
//     gone (a checksum, a short read, an I/O error), drops it from the index (the caller
//     recomputes those tokens). A load that did not run in time, or whose node went, says
//     nothing about the block: it stays.
//   - Expire drops ready blocks idle longer than the TTL (persisted KV is user data).
// Dropped and expired extents are returned for the memory node to punch out, and are not
// used again until PunchDone says it has (a write to a reused extent must not be punched
// away). An evicted block's extent is reused at once: the new block overwrites it.
//
// Thread-safety: none; the scheduler thread owns it.
#ifndef STRATA_SERVER_DISK_LEDGER_H_
#define STRATA_SERVER_DISK_LEDGER_H_

#include <cstdint>
#include <list>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace strata {

// Whether a failed load says the block on disk is bad or gone (DataLoss, NotFound, an I/O
// error), rather than that the load did not run: past its deadline, cancelled, refused
// for a configuration that changed, or its node unreachable.
bool LoadCondemnsBlock(const absl::Status& status);

struct DiskLedgerStats {
  int64_t extents = 0;
  int64_t free = 0;
  int64_t writing = 0;
  int64_t ready = 0;
  int64_t reading = 0;
  int64_t punching = 0;       // given up, waiting for the node to punch them out
  int64_t evicted = 0;        // ready blocks replaced by newer saves
  int64_t expired = 0;        // dropped by the TTL
  int64_t failed_writes = 0;  // saves that did not reach the disk
  int64_t failed_reads = 0;   // loads that found the block bad or gone (dropped)
};

class DiskLedger {
 public:
  DiskLedger(int64_t num_extents, int block_tokens, absl::Duration ttl);

  // An extent to write block `hash` (its `block_tokens` tokens) to; nullopt when the block
  // is already on disk or being written, or when every extent is being written or read.
  // An evicted block's extent is reused (counted in stats().evicted).
  std::optional<int64_t> BeginSave(uint64_t hash, const int32_t* tokens, absl::Time now);
  void SaveDone(uint64_t hash, bool ok, absl::Time now);
  // Whether the block is on disk or being written; how many saves BeginSave would take now.
  bool Has(uint64_t hash) const { return blocks_.count(hash) > 0; }
  int64_t SaveRoom() const { return static_cast<int64_t>(free_.size() + lru_.size()); }

  // How many ready blocks, from `hashes[from]` on (at most `max`), continue `tokens`.
  int Match(const std::vector<int32_t>& tokens, const std::vector<uint64_t>& hashes, int from,
            int max) const;
  // Pins a ready block for reading; its extent, or nullopt when it is not ready.
  std::optional<int64_t> BeginLoad(uint64_t hash, absl::Time now);
  // Unpins it; a load that failed for the block's bytes (LoadCondemnsBlock): drops it and
  // returns its extent to punch out.
  std::optional<int64_t> LoadDone(uint64_t hash, const absl::Status& status, absl::Time now);

  // Drops ready blocks idle for longer than the TTL; returns their extents.
  std::vector<int64_t> Expire(absl::Time now);
  // The node has punched `extent` out: it is free again.
  void PunchDone(int64_t extent);

  // Scheduler-aware eviction: blocks the look-ahead window needs (hashes) are evicted last
  // (the least recently used of the rest first).
  void SetLookahead(std::unordered_set<uint64_t> hashes) { lookahead_ = std::move(hashes); }

  DiskLedgerStats Stats() const;
  // Consistency check for tests: every extent is free or owned by exactly one block.
  bool CheckInvariants() const;

 private:
  enum class State { kWriting, kReady, kReading };
  struct Block {
    int64_t extent = 0;
    State state = State::kWriting;
    std::vector<int32_t> tokens;
    absl::Time last_used;
    int readers = 0;                       // loads in flight
    std::list<uint64_t>::iterator lru_it;  // valid while ready
  };
  void MakeReady(uint64_t hash, Block& block, absl::Time now);
  void Unlist(Block& block);

  int block_tokens_;
  absl::Duration ttl_;
  int64_t num_extents_;
  std::vector<int64_t> free_;  // LIFO
  std::unordered_set<int64_t> punching_;
  std::unordered_map<uint64_t, Block> blocks_;
  std::list<uint64_t> lru_;  // ready blocks, least recently used first
  std::unordered_set<uint64_t> lookahead_;
  DiskLedgerStats counters_;
};

}  // namespace strata

#endif  // STRATA_SERVER_DISK_LEDGER_H_
