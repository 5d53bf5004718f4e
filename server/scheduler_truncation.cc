// Context truncation (server/truncation.h): the kept tail of a truncated conversation takes
// the KV its earlier turns cached, moved to its new positions, instead of being recomputed.
#include <algorithm>

#include "absl/cleanup/cleanup.h"
#include "common/base/logging.h"
#include "server/scheduler.h"
#include "server/scheduler_internal.h"

namespace strata {
namespace {

// Truncations remembered for later turns (8 bytes each, twice).
constexpr size_t kRememberedTruncations = 4096;
// Earlier truncations of one conversation tried as sources, the most recent first.
constexpr size_t kShiftCandidates = 8;

}  // namespace

bool Scheduler::ShiftSource::any_on_disk() const {
  return std::find(on_disk.begin(), on_disk.end(), true) != on_disk.end();
}

const std::vector<uint64_t>& Scheduler::UntruncatedHashes(Request* req) {
  if (req->untruncated_hashes.empty()) {
    req->untruncated_hashes =
        BlockHashes(req->untruncated, config_.block_tokens, config_.cache_salt);
  }
  return req->untruncated_hashes;
}

void Scheduler::RememberTruncation(Request* req) {
  const Truncation& t = req->truncation;
  // The untruncated prefix through the first kept block after the drop.
  const size_t mark = static_cast<size_t>((t.keep_first + t.dropped) / config_.block_tokens);
  if (req->untruncated.empty()) return;
  const std::vector<uint64_t>& hashes = UntruncatedHashes(req);
  if (mark >= hashes.size()) return;
  const uint64_t key = hashes[mark];
  if (!truncated_prefixes_.insert(key).second) return;
  truncated_order_.push_back(key);
  if (truncated_order_.size() > kRememberedTruncations) {
    truncated_prefixes_.erase(truncated_order_.front());
    truncated_order_.pop_front();
  }
}

Scheduler::ShiftSource Scheduler::FindShiftSource(Request* req, PoolIndex pool, int from,
                                                  int max_blocks, bool with_disk) {
  ShiftSource best;
  if (req->untruncated.empty() || !config_.enable_prefix_caching || config_.rope_inv_freq.empty()) {
    return best;
  }
  const Truncation& t = req->truncation;
  const int64_t b = config_.block_tokens;
  const Sequence* owner = req->Owner();
  // Blocks of the prompt only (after a preemption the tokens go on with outputs, which the
  // untruncated conversation does not have).
  const int last = std::min<int>(max_blocks, static_cast<int>(req->prompt_len() / b));
  if (owner == nullptr || from * b < t.keep_first || from >= last) return best;
  const std::vector<uint64_t>& full = UntruncatedHashes(req);
  // Where the kept tail sat before: the untruncated conversation (an earlier turn that fit),
  // or an earlier truncation of it that dropped less (d0 < dropped).
  std::vector<int64_t> drops;
  for (int64_t k = (t.keep_first + t.dropped) / b - 1; k > t.keep_first / b; --k) {
    if (drops.size() + 1 >= kShiftCandidates) break;
    if (static_cast<size_t>(k) < full.size() && truncated_prefixes_.count(full[k])) {
      drops.push_back(k * b - t.keep_first);
    }
  }
  drops.push_back(0);
  const Pool& p = *pools_[pool.value()];
  const KvPool& kv = *p.kv;
  with_disk = with_disk && p.disk != nullptr && p.mover != nullptr;
  for (int64_t d0 : drops) {
    // The source sequence: the conversation as the earlier turn saw it.
    std::vector<int32_t> truncated_tokens;
    std::vector<uint64_t> truncated;
    if (d0 > 0) {
      truncated_tokens = Truncate(req->untruncated, {t.keep_first, d0});
      truncated = BlockHashes(truncated_tokens, config_.block_tokens, config_.cache_salt);
    }
    const std::vector<int32_t>& source_tokens = d0 == 0 ? req->untruncated : truncated_tokens;
    const std::vector<uint64_t>& hashes = d0 == 0 ? full : truncated;
    const int64_t offset = (t.dropped - d0) / b;  // source block = target block + offset
    ShiftSource found;
    found.shift = static_cast<int32_t>(-offset * b);
    for (int j = from; j < last; ++j) {
      const size_t k = static_cast<size_t>(j + offset);
      if (k >= hashes.size()) break;
      const int32_t* tokens = nullptr;
      const int32_t* slots = nullptr;
      if (kv.BlockContents(hashes[k], &tokens, &slots) &&
          std::equal(tokens, tokens + b, owner->tokens.begin() + j * b)) {
        found.on_disk.push_back(false);
      } else if (with_disk && !p.prefetching.count(hashes[k]) &&
                 p.disk->Match(source_tokens, hashes, static_cast<int>(k), 1) == 1) {
        found.on_disk.push_back(true);
      } else {
        break;
      }
      found.blocks.push_back(hashes[k]);
    }
    if (found.blocks.size() > best.blocks.size()) best = std::move(found);
  }
  return best;
}

bool Scheduler::PrefetchShiftSource(Request* req, PoolIndex pool, int from,
                                    const ShiftSource& source,
                                    const std::vector<uint64_t>& hashes) {
  Pool& p = *pools_[pool.value()];
  const int64_t b = config_.block_tokens;
  const int64_t need =
      static_cast<int64_t>(std::count(source.on_disk.begin(), source.on_disk.end(), true)) * b;
  // The blocks the request will take from DRAM (its cached prefix, and the source's blocks
  // already there) are held while the reads' slots are allocated, which would otherwise
  // evict them first (they are idle); let go after, they are the most recently used. Room:
  // for the blocks read, beside the running sequences' decode headroom; and, once the saves
  // in flight free theirs, for those and the request's table beside the held blocks.
  const Sequence* owner = req->Owner();
  std::vector<uint64_t> in_dram(hashes.begin(), hashes.begin() + from);
  for (size_t i = 0; i < source.blocks.size(); ++i) {
    if (!source.on_disk[i]) in_dram.push_back(source.blocks[i]);
  }
  for (uint64_t hash : in_dram) p.kv->HoldBlock(hash);
  absl::Cleanup release = [&] {
    for (uint64_t hash : in_dram) p.kv->DropBlock(hash);
  };
  const int64_t headroom = DecodeHeadroom()[pool.value()];
  if (p.kv->available() - headroom < need ||
      p.kv->available() + p.saving_slots - headroom <
          need + static_cast<int64_t>(owner->tokens.size())) {
    return false;
  }
  const absl::Time now = absl::Now();
  for (size_t i = 0; i < source.blocks.size(); ++i) {
    if (!source.on_disk[i]) continue;
    const int j = from + static_cast<int>(i);  // the target block: the same tokens
    if (!OrderPrefetch(pool, source.blocks[i], owner->tokens.data() + j * b, j, now)) break;
    req->shift_prefetches.push_back(source.blocks[i]);
  }
  req->shift_prefetch_pool = pool;
  return !req->shift_prefetches.empty();
}

void Scheduler::TakeShiftSource(Request* req, PoolIndex pool, int from, const ShiftSource& source) {
  Sequence* owner = req->Owner();
  KvPool& kv = *pools_[pool.value()]->kv;
  const int b = config_.block_tokens;
  KvShift shift;
  shift.position = from * b;
  shift.shift = source.shift;
  ShiftAngles(config_.rope_inv_freq, shift.shift, &shift.cos, &shift.sin);
  for (uint64_t hash : source.blocks) {
    const int32_t* tokens = nullptr;
    const int32_t* slots = nullptr;
    CHECK(kv.BlockContents(hash, &tokens, &slots)) << "a held source block left the pool";
    shift.from.insert(shift.from.end(), slots, slots + b);
    owner->shift_sources.push_back(hash);  // held since before admission
  }
  owner->shifts.push_back(std::move(shift));
}

void Scheduler::DropShiftSources(Sequence* seq) {
  const Request* req = seq->request;
  if (!seq->shift_sources.empty() && req->pool && pools_[req->pool->value()]->alive) {
    KvPool& kv = *pools_[req->pool->value()]->kv;
    for (uint64_t hash : seq->shift_sources) kv.DropBlock(hash);
  }
  seq->shift_sources.clear();
  seq->shifts.clear();
}

}  // namespace strata
