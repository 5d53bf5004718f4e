#include "server/kv_manager.h"

#include <algorithm>

#include "common/base/logging.h"
#include "server/lookahead.h"

namespace strata {
namespace {

uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

}  // namespace

void AppendBlockHashes(const std::vector<int32_t>& tokens, int block_tokens, uint64_t salt,
                       std::vector<uint64_t>* hashes) {
  uint64_t h = hashes->empty() ? Mix(salt ^ 0x6b7659a1c3e8d2f4ull) : hashes->back();
  for (size_t b = hashes->size(); (b + 1) * block_tokens <= tokens.size(); ++b) {
    for (int i = 0; i < block_tokens; ++i) {
      h = Mix(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(tokens[b * block_tokens + i])) +
                   0x9e3779b97f4a7c15ull * (i + 1)));
    }
    hashes->push_back(h);
  }
}

std::vector<uint64_t> BlockHashes(const std::vector<int32_t>& tokens, int block_tokens,
                                  uint64_t salt) {
  std::vector<uint64_t> hashes;
  AppendBlockHashes(tokens, block_tokens, salt, &hashes);
  return hashes;
}

bool AbslParseFlag(absl::string_view text, KvEviction* out, std::string* error) {
  if (text == "lru") {
    *out = KvEviction::kLru;
  } else if (text == "fifo") {
    *out = KvEviction::kFifo;
  } else if (text == "scheduler-aware") {
    *out = KvEviction::kSchedulerAware;
  } else {
    *error = "expected lru, fifo or scheduler-aware";
    return false;
  }
  return true;
}

std::string AbslUnparseFlag(KvEviction e) {
  switch (e) {
    case KvEviction::kLru:
      return "lru";
    case KvEviction::kFifo:
      return "fifo";
    case KvEviction::kSchedulerAware:
      return "scheduler-aware";
  }
  return "lru";
}

void KvPool::IndexSet::Add(int32_t x) {
  at[x] = static_cast<int32_t>(items.size());
  items.push_back(x);
}

void KvPool::IndexSet::Remove(int32_t x) {
  const int32_t i = at[x];
  const int32_t last = items.back();
  items[i] = last;
  at[last] = i;
  items.pop_back();
  at[x] = -1;
}

KvPool::KvPool(PoolIndex index, int64_t num_slots, int block_tokens, KvEviction eviction,
               int run_slots)
    : index_(index),
      block_tokens_(block_tokens),
      eviction_(eviction),
      refcount_(num_slots, 0),
      run_slots_(run_slots),
      free_(num_slots),
      stretch_free_((num_slots + run_slots - 1) / run_slots, 0),
      free_stretches_(num_slots / run_slots) {
  CHECK_GT(run_slots, 0);
  // Added in reverse so that the first allocations come out 0, 1, 2, ...
  for (int64_t s = num_slots - 1; s >= 0; --s) {
    free_.Add(static_cast<int32_t>(s));
    ++stretch_free_[s / run_slots];
  }
  for (int64_t k = num_slots / run_slots - 1; k >= 0; --k) {
    free_stretches_.Add(static_cast<int32_t>(k));
  }
}

void KvPool::Take(int32_t slot) {
  CHECK_EQ(refcount_[slot], 0u);
  free_.Remove(slot);
  const int64_t k = slot / run_slots_;
  // Only a whole stretch can have run_slots_ free slots, so `k` is inside free_stretches_
  // when it is asked.
  if (stretch_free_[k]-- == run_slots_ && free_stretches_.contains(k)) {
    free_stretches_.Remove(static_cast<int32_t>(k));
  }
  refcount_[slot] = 1;
}

void KvPool::Free(int32_t slot) {
  ++changes_;
  free_.Add(slot);
  const int64_t k = slot / run_slots_;
  if (++stretch_free_[k] == run_slots_ && k < static_cast<int64_t>(free_stretches_.at.size())) {
    free_stretches_.Add(static_cast<int32_t>(k));
  }
}

int32_t KvPool::Continuation(const std::vector<int32_t>& out) const {
  // The slot after the table's last, unless that starts a stretch someone else may start a
  // run in (one that is not wholly free).
  if (out.empty()) return -1;
  const int64_t next = static_cast<int64_t>(out.back()) + 1;
  if (next < num_slots() && refcount_[next] == 0 &&
      (next % run_slots_ != 0 || free_stretches_.contains(next / run_slots_))) {
    return static_cast<int32_t>(next);
  }
  return -1;
}

int32_t KvPool::NextSlot(const std::vector<int32_t>& out, int64_t position) const {
  if (const int32_t next = Continuation(out); next >= 0) return next;
  // A new run, in a wholly free stretch, at the position's offset in a tile.
  if (!free_stretches_.items.empty()) {
    return static_cast<int32_t>(static_cast<int64_t>(free_stretches_.items.back()) * run_slots_ +
                                position % run_slots_);
  }
  // The newest free slot, moved back to the start of its free run (by at most a stretch),
  // so that the next ones can continue upward from it.
  int32_t slot = free_.items.back();
  for (int k = 0; k < run_slots_ && slot > 0 && refcount_[slot - 1] == 0; ++k) --slot;
  return slot;
}

const KvPool::EvictionWindow& KvPool::Window() {
  if (window_.changes == changes_) return window_;
  window_.changes = changes_;
  window_.searched = false;
  window_.blocks.clear();
  window_.slots.clear();
  if (idle_block_slots_ < kWindowMinIdleStretches * run_slots_) return window_;
  for (auto it = idle_.begin(); it != idle_.end() && window_.blocks.size() < kWindowBlocks; ++it) {
    if (eviction_ == KvEviction::kSchedulerAware && lookahead_.count(it->second)) continue;
    for (int32_t s : blocks_.at(it->second).slots) {
      window_.slots.emplace_back(s, static_cast<int>(window_.blocks.size()));
    }
    window_.blocks.push_back(it);
  }
  std::sort(window_.slots.begin(), window_.slots.end());
  return window_;
}

int KvPool::WindowBlockOf(int32_t slot) {
  const EvictionWindow& w = Window();
  auto it = std::lower_bound(w.slots.begin(), w.slots.end(), std::make_pair(slot, -1));
  return it != w.slots.end() && it->first == slot ? it->second : -1;
}

int32_t KvPool::StartRunInWindow(int64_t position) {
  if (Window().blocks.empty()) return -1;
  if (window_.searched) return -1;  // nothing changed since the last search found none
  window_.searched = true;
  const int64_t whole_stretches = static_cast<int64_t>(free_stretches_.at.size());
  const int64_t offset = position % run_slots_;
  std::vector<int64_t> tried;  // stretches, in the order of the blocks that hold them
  for (IdleOrder::iterator block : window_.blocks) {
    for (int32_t in_block : blocks_.at(block->second).slots) {
      const int64_t k = in_block / run_slots_;
      if (k >= whole_stretches || std::find(tried.begin(), tried.end(), k) != tried.end()) {
        continue;
      }
      tried.push_back(k);
      // Every slot of stretch k free or held by the window's blocks alone: no other run is
      // in it, and the blocks in the run's way are all due for eviction soon.
      std::vector<int> victims;
      bool ok = true;
      for (int64_t s = k * run_slots_; ok && s < (k + 1) * run_slots_; ++s) {
        if (refcount_[s] == 0) continue;
        const int b = refcount_[s] == 1 ? WindowBlockOf(static_cast<int32_t>(s)) : -1;
        ok = b >= 0;
        if (ok && std::find(victims.begin(), victims.end(), b) == victims.end()) {
          victims.push_back(b);
        }
      }
      if (!ok) continue;
      // Evicted together, so that no other run starts in the stretch meanwhile: they would
      // all go within the next kWindowBlocks evictions anyway.
      for (int b : victims) EvictIdle(window_.blocks[b]);
      return static_cast<int32_t>(k * run_slots_ + offset);
    }
  }
  return -1;
}

PoolStats KvPool::Stats() const {
  PoolStats s;
  s.total_slots = num_slots();
  s.free_slots = static_cast<int64_t>(free_.items.size());
  s.reclaimable_slots = idle_block_slots_;
  s.used_slots = s.total_slots - s.free_slots - s.reclaimable_slots;
  s.cached_blocks = static_cast<int64_t>(blocks_.size());
  s.idle_blocks = static_cast<int64_t>(idle_.size());
  return s;
}

int64_t KvPool::AvailableOutsideLookahead() const {
  int64_t protected_slots = 0;
  for (uint64_t hash : lookahead_) {
    auto it = blocks_.find(hash);
    if (it != blocks_.end() && it->second.holders == 0) protected_slots += block_tokens_;
  }
  return available() - protected_slots;
}

bool KvPool::IsIdleBlock(uint64_t hash) const {
  auto it = blocks_.find(hash);
  return it != blocks_.end() && it->second.holders == 0;
}

void KvPool::MakeIdle(uint64_t hash, Block& block) {
  block.idle_key = eviction_ == KvEviction::kFifo ? block.cached : ++tick_;
  idle_.emplace(block.idle_key, hash);
  idle_block_slots_ += block_tokens_;
  ++changes_;
}

bool KvPool::EvictOne() {
  if (idle_.empty()) return false;
  EvictIdle(
      eviction_ == KvEviction::kSchedulerAware
          ? FirstOutsideLookahead(idle_.begin(), idle_.end(), lookahead_,
                                  [](const std::pair<uint64_t, uint64_t>& e) { return e.second; })
          : idle_.begin());
  return true;
}

void KvPool::EvictIdle(IdleOrder::iterator victim) {
  ++changes_;  // the window's iterators are stale
  const uint64_t hash = victim->second;
  idle_.erase(victim);
  auto it = blocks_.find(hash);
  CHECK(it != blocks_.end());
  CHECK_EQ(it->second.holders, 0);
  idle_block_slots_ -= block_tokens_;
  const std::vector<int32_t> slots = std::move(it->second.slots);
  blocks_.erase(it);
  Unref(slots);  // the cache's reference
  ++evicted_blocks_;
}

bool KvPool::Allocate(int64_t n, std::vector<int32_t>* out) {
  return Allocate(n, out, static_cast<int64_t>(out->size()));
}

bool KvPool::Allocate(int64_t n, std::vector<int32_t>* out, int64_t position) {
  if (n > available()) return false;
  for (int64_t i = 0; i < n; ++i) {
    // The run goes on where it can; with the cache full, a new run may start in a stretch
    // of blocks due for eviction.
    int32_t slot = Continuation(*out);
    if (slot < 0 && free_stretches_.items.empty()) slot = StartRunInWindow(position + i);
    if (slot < 0) {
      while (free_.items.empty()) CHECK(EvictOne()) << "available() promised " << n << " slots";
      slot = NextSlot(*out, position + i);
    }
    Take(slot);
    out->push_back(slot);
  }
  return true;
}

void KvPool::Ref(const std::vector<int32_t>& slots) {
  for (int32_t s : slots) {
    CHECK_GT(refcount_[s], 0u) << "ref of an unowned slot " << s;
    ++refcount_[s];
  }
}

void KvPool::Unref(const std::vector<int32_t>& slots) {
  for (int32_t s : slots) {
    CHECK_GT(refcount_[s], 0u) << "double free of slot " << s;
    if (--refcount_[s] == 0) Free(s);
  }
}

int KvPool::Admit(const std::vector<int32_t>& tokens, const std::vector<uint64_t>& hashes,
                  int max_blocks, int64_t length, std::vector<int32_t>* table,
                  std::vector<uint64_t>* held) {
  const int matched = MatchLength(tokens, hashes, max_blocks);
  // Taking an idle block removes its slots from what an allocation may reclaim.
  int64_t idle_taken = 0;
  for (int b = 0; b < matched; ++b) {
    if (blocks_.at(hashes[b]).holders == 0) idle_taken += block_tokens_;
  }
  const int64_t fresh = length - static_cast<int64_t>(matched) * block_tokens_;
  if (fresh < 0 || fresh > available() - idle_taken) return -1;
  TakePrefix(hashes, matched, table);
  held->insert(held->end(), hashes.begin(), hashes.begin() + matched);
  CHECK(Allocate(fresh, table));
  return matched;
}

int KvPool::MatchLength(const std::vector<int32_t>& tokens, const std::vector<uint64_t>& hashes,
                        int max_blocks) const {
  int matched = 0;
  const int limit = std::min<int>(max_blocks, static_cast<int>(hashes.size()));
  for (; matched < limit; ++matched) {
    auto it = blocks_.find(hashes[matched]);
    if (it == blocks_.end()) break;
    const int32_t* block = tokens.data() + static_cast<size_t>(matched) * block_tokens_;
    if (!std::equal(it->second.tokens.begin(), it->second.tokens.end(), block)) break;
  }
  return matched;
}

void KvPool::TakePrefix(const std::vector<uint64_t>& hashes, int num_blocks,
                        std::vector<int32_t>* slots) {
  for (int b = 0; b < num_blocks; ++b) {
    HoldBlock(hashes[b]);
    const Block& block = blocks_.at(hashes[b]);
    Ref(block.slots);
    slots->insert(slots->end(), block.slots.begin(), block.slots.end());
  }
}

int KvPool::holders(uint64_t hash) const {
  auto it = blocks_.find(hash);
  return it == blocks_.end() ? 0 : it->second.holders;
}

void KvPool::HoldBlock(uint64_t hash) {
  Block& block = blocks_.at(hash);
  if (block.holders++ == 0) {
    ++changes_;
    idle_.erase({block.idle_key, hash});
    idle_block_slots_ -= block_tokens_;
  }
}

bool KvPool::InsertBlock(uint64_t hash, const int32_t* tokens, const int32_t* slots) {
  if (blocks_.count(hash)) return false;
  for (int i = 0; i < block_tokens_; ++i) {
    if (refcount_[slots[i]] != 1) return false;  // shared with another request
  }
  Block block;
  block.hash = hash;
  block.tokens.assign(tokens, tokens + block_tokens_);
  block.slots.assign(slots, slots + block_tokens_);
  block.holders = 1;
  block.cached = ++tick_;
  Ref(block.slots);  // the cache's own reference
  blocks_.emplace(hash, std::move(block));
  return true;
}

void KvPool::DropBlock(uint64_t hash) {
  Block& block = blocks_.at(hash);
  CHECK_GT(block.holders, 0);
  if (--block.holders == 0) MakeIdle(hash, block);
}

bool KvPool::BlockContents(uint64_t hash, const int32_t** tokens, const int32_t** slots) const {
  auto it = blocks_.find(hash);
  if (it == blocks_.end()) return false;
  *tokens = it->second.tokens.data();
  *slots = it->second.slots.data();
  return true;
}

bool KvPool::CheckInvariants(const std::vector<int32_t>& external_refs) const {
  std::vector<uint32_t> expected(refcount_.size(), 0);
  for (int32_t s : external_refs) ++expected[s];
  int64_t idle = 0;
  for (const auto& [hash, block] : blocks_) {
    for (int32_t s : block.slots) ++expected[s];
    if (block.holders == 0) idle += block_tokens_;
  }
  if (expected != refcount_) return false;
  // An idle block's slots are referenced by the cache alone, so evicting it frees them.
  for (const auto& [hash, block] : blocks_) {
    if (block.holders != 0) continue;
    for (int32_t s : block.slots) {
      if (refcount_[s] != 1) return false;
    }
  }
  if (idle != idle_block_slots_ || static_cast<int64_t>(idle_.size()) * block_tokens_ != idle) {
    return false;
  }
  // The free set holds exactly the unreferenced slots, each stretch's count is its free
  // slots, and the free stretches are exactly the whole ones with every slot free.
  for (size_t i = 0; i < free_.items.size(); ++i) {
    const int32_t s = free_.items[i];
    if (free_.at[s] != static_cast<int32_t>(i) || refcount_[s] != 0) return false;
  }
  std::vector<int32_t> stretch_free(stretch_free_.size(), 0);
  for (size_t s = 0; s < refcount_.size(); ++s) {
    if ((refcount_[s] == 0) != free_.contains(static_cast<int64_t>(s))) return false;
    stretch_free[s / run_slots_] += refcount_[s] == 0 ? 1 : 0;
  }
  if (stretch_free != stretch_free_) return false;
  for (size_t i = 0; i < free_stretches_.items.size(); ++i) {
    if (free_stretches_.at[free_stretches_.items[i]] != static_cast<int32_t>(i)) return false;
  }
  for (size_t k = 0; k < free_stretches_.at.size(); ++k) {
    if (free_stretches_.contains(static_cast<int64_t>(k)) != (stretch_free_[k] == run_slots_)) {
      return false;
    }
  }
  return true;
}

}  // namespace strata
