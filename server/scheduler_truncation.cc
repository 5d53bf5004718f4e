// Context truncation (server/truncation.h): the kept tail of a truncated conversation takes
// the KV its earlier turns cached, moved to its new positions, instead of being recomputed.
#include <algorithm>

#include "common/base/logging.h"
#include "server/scheduler.h"
#include "server/scheduler_internal.h"

namespace strata {
namespace {

// Truncations remembered for later turns (a few hundred bytes each).
constexpr size_t kRememberedTruncations = 4096;
// Earlier truncations of one conversation tried as sources, the most recent first.
constexpr size_t kShiftCandidates = 8;

}  // namespace

int Scheduler::MoveTruncatedTail(Request* req, PoolIndex pool, int from, int max_blocks) {
  if (req->untruncated.empty() || !config_.enable_prefix_caching) return 0;
  const Truncation& t = req->truncation;
  const int64_t b = config_.block_tokens;
  const std::vector<uint64_t> full =
      BlockHashes(req->untruncated, config_.block_tokens, config_.cache_salt);
  // This truncation, for the conversation's later turns: the untruncated prefix through
  // the first kept block after the drop.
  const size_t mark = static_cast<size_t>((t.keep_first + t.dropped) / b);
  if (mark < full.size() && truncated_prefixes_.insert(full[mark]).second) {
    truncated_order_.push_back(full[mark]);
    if (truncated_order_.size() > kRememberedTruncations) {
      truncated_prefixes_.erase(truncated_order_.front());
      truncated_order_.pop_front();
    }
  }
  Sequence* owner = req->Owner();
  // Blocks of the prompt only (after a preemption the tokens go on with outputs, which the
  // untruncated conversation does not have).
  const int last = std::min<int>(max_blocks, static_cast<int>(req->prompt_len() / b));
  if (owner == nullptr || config_.rope_inv_freq.empty() || from * b < t.keep_first ||
      from >= last) {
    return 0;
  }
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
  KvPool& kv = *pools_[pool.value()]->kv;
  int best_run = 0;
  int64_t best_drop = 0;
  std::vector<uint64_t> best_hashes;
  for (int64_t d0 : drops) {
    // The source sequence: the conversation as the earlier turn saw it.
    const std::vector<uint64_t> hashes =
        d0 == 0 ? full
                : BlockHashes(Truncate(req->untruncated, {t.keep_first, d0}), config_.block_tokens,
                              config_.cache_salt);
    const int64_t offset = (t.dropped - d0) / b;  // source block = target block + offset
    int run = 0;
    for (int j = from; j < last; ++j) {
      const size_t k = static_cast<size_t>(j + offset);
      const int32_t* tokens = nullptr;
      const int32_t* slots = nullptr;
      if (k >= hashes.size() || !kv.BlockContents(hashes[k], &tokens, &slots) ||
          !std::equal(tokens, tokens + b, owner->tokens.begin() + j * b)) {
        break;
      }
      ++run;
    }
    if (run > best_run) {
      best_run = run;
      best_drop = d0;
      best_hashes = hashes;
    }
  }
  if (best_run == 0) return 0;
  const int64_t offset = (t.dropped - best_drop) / b;
  KvShift shift;
  shift.position = static_cast<int32_t>(from * b);
  shift.shift = static_cast<int32_t>(-offset * b);
  ShiftAngles(config_.rope_inv_freq, shift.shift, &shift.cos, &shift.sin);
  for (int j = from; j < from + best_run; ++j) {
    const uint64_t hash = best_hashes[j + offset];
    const int32_t* tokens = nullptr;
    const int32_t* slots = nullptr;
    CHECK(kv.BlockContents(hash, &tokens, &slots));
    shift.from.insert(shift.from.end(), slots, slots + b);
    // Held (never evicted) until the step that copies it is back.
    kv.HoldBlock(hash);
    owner->shift_sources.push_back(hash);
  }
  owner->shifts.push_back(std::move(shift));
  return best_run;
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
