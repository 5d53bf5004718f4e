// Admission and preemption: placing a waiting request in a KV pool (its cached prefix in
// DRAM, its continuation on disk, a truncated conversation's moved tail, the look-ahead
// window's reserve), and giving a running request's slots back. Building steps is in
// scheduler_plan.cc.
#include <algorithm>
#include <string>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "server/scheduler.h"
#include "server/scheduler_internal.h"

namespace strata {

void Scheduler::ForgetExecutor(Request* req) {
  req->executor = -1;
  for (auto& s : req->seqs) s->setup_sent = false;
}

void Scheduler::Preempt(Request* req) {
  if (req->in_flight > 0) {
    // A plan in flight still writes its KV: the slots go when it is back (Land), and what it
    // samples is discarded.
    req->preempt_when_landed = true;
    return;
  }
  std::string renamed;  // old and new sequence ids, for the log
  for (auto& seq : req->seqs) {
    if (seq->finished) continue;
    ReleaseKv(seq.get());
    seq->computed = 0;
    // Placed again under a new id: the release just queued for the old one (and any copy
    // of it sent again after a failed plan, OnStepResult) drops nothing of the new table,
    // even from a plan of another compute node that reaches the pool after the new setup.
    sequences_.erase(seq->id);
    const SequenceId old_id = seq->id;
    seq->id = SequenceId(next_sequence_id_++);
    sequences_[seq->id] = seq.get();
    absl::StrAppend(&renamed, renamed.empty() ? "" : ", ", old_id.value(), " -> ", seq->id.value());
  }
  Sequence* owner = req->Owner();
  for (auto& seq : req->seqs) {
    if (!seq->finished) seq->waiting_for_owner = seq.get() != owner;
  }
  req->pool.reset();
  req->executor = -1;
  SetState(req, Request::State::kWaiting);
  {
    absl::MutexLock lock(&stats_mu_);
    ++counters_.num_preemptions_total;
  }
  LOG(INFO) << "preempted request " << req->id << " (" << req->spec.external_id << "), sequences "
            << renamed << "; it will be recomputed";
}

PreemptionFrees Scheduler::PreemptionFreesOf(const Request* req) const {
  PreemptionFrees f;
  if (!req->pool || req->pool->value() >= pools_.size() || !pools_[req->pool->value()]->alive) {
    return f;
  }
  const Pool& pool = *pools_[req->pool->value()];
  const KvPool& kv = *pool.kv;
  // Its references to each slot, and its holds on each cached block (ReleaseKv drops both).
  std::unordered_map<int32_t, uint32_t> refs;
  std::unordered_map<uint64_t, int> holds;
  std::vector<uint64_t> blocks;  // in the order ReleaseKv saves them
  for (const auto& seq : req->seqs) {
    if (seq->finished) continue;
    for (int32_t slot : seq->table) ++refs[slot];
    for (const auto& [index, hash] : seq->held) {
      if (holds[hash]++ == 0) blocks.push_back(hash);
    }
  }
  // A slot only it references goes back to the free list. A cached block's slots also carry
  // the cache's reference: they count once the block goes idle.
  for (const auto& [slot, n] : refs) f.available += kv.refcount(slot) == n ? 1 : 0;
  int64_t save_room = pool.disk ? pool.disk->SaveRoom() : 0;
  for (uint64_t hash : blocks) {
    if (pool.disk && !pool.disk->Has(hash) && save_room > 0) {
      --save_room;  // held in DRAM until it is on disk (SaveBlock)
      f.saving += config_.block_tokens;
    } else if (kv.holders(hash) == holds[hash]) {
      f.available += config_.block_tokens;
    }
  }
  return f;
}

ReserveVerdict Scheduler::CheckPrefetchReserve(const Request* req, PoolIndex pool, int64_t fresh,
                                               bool has_prefix) const {
  if (config_.kv_eviction != KvEviction::kSchedulerAware || config_.kv_prefetch_reserve <= 0) {
    return ReserveVerdict::kPlace;
  }
  const bool alone = std::none_of(running_.begin(), running_.end(),
                                  [&](const Request* r) { return r != req && r->pool == pool; });
  const Pool& p = *pools_[pool.value()];
  const auto reserve =
      static_cast<int64_t>(config_.kv_prefetch_reserve * static_cast<double>(p.num_slots));
  return PrefetchReserve(p.kv->available(), fresh, reserve, alone, has_prefix);
}

bool Scheduler::Place(Request* req, int executor) {
  Sequence* owner = req->Owner();
  if (owner == nullptr) return false;
  const int64_t length = static_cast<int64_t>(owner->tokens.size());
  std::vector<PoolIndex> candidates;
  for (size_t p = 0; p < pools_.size(); ++p) {
    if (PoolServes(PoolIndex(p), executor)) candidates.push_back(PoolIndex(p));
  }
  if (candidates.empty()) return false;
  // A truncated request whose blocks to move are being read back from disk waits for them,
  // whichever pool or compute node is asking.
  if (!req->shift_prefetches.empty()) {
    const Pool& pool = *pools_[req->shift_prefetch_pool.value()];
    for (uint64_t hash : req->shift_prefetches) {
      if (pool.alive && pool.prefetching.count(hash)) return false;
    }
  }
  std::vector<uint64_t> hashes;
  if (config_.enable_prefix_caching) {
    AppendBlockHashes(owner->tokens, config_.block_tokens, config_.cache_salt, &hashes);
  }
  // The last token is always computed (its logits give the next one).
  const int max_blocks = static_cast<int>((length - 1) / config_.block_tokens);
  // What each pool holds of it (ledger queries), then the pools in the order
  // RankPlacements gives.
  const bool truncated = !req->untruncated.empty();
  std::vector<PlacementCandidate> found(candidates.size());
  std::vector<ShiftSource> moves(candidates.size());
  for (size_t i = 0; i < candidates.size(); ++i) {
    const PoolIndex p = candidates[i];
    const KvPool& kv = *pools_[p.value()]->kv;
    PlacementCandidate& c = found[i];
    c.dram_blocks =
        config_.enable_prefix_caching ? kv.MatchLength(owner->tokens, hashes, max_blocks) : 0;
    c.disk_blocks =
        DiskMatch(p, *req, owner->tokens, hashes, c.dram_blocks, max_blocks - c.dram_blocks);
    if (truncated && c.disk_blocks == 0) {
      moves[i] = FindShiftSource(req, p, c.dram_blocks, max_blocks);
    }
    c.move_blocks = static_cast<int>(moves[i].blocks.size());
    c.available = kv.available();
    c.used = kv.Stats().used_slots;
  }
  for (int i : RankPlacements(found, config_.block_tokens)) {
    const PoolIndex p = candidates[i];
    const PlacementCandidate& c = found[i];
    KvPool& kv = *pools_[p.value()]->kv;
    // A truncated conversation: the blocks its kept tail moves from are held before the
    // admission, whose allocation would otherwise evict them first (they are idle).
    const int shift_from = c.dram_blocks;
    ShiftSource source;
    if (truncated && c.disk_blocks == 0) {
      if (!req->shift_prefetched) {
        // Blocks to move that sit on disk only are read back first, once: the request
        // waits for them (as for a prefetch) rather than recompute them.
        const ShiftSource wider = FindShiftSource(req, p, shift_from, max_blocks, true);
        if (wider.any_on_disk() && PrefetchShiftSource(req, p, shift_from, wider, hashes)) {
          req->shift_prefetched = true;
          return false;
        }
      }
      req->shift_prefetches.clear();
      source = std::move(moves[i]);
      for (uint64_t hash : source.blocks) kv.HoldBlock(hash);
    }
    auto release_source = [&] {
      for (uint64_t hash : source.blocks) kv.DropBlock(hash);
      source.blocks.clear();
    };
    // The fresh slots it takes. Its own cached prefix counts toward the room it leaves: a
    // request whose history the window prefetched is what that room was kept for.
    const ReserveVerdict reserve = CheckPrefetchReserve(
        req, p, length - static_cast<int64_t>(c.dram_blocks) * config_.block_tokens,
        c.dram_blocks + c.disk_blocks > 0);
    if (reserve != ReserveVerdict::kPlace) {
      release_source();
      if (reserve == ReserveVerdict::kWait) return false;
      continue;
    }
    std::vector<int32_t> table;
    std::vector<uint64_t> held;
    const int prefix_blocks = config_.enable_prefix_caching ? max_blocks : 0;
    int matched = kv.Admit(owner->tokens, hashes, prefix_blocks, length, &table, &held);
    if (matched < 0 && !source.blocks.empty()) {
      // Moving needs the sources and their copies at once; without room for both, the
      // tail is recomputed.
      release_source();
      matched = kv.Admit(owner->tokens, hashes, prefix_blocks, length, &table, &held);
    }
    if (matched < 0) {
      release_source();
      continue;
    }
    owner->table = std::move(table);
    owner->held.clear();
    for (int b = 0; b < matched; ++b) owner->held.emplace_back(b, held[b]);
    owner->hashes = std::move(hashes);
    owner->computed = static_cast<int64_t>(matched) * config_.block_tokens;
    owner->registered_blocks = matched;
    owner->table_sent = 0;
    owner->waiting_for_owner = false;
    req->pool = p;
    req->executor = executor;
    SetState(req, Request::State::kRunning);
    const bool first_admission = req->admitted == absl::InfinitePast();
    if (first_admission) {
      req->admitted = absl::Now();
      req->cached_prompt_tokens = std::min<int64_t>(owner->computed, req->prompt_len());
      queued_.fetch_sub(1);
    }
    // The prefix continues on disk: read it into the fresh slots before any row runs.
    int on_disk = DiskMatch(p, *req, owner->tokens, owner->hashes, matched, max_blocks - matched);
    if (on_disk > 0 && config_.disk_load_when_faster &&
        !pools_[p.value()]->load_rule.Load(on_disk, static_cast<int>(config_.block_tokens),
                                           prefill_rate_)) {
      // Recomputing these is faster than reading them on this pool's disk, as measured.
      absl::MutexLock lock(&stats_mu_);
      counters_.disk_recomputed_blocks_total += on_disk;
      on_disk = 0;
    }
    // A truncated conversation: its kept tail's KV moves from where earlier turns cached it.
    int moved = 0;
    if (!source.blocks.empty() && matched == shift_from && on_disk == 0) {
      moved = static_cast<int>(source.blocks.size());
      TakeShiftSource(req, p, matched, source);
    } else {
      release_source();
    }
    if (truncated && first_admission) RememberTruncation(req);
    owner->computed += static_cast<int64_t>(moved) * config_.block_tokens;
    if (first_admission) {
      req->cached_prompt_tokens = std::min<int64_t>(owner->computed, req->prompt_len());
    }
    const int64_t in_dram = owner->computed;
    if (on_disk > 0) {
      req->first_load = first_admission;
      if (config_.kv_eviction == KvEviction::kSchedulerAware)
        CountAdmissionLoads(*req, p, matched, on_disk);
      StartLoads(req, matched, on_disk);
    }
    {
      absl::MutexLock lock(&stats_mu_);
      if (first_admission) counters_.prompt_tokens_total += req->prompt_len();
      counters_.prefix_query_tokens_total += length;
      counters_.prefix_hit_tokens_total += in_dram;
    }
    LOG_IF(INFO, first_admission) << "request " << req->id << " (" << req->spec.external_id
                                  << ") placed on " << pools_[p.value()]->name << " with "
                                  << in_dram << "/" << length << " tokens from the prefix cache"
                                  << (moved > 0 ? absl::StrCat(" (", moved * config_.block_tokens,
                                                               " of them moved by truncation)")
                                                : "")
                                  << (on_disk > 0
                                          ? absl::StrCat(" and ", on_disk * config_.block_tokens,
                                                         " to load from disk")
                                          : "");
    return true;
  }
  return false;
}

}  // namespace strata
