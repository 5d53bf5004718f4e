// The scheduler's side of the disk tier (docs/architecture.md, "The disk tier"): it
// allocates disk extents (DiskLedger) as it allocates DRAM slots, orders the moves, and
// applies their outcomes. Memory nodes only execute (memory_node/kv_disk_tier.h).
//   - Save early: when a request finishes or is preempted, each full block it held goes
//     to disk (unless it is there already), while the block stays in DRAM, held, until the
//     save is back. Evicting a block from DRAM later is then a free drop.
//   - Lookup: admission matches the prefix in DRAM, then continues it on disk.
//   - Load: the disk blocks are read into the request's fresh slots before any of its rows
//     run (attention always reads DRAM). A block that fails its checksum is dropped from
//     the index, and its tokens and everything after them are recomputed.
//   - A failed save (a full disk, an I/O error, a dead node) leaves the block "not on disk";
//     nothing else changes.
#include <algorithm>
#include <map>
#include <optional>
#include <random>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/logging.h"
#include "server/scheduler_internal.h"

namespace strata {
namespace {

// How often the TTL is enforced: a quarter of it, between 1 s and a minute.
absl::Duration ExpiryPeriod(absl::Duration ttl) {
  return std::clamp(ttl / 4, absl::Seconds(1), absl::Minutes(1));
}

}  // namespace

void Scheduler::SetPoolDisk(PoolIndex pool, int64_t extents, std::shared_ptr<KvMover> mover) {
  Post([this, pool, extents, mover = std::move(mover)]() mutable {
    if (pool.value() >= pools_.size() || extents <= 0 || mover == nullptr) return;
    Pool& p = *pools_[pool.value()];
    if (!p.alive) return;
    p.disk = std::make_unique<DiskLedger>(extents, config_.block_tokens, config_.disk_ttl);
    p.mover = std::move(mover);
    ++p.generation;
    for (const DiskOp& op : p.moves) {
      if (op.prefetch) p.kv->Unref(op.move.slots);  // never sent: its slots go back
    }
    p.prefetching.clear();
    p.loads.clear();
    p.moves.clear();
    p.saving_slots = 0;
    p.load_rule = LoadRule();
    LOG(INFO) << "KV pool " << p.name << " has a disk tier of " << extents << " blocks";
    if (!expire_timer_set_) {
      expire_timer_set_ = true;
      loop_.RunAfter(ExpiryPeriod(config_.disk_ttl), [this] { ExpireDisk(); });
    }
  });
}

void Scheduler::ExpireDisk() {
  const absl::Time now = absl::Now();
  bool any = false;
  for (size_t i = 0; i < pools_.size(); ++i) {
    Pool& p = *pools_[i];
    if (!p.alive || p.disk == nullptr) continue;
    any = true;
    for (int64_t extent : p.disk->Expire(now)) Drop(PoolIndex(i), extent);
  }
  expire_timer_set_ = any;
  if (any) loop_.RunAfter(ExpiryPeriod(config_.disk_ttl), [this] { ExpireDisk(); });
}

void Scheduler::Drop(PoolIndex pool, int64_t extent) {
  DiskOp op;
  op.move.kind = KvMove::Kind::kDrop;
  op.move.extent = static_cast<uint64_t>(extent);
  pools_[pool.value()]->moves.push_back(std::move(op));
}

void Scheduler::SaveBlock(PoolIndex pool, uint64_t hash, bool frees) {
  Pool& p = *pools_[pool.value()];
  if (!p.alive || p.disk == nullptr) return;
  const int32_t* tokens = nullptr;
  const int32_t* slots = nullptr;
  if (!p.kv->BlockContents(hash, &tokens, &slots)) return;
  const std::optional<int64_t> extent = p.disk->BeginSave(hash, tokens, absl::Now());
  if (!extent) return;    // on disk already, or no extent free of reads and writes
  p.kv->HoldBlock(hash);  // in DRAM until it is on disk
  if (frees) p.saving_slots += config_.block_tokens;
  DiskOp op;
  op.frees = frees;
  op.move.kind = KvMove::Kind::kSave;
  op.move.extent = static_cast<uint64_t>(*extent);
  op.move.key = hash;
  op.move.slots.assign(slots, slots + config_.block_tokens);
  p.moves.push_back(std::move(op));
}

int Scheduler::DiskMatch(PoolIndex pool, const Request& req, const std::vector<int32_t>& tokens,
                         const std::vector<uint64_t>& hashes, int from, int max) const {
  if (!config_.enable_prefix_caching || req.disk_loads_failed) return 0;
  const Pool& p = *pools_[pool.value()];
  if (!p.alive || p.disk == nullptr || max <= 0) return 0;
  return p.disk->Match(tokens, hashes, from, max);
}

void Scheduler::StartLoads(Request* req, int from, int count) {
  Sequence* owner = req->Owner();
  Pool& p = *pools_[req->pool->value()];
  const int64_t block = config_.block_tokens;
  const absl::Time now = absl::Now();
  if (next_load_ticket_ == 0) {
    // Tickets differ across schedulers (a restart, a second replica): a node's gate keeps
    // a finished ticket for a while, and must never take a new load for it.
    std::random_device random;
    next_load_ticket_ = (static_cast<uint64_t>(random()) << 32 | random()) | 1;
  }
  const uint64_t ticket = config_.disk_layerwise ? next_load_ticket_++ : 0;
  int started = 0;
  for (int b = from; b < from + count; ++b) {
    const std::optional<int64_t> extent = p.disk->BeginLoad(owner->hashes[b], now);
    if (!extent) break;
    DiskOp op;
    op.move.kind = KvMove::Kind::kLoad;
    op.move.ticket = ticket;
    op.move.extent = static_cast<uint64_t>(*extent);
    op.move.key = owner->hashes[b];
    op.move.slots.assign(owner->table.begin() + b * block, owner->table.begin() + (b + 1) * block);
    op.request_id = req->id;
    op.sample = owner->index;
    op.block = b;
    p.loads.push_back(std::move(op));
    ++started;
  }
  if (started == 0) return;
  // Like a plan in flight: its KV stays allocated (a preemption or a cancellation waits
  // for the loads), and it is not planned until they are back.
  req->loading = true;
  ++req->in_flight;
  ++owner->in_flight;
  owner->in_flight_samples = false;
  if (ticket != 0) {
    // Layer-wise: its new tokens may compute while these load (BuildPlan); they start after
    // the loaded blocks, which are voided if the loads fail (LoadsDone).
    req->load_ticket = ticket;
    req->preload_planned = false;
    owner->computed = static_cast<int64_t>(from + started) * block;
    req->preload_at = PreloadAt(*req, started);
  }
}

void Scheduler::Prefetch() {
  if (config_.kv_eviction != KvEviction::kSchedulerAware || !config_.enable_prefix_caching) {
    return;
  }
  // The window: the next waiting requests, in the order they will run. Each protects, in
  // the pool it would go to (the longest prefix in both tiers, as Place chooses), its
  // blocks in DRAM and those it will read from disk. With lookahead_fits_dram it ends
  // before the first request whose blocks would take what the window needs of its pool
  // (every block counted once) past the room there: DRAM that running requests leave,
  // less a block per running sequence (their decode grows into it). A window larger than
  // DRAM protects blocks it cannot keep, and its prefetches stop at the first that finds
  // no room, while the requests about to run lose theirs to LRU among the protected.
  const int64_t block = config_.block_tokens;
  const std::vector<int64_t> headroom = DecodeHeadroom();
  struct Wanted {
    Request* req;
    PoolIndex pool;
    int in_dram, on_disk;
  };
  std::vector<Wanted> wanted;
  std::vector<std::unordered_set<uint64_t>> window(pools_.size());
  std::vector<int64_t> window_blocks(pools_.size(), 0);  // of the room, per pool
  int seen = 0;
  lookahead_window_requests_ = 0;
  ++lookahead_pass_;
  for (Request* req : waiting_) {
    if (seen++ >= config_.lookahead_requests) break;
    Sequence* owner = req->Owner();
    if (owner == nullptr || owner->tokens.size() < 2) continue;
    if (req->lookahead_tokens != owner->tokens.size()) {
      req->lookahead_hashes.clear();
      AppendBlockHashes(owner->tokens, config_.block_tokens, config_.cache_salt,
                        &req->lookahead_hashes);
      req->lookahead_tokens = owner->tokens.size();
    }
    const std::vector<uint64_t>& hashes = req->lookahead_hashes;
    const int max_blocks = static_cast<int>((owner->tokens.size() - 1) / config_.block_tokens);
    std::optional<Wanted> best;
    for (size_t i = 0; i < pools_.size(); ++i) {
      const Pool& p = *pools_[i];
      if (!p.alive) continue;
      const int dram = p.kv->MatchLength(owner->tokens, hashes, max_blocks);
      const int disk =
          DiskMatch(PoolIndex(i), *req, owner->tokens, hashes, dram, max_blocks - dram);
      if (!best || std::make_pair(dram + disk, dram) >
                       std::make_pair(best->in_dram + best->on_disk, best->in_dram)) {
        best = Wanted{req, PoolIndex(i), dram, disk};
      }
    }
    if (!best) continue;
    std::unordered_set<uint64_t>& protect = window[best->pool.value()];
    const auto first = hashes.begin(), last = first + best->in_dram + best->on_disk;
    if (config_.lookahead_fits_dram) {
      // What the window takes of the room: its idle blocks in DRAM, and its blocks on disk
      // not yet on their way (a prefetch in flight has its slots already). Blocks running
      // requests hold are not in the room at all.
      const Pool& p = *pools_[best->pool.value()];
      int64_t cost = 0;
      for (int b = 0; b < best->in_dram + best->on_disk; ++b) {
        if (protect.count(hashes[b])) continue;
        cost += b < best->in_dram ? (p.kv->IsIdleBlock(hashes[b]) ? 1 : 0)
                                  : (p.prefetching.count(hashes[b]) ? 0 : 1);
      }
      int64_t& taken = window_blocks[best->pool.value()];
      if ((taken + cost) * block > p.kv->available() - headroom[best->pool.value()]) break;
      taken += cost;
    }
    protect.insert(first, last);
    ++lookahead_window_requests_;
    req->lookahead_pass = lookahead_pass_;
    if (best->on_disk > 0) wanted.push_back(*best);
  }
  for (size_t i = 0; i < pools_.size(); ++i) {
    Pool& p = *pools_[i];
    if (!p.alive) continue;
    if (p.disk != nullptr) p.disk->SetLookahead(window[i]);
    p.kv->SetLookahead(std::move(window[i]));
  }
  if (wanted.empty()) return;
  // Read the window's history on disk into DRAM, in run order, while DRAM outside the
  // window has room for it, less a block per running sequence of the pool (their decode
  // grows into it): a prefetch never makes a running request yield to a waiting one.
  const absl::Time now = absl::Now();
  for (const Wanted& w : wanted) {
    Pool& p = *pools_[w.pool.value()];
    if (p.mover == nullptr) continue;
    Sequence* owner = w.req->Owner();
    const std::vector<uint64_t>& hashes = w.req->lookahead_hashes;
    const int end = w.in_dram + w.on_disk;
    // Blocks already on their way are skipped (the rest still chain after them).
    int first = w.in_dram;
    while (first < end && p.prefetching.count(hashes[first])) ++first;
    if (first == end) continue;
    if (p.kv->AvailableOutsideLookahead() - headroom[w.pool.value()] < (end - first) * block) {
      break;
    }
    for (int b = first; b < end; ++b) {
      if (p.prefetching.count(hashes[b])) continue;
      if (!OrderPrefetch(w.pool, hashes[b], owner->tokens.data() + b * block, b, now)) break;
    }
  }
}

void Scheduler::CountAdmissionLoads(const Request& req, PoolIndex pool, int from, int count) {
  const Pool& p = *pools_[pool.value()];
  const Sequence* owner = req.Owner();
  const int end = std::min(from + count, static_cast<int>(owner->hashes.size()));
  int64_t outside = 0, prefetching = 0, not_prefetched = 0;
  if (req.lookahead_pass != lookahead_pass_) {
    outside = std::max(0, end - from);
  } else {
    for (int b = from; b < end; ++b) {
      if (p.prefetching.count(owner->hashes[b])) {
        ++prefetching;
      } else {
        ++not_prefetched;
      }
    }
  }
  absl::MutexLock lock(&stats_mu_);
  counters_.admission_loads_outside_window_total += outside;
  counters_.admission_loads_prefetching_total += prefetching;
  counters_.admission_loads_not_prefetched_total += not_prefetched;
}

std::vector<int64_t> Scheduler::DecodeHeadroom() const {
  std::vector<int64_t> headroom(pools_.size(), 0);
  for (const Request* r : running_) {
    if (r->pool) {
      headroom[r->pool->value()] += static_cast<int64_t>(r->seqs.size()) * config_.block_tokens;
    }
  }
  return headroom;
}

bool Scheduler::OrderPrefetch(PoolIndex pool, uint64_t hash, const int32_t* tokens, int block,
                              absl::Time now) {
  Pool& p = *pools_[pool.value()];
  const std::optional<int64_t> extent = p.disk->BeginLoad(hash, now);
  if (!extent) return false;
  DiskOp op;
  op.move.kind = KvMove::Kind::kLoad;
  op.move.extent = static_cast<uint64_t>(*extent);
  op.move.key = hash;
  // At the block's position, so that a request that takes it can continue its run.
  CHECK(p.kv->Allocate(config_.block_tokens, &op.move.slots,
                       static_cast<int64_t>(block) * config_.block_tokens));
  op.prefetch = true;
  op.kv_epoch = p.kv_epoch;
  op.block = block;
  op.tokens.assign(tokens, tokens + config_.block_tokens);
  p.prefetching.insert(hash);
  // Beside the saves: a request's own loads never queue behind a prefetch.
  p.moves.push_back(std::move(op));
  return true;
}

void Scheduler::PrefetchDone(PoolIndex pool, bool current, DiskOp& op, const absl::Status& st) {
  Pool& p = *pools_[pool.value()];
  if (current) {
    p.prefetching.erase(op.move.key);
    const std::optional<int64_t> drop = p.disk->LoadDone(op.move.key, st, absl::Now());
    if (drop) Drop(pool, *drop);
  }
  // The slots belong to the KV ledger that allocated them; a new one (the pool died and came
  // back) never saw them.
  if (!p.alive || p.kv_epoch != op.kv_epoch) return;
  bool cached = false;
  if (current && st.ok()) {
    // Cached in DRAM, idle: the next admission of its request finds it there.
    cached = p.kv->InsertBlock(op.move.key, op.tokens.data(), op.move.slots.data());
    if (cached) p.kv->DropBlock(op.move.key);
  }
  p.kv->Unref(op.move.slots);  // the prefetch's own reference; the cache keeps its own
  if (!st.ok()) {
    LOG(WARNING) << "prefetch of a KV block failed (" << st << "); it is recomputed if needed";
  }
  absl::MutexLock lock(&stats_mu_);
  if (cached) ++counters_.disk_prefetched_blocks_total;
  if (!st.ok()) ++counters_.disk_failed_loads_total;
}

absl::Time Scheduler::PreloadAt(const Request& req, int blocks) const {
  const Pool& p = *pools_[req.pool->value()];
  const double load = p.load_rule.LoadSeconds(blocks);
  const double rate = prefill_rate_.rows_per_second();
  const Sequence* owner = req.Owner();
  if (load < 0 || rate <= 0 || owner == nullptr) return absl::Now();  // not measured yet
  const double latency = p.load_rule.LatencySeconds();
  const double rows = static_cast<double>(owner->tokens.size()) - owner->computed;
  return absl::Now() + absl::Seconds(PreloadLead(latency, std::max(0.0, load - latency),
                                                 rows / rate, config_.num_layers));
}

bool Scheduler::AwaitsLoads(const StepPlan& plan) const {
  for (const SequenceChunk& c : plan.chunks) {
    if (c.load_ticket == 0) continue;
    auto it = sequences_.find(c.request_id);
    if (it != sequences_.end() && it->second->request->load_ticket == c.load_ticket) return true;
  }
  return false;
}

void Scheduler::ReplayParked() {
  // In arrival order; one that still awaits loads holds back those after it, as results
  // of one compute node are applied in order.
  while (!parked_.empty() && !AwaitsLoads(*parked_.front().plan)) {
    ParkedResult r = std::move(parked_.front());
    parked_.pop_front();
    // Timed as if applied when it arrived: the wait for the loads is not the step's.
    OnStepResult(r.executor, *r.plan, std::move(r.result), r.started + (absl::Now() - r.arrived));
  }
}

void Scheduler::FlushDiskMoves() {
  for (size_t i = 0; i < pools_.size(); ++i) {
    Pool& p = *pools_[i];
    if (p.mover == nullptr || (p.loads.empty() && p.moves.empty())) continue;
    for (std::vector<DiskOp>* ops : {&p.loads, &p.moves}) {
      if (ops->empty()) continue;
      std::vector<KvMove> moves;
      for (const DiskOp& op : *ops) moves.push_back(op.move);
      const PoolIndex pool(i);
      p.mover->Submit(
          std::move(moves),
          [this, pool, generation = p.generation, done = std::move(*ops),
           submitted = absl::Now()](std::vector<absl::Status> status) mutable {
            const absl::Duration took = absl::Now() - submitted;
            Post([this, pool, generation, done = std::move(done), status = std::move(status),
                  took]() mutable {
              OnDiskMoves(pool, generation, std::move(done), std::move(status), took);
            });
          },
          /*background=*/ops == &p.moves);
      ops->clear();
    }
  }
}

void Scheduler::OnDiskMoves(PoolIndex pool, uint64_t generation, std::vector<DiskOp> ops,
                            std::vector<absl::Status> status, absl::Duration took) {
  Pool& p = *pools_[pool.value()];
  const bool current = p.alive && p.disk != nullptr && p.generation == generation;
  // A batch of loads that came back whole: what reading from this disk costs. One that ran
  // out of its deadline whole says the disk is slower than the deadline allows: otherwise
  // each new request would try it and wait the deadline out.
  if (current && !ops.empty() && ops.front().move.kind == KvMove::Kind::kLoad &&
      !ops.front().prefetch && status.size() == ops.size()) {
    const bool ok =
        std::all_of(status.begin(), status.end(), [](const absl::Status& s) { return s.ok(); });
    const bool late = std::all_of(status.begin(), status.end(), [](const absl::Status& s) {
      return absl::IsDeadlineExceeded(s);
    });
    if (ok) p.load_rule.ObserveLoad(static_cast<int>(ops.size()), absl::ToDoubleSeconds(took));
    if (late) p.load_rule.ObserveLate();
  }
  const absl::Time now = absl::Now();
  std::map<uint64_t, std::vector<std::pair<DiskOp, absl::Status>>> loads;  // by request
  int64_t saved = 0, failed_saves = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    const absl::Status st = i < status.size() ? status[i] : absl::InternalError("no outcome");
    DiskOp& op = ops[i];
    switch (op.move.kind) {
      case KvMove::Kind::kSave:
        if (!current) break;  // the pool's KV and its tier are gone
        p.disk->SaveDone(op.move.key, st.ok(), now);
        p.kv->DropBlock(op.move.key);
        if (op.frees) {
          p.saving_slots = std::max<int64_t>(0, p.saving_slots - config_.block_tokens);
        }
        (st.ok() ? saved : failed_saves) += 1;
        break;
      case KvMove::Kind::kDrop:
        // A failed punch leaves stale bytes that the next save there overwrites whole.
        if (current) p.disk->PunchDone(static_cast<int64_t>(op.move.extent));
        break;
      case KvMove::Kind::kLoad:
        if (op.prefetch) {
          PrefetchDone(pool, current, op, st);
        } else {
          loads[op.request_id].emplace_back(std::move(op), st);
        }
        break;
    }
  }
  if (failed_saves > 0) {
    LOG(WARNING) << failed_saves << " KV blocks could not be saved on " << p.name
                 << "'s disk tier (they stay uncached there)";
  }
  {
    absl::MutexLock lock(&stats_mu_);
    counters_.disk_saved_blocks_total += saved;
    counters_.disk_failed_saves_total += failed_saves;
  }
  // Outcomes of an older tier (the pool died meanwhile) only release their requests.
  for (auto& [id, done] : loads) {
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;  // cannot happen: a loading request is in flight
    LoadsDone(it->second.get(), pool, current, std::move(done));
  }
  ReplayParked();
}

void Scheduler::LoadsDone(Request* req, PoolIndex pool, bool current,
                          std::vector<std::pair<DiskOp, absl::Status>> loads) {
  if (loads.empty()) return;
  Sequence* seq = nullptr;
  for (auto& s : req->seqs) {
    if (s->index == loads.front().first.sample) seq = s.get();
  }
  req->loading = false;
  const bool layerwise = req->load_ticket != 0;
  const bool preloaded = req->preload_planned;
  req->load_ticket = 0;
  req->preload_planned = false;
  if (req->in_flight > 0) --req->in_flight;
  if (seq != nullptr && seq->in_flight > 0) --seq->in_flight;
  const bool usable = seq != nullptr && req->pool == pool &&
                      req->state == Request::State::kRunning && !seq->finished &&
                      !req->preempt_when_landed;
  // Only the tier that ordered the loads applies them (a pool that died has a new one).
  Pool* p = pools_[pool.value()].get();
  const bool ledger = current;
  const int64_t block = config_.block_tokens;
  const absl::Time now = absl::Now();
  const int from = loads.front().first.block;
  int loaded = 0, failed = 0;
  bool contiguous = true;
  for (auto& [op, st] : loads) {
    if (ledger) {
      const std::optional<int64_t> drop = p->disk->LoadDone(op.move.key, st, now);
      if (drop) Drop(pool, *drop);
    }
    if (!st.ok()) {
      ++failed;
      req->disk_loads_failed = true;
      LOG(WARNING) << "KV block " << op.block << " of request " << req->id
                   << " could not be loaded from disk (" << st << "); "
                   << (LoadCondemnsBlock(st) ? "it is dropped from the index and recomputed"
                                             : "its tokens are recomputed");
    }
    contiguous = contiguous && st.ok() && op.block == from + loaded;
    if (!contiguous || !usable || !ledger) continue;
    const int64_t at = static_cast<int64_t>(op.block) * block;
    if (p->kv->InsertBlock(op.move.key, seq->tokens.data() + at, seq->table.data() + at)) {
      seq->held.emplace_back(op.block, op.move.key);
    }
    ++loaded;
  }
  if (layerwise && usable && loaded < static_cast<int>(loads.size())) {
    if (preloaded) {
      // A chunk already computed over KV that is not all there: what it computed is void.
      // The request starts over from what is cached (its result, parked until now, is
      // discarded; preemption waits for it).
      Preempt(req);
    } else {
      seq->computed = static_cast<int64_t>(from + (ledger ? loaded : 0)) * block;
    }
  }
  if (usable && ledger && loaded > 0) {
    seq->computed = std::max<int64_t>(seq->computed, (from + loaded) * block);
    seq->registered_blocks = std::max<int64_t>(seq->registered_blocks, from + loaded);
    if (req->first_load) {
      req->cached_prompt_tokens = std::min<int64_t>(seq->computed, req->prompt_len());
    }
  }
  {
    absl::MutexLock lock(&stats_mu_);
    counters_.disk_failed_loads_total += failed;
    if (preloaded) {
      ++counters_.disk_preloaded_requests_total;
      if (loaded < static_cast<int>(loads.size())) ++counters_.disk_preload_failed_total;
    }
    if (usable && ledger) {
      counters_.disk_loaded_blocks_total += loaded;
      counters_.disk_hit_tokens_total += loaded * block;
      counters_.prefix_hit_tokens_total += loaded * block;
    }
  }
  req->first_load = false;
  // A cancellation or timeout that came while it loaded.
  if (req->in_flight == 0 && req->state != Request::State::kDone && FinishPending(req)) return;
  Land(req);
}

}  // namespace strata
