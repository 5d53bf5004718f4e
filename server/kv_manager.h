// The scheduler's KV ledger: the only allocator of KV slots in a strata deployment
// (docs/architecture.md). Memory nodes (or, in co-located mode, compute nodes) hold the memory
// and write where step plans tell them; this class decides where.
//
// Per pool (a memory node, or a co-located compute node's own cache):
//   - token-granular slots: no page-size internal fragmentation. They are handed out in
//     runs, so that attention reads a sequence's KV in long contiguous pieces: a sequence's
//     next slot is the one after its last when that is free, and a sequence that needs a
//     new run starts one in a wholly free stretch of `run_slots` slots (one attention tile,
//     64) at the offset of its position in a tile, so that its tiles are whole runs. With
//     no such stretch but a cache full of idle blocks, the run may start in a stretch that
//     only free slots and blocks of the eviction window (the next few the policy would
//     evict) hold; those blocks go at once. Only when neither exists does it take the
//     newest free slot, from the start of that slot's free run. Nothing is held back; a
//     sequence's run is kept for it only while other sequences find whole stretches
//     elsewhere;
//   - a reference count per slot. A request's slot table holds one reference per position;
//     n > 1 samples share the prompt's slots; a cached prefix block holds one reference on
//     each of its slots;
//   - a prefix index: full blocks of `block_tokens` tokens, keyed by a chained hash of the
//     block and everything before it (tokens compared on hit, so a hash collision is a
//     miss, never wrong KV). Blocks whose requests finished stay cached and idle; their
//     slots count as reclaimable capacity, and an allocation that runs short evicts them
//     in the order of the pool's eviction policy (KvEviction).
//
// Thread-safety: none; the scheduler thread owns it.
#ifndef STRATA_SERVER_KV_MANAGER_H_
#define STRATA_SERVER_KV_MANAGER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/protocol/step.h"

namespace strata {

// Chained hashes of the full blocks of `tokens`: hash[k] covers tokens [0, (k + 1) * block).
std::vector<uint64_t> BlockHashes(const std::vector<int32_t>& tokens, int block_tokens,
                                  uint64_t salt);
// Extends `hashes` (the chained hashes of a prefix of `tokens`) to every full block.
void AppendBlockHashes(const std::vector<int32_t>& tokens, int block_tokens, uint64_t salt,
                       std::vector<uint64_t>* hashes);

// Which idle cached block goes first when DRAM runs short (AttentionStore compares them):
//   kLru             the least recently used;
//   kFifo            the oldest (first cached);
//   kSchedulerAware  the least recently used outside the look-ahead window (blocks that
//                    requests waiting in the queue will need, SetLookahead), then LRU
//                    among those.
enum class KvEviction { kLru, kFifo, kSchedulerAware };
bool AbslParseFlag(absl::string_view text, KvEviction* out, std::string* error);
std::string AbslUnparseFlag(KvEviction e);

struct PoolStats {
  int64_t total_slots = 0;
  int64_t free_slots = 0;
  int64_t reclaimable_slots = 0;  // held only by idle cached blocks
  int64_t used_slots = 0;         // referenced by a live request
  int64_t live_positions = 0;     // sum over requests of their table lengths
  int64_t cached_blocks = 0;
  int64_t idle_blocks = 0;
};

class KvPool {
 public:
  // The attention tile (kernels/cpu/attention.h, kAttentionTileTokens): the stretch in
  // which runs start.
  static constexpr int kRunSlots = 64;
  KvPool(PoolIndex index, int64_t num_slots, int block_tokens,
         KvEviction eviction = KvEviction::kLru, int run_slots = kRunSlots);

  PoolIndex index() const { return index_; }
  int block_tokens() const { return block_tokens_; }
  int64_t num_slots() const { return static_cast<int64_t>(refcount_.size()); }
  // Slots that an allocation can obtain now (free plus reclaimable).
  int64_t available() const { return static_cast<int64_t>(free_.items.size()) + idle_block_slots_; }
  // Scheduler-aware eviction: the blocks the look-ahead window needs (their hashes); they
  // are evicted last. Other policies keep the set but ignore it.
  void SetLookahead(std::unordered_set<uint64_t> hashes) {
    lookahead_ = std::move(hashes);
    ++changes_;
  }
  // Slots an allocation can obtain without evicting a block of the look-ahead window.
  int64_t AvailableOutsideLookahead() const;
  // Whether `hash` is a cached block that only the cache holds (its slots count in
  // available()).
  bool IsIdleBlock(uint64_t hash) const;
  PoolStats Stats() const;
  // References to `slot`; requests holding cached block `hash` (0 if it is not cached).
  uint32_t refcount(int32_t slot) const { return refcount_[slot]; }
  int holders(uint64_t hash) const;

  // `n` fresh slots (refcount 1) appended to `out`, a slot table whose next position is
  // `position` (by default out->size()), evicting idle cached blocks in the policy's order
  // when the free slots run short. All or nothing. Where the slots go: the header comment.
  bool Allocate(int64_t n, std::vector<int32_t>* out);
  bool Allocate(int64_t n, std::vector<int32_t>* out, int64_t position);
  void Ref(const std::vector<int32_t>& slots);
  void Unref(const std::vector<int32_t>& slots);

  // Gives a new sequence a slot table for positions [0, length): the longest cached prefix of
  // `tokens` (at most `max_blocks` blocks) plus fresh slots. All or nothing: returns the
  // number of reused prefix blocks (their hashes appended to `held`), or -1 if the slots
  // are not available (nothing changed).
  int Admit(const std::vector<int32_t>& tokens, const std::vector<uint64_t>& hashes, int max_blocks,
            int64_t length, std::vector<int32_t>* table, std::vector<uint64_t>* held);

  // Longest cached prefix of `tokens` (in blocks, at most `max_blocks`), without taking it.
  int MatchLength(const std::vector<int32_t>& tokens, const std::vector<uint64_t>& hashes,
                  int max_blocks) const;
  // Takes the first `num_blocks` cached blocks: their slots get one more reference each and
  // the blocks one more holder. Appends the slots to `slots`.
  void TakePrefix(const std::vector<uint64_t>& hashes, int num_blocks, std::vector<int32_t>* slots);
  // Records a block a request computed (tokens and slots of positions
  // [block * block_tokens, (block + 1) * block_tokens)). Nothing is recorded if the hash is
  // already cached (the request keeps its own copy), or if another request also references
  // one of the slots (n > 1 samples that completed a shared partial block each their own
  // way): a cached block's slots must be freeable by evicting that block alone. Returns
  // whether the request now holds a cached block (to drop with DropBlock when it ends).
  bool InsertBlock(uint64_t hash, const int32_t* tokens, const int32_t* slots);
  // Another request starts holding a cached block whose slots it shares (n > 1 samples):
  // anyone referencing a cached block's slots must hold the block, so that an idle block's
  // slots are referenced by the cache alone and evicting it frees them.
  void HoldBlock(uint64_t hash);
  // A request stops holding a block it took, inserted or held.
  void DropBlock(uint64_t hash);
  // A cached block's tokens and slots (block_tokens each); false if it is not cached.
  bool BlockContents(uint64_t hash, const int32_t** tokens, const int32_t** slots) const;

  // Consistency check for tests: every slot's refcount equals the references the caller
  // holds plus the cache's, and the free list holds exactly the unreferenced slots.
  bool CheckInvariants(const std::vector<int32_t>& external_refs) const;

  // Counters.
  int64_t evicted_blocks() const { return evicted_blocks_; }

 private:
  struct Block {
    uint64_t hash;
    std::vector<int32_t> tokens;
    std::vector<int32_t> slots;
    int holders = 0;        // live requests holding it
    uint64_t cached = 0;    // when it was cached (a tick)
    uint64_t idle_key = 0;  // its place in idle_ while idle (holders == 0)
  };
  // A set of integers below a bound: add, remove and membership in O(1); `items` in no
  // particular order, the last added at the back until something is removed.
  struct IndexSet {
    std::vector<int32_t> items;
    std::vector<int32_t> at;  // item's index in `items`, -1 if absent
    explicit IndexSet(int64_t bound) : at(bound, -1) { items.reserve(bound); }
    bool contains(int64_t x) const { return at[x] >= 0; }
    void Add(int32_t x);
    void Remove(int32_t x);
  };
  // Idle blocks in eviction order: (key, hash), the key being when the block went idle
  // (LRU, scheduler-aware) or when it was cached (FIFO).
  using IdleOrder = std::set<std::pair<uint64_t, uint64_t>>;
  // The eviction window: the next kWindowBlocks idle blocks the policy would evict
  // (outside the look-ahead window, under scheduler-aware eviction). With the cache full, a
  // new run may start in a stretch that only they and free slots hold, evicting those of
  // them that the stretch holds, ahead of the rest of the window. There is no window while fewer
  // than kWindowMinIdleStretches stretches' worth of slots sit in idle blocks: in a small
  // pool a cached prompt is worth more than a run.
  static constexpr size_t kWindowBlocks = 8;
  static constexpr int64_t kWindowMinIdleStretches = 16;
  struct EvictionWindow {
    std::vector<IdleOrder::iterator> blocks;
    std::vector<std::pair<int32_t, int>> slots;  // (slot, index in blocks), by slot
    uint64_t changes = ~0ull;                    // changes_ when it was built
    bool searched = false;                       // StartRunInWindow found no stretch in it
  };
  bool EvictOne();
  void EvictIdle(IdleOrder::iterator victim);
  void MakeIdle(uint64_t hash, Block& block);
  // The slot after the table's last when a run may continue there, else -1.
  int32_t Continuation(const std::vector<int32_t>& out) const;
  // The free slot position `position` of the table `out` gets (the header comment).
  int32_t NextSlot(const std::vector<int32_t>& out, int64_t position) const;
  // The window, rebuilt when the blocks or the free slots changed.
  const EvictionWindow& Window();
  // Index in Window().blocks of the block holding `slot`, or -1.
  int WindowBlockOf(int32_t slot);
  // A new run's first slot, at `position`'s offset in a stretch that only free slots and
  // window blocks hold, after evicting those blocks. -1 if no stretch qualifies.
  int32_t StartRunInWindow(int64_t position);
  void Take(int32_t slot);  // a free slot, now referenced once
  void Free(int32_t slot);  // an unreferenced slot, free again

  PoolIndex index_;
  int block_tokens_;
  KvEviction eviction_;
  std::vector<uint32_t> refcount_;
  const int run_slots_;
  IndexSet free_;  // the slots whose refcount is 0
  // Free slots per stretch of run_slots_ (stretch k: slots [k, k + 1) * run_slots_), and the
  // whole stretches (those inside the pool) that are entirely free.
  std::vector<int32_t> stretch_free_;
  IndexSet free_stretches_;
  std::unordered_map<uint64_t, Block> blocks_;
  IdleOrder idle_;
  uint64_t tick_ = 0;
  std::unordered_set<uint64_t> lookahead_;
  int64_t idle_block_slots_ = 0;
  int64_t evicted_blocks_ = 0;
  // Bumped when a slot is freed, a block goes idle or stops being idle, or the look-ahead
  // window moves: the eviction window is rebuilt then.
  uint64_t changes_ = 0;
  EvictionWindow window_;
};

}  // namespace strata

#endif  // STRATA_SERVER_KV_MANAGER_H_
