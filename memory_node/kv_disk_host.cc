#include "memory_node/kv_disk_host.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace strata {

std::string KvDiskFingerprint(const std::string& model, uint32_t layers, uint32_t kv_heads,
                              uint32_t head_dim, const std::string& kv_dtype) {
  return absl::StrCat(model, " ", layers, "x", kv_heads, "x", head_dim, " ", kv_dtype);
}

namespace {

// `to` += the counters of `from` (not its space, which belongs to the open tier).
void AddCounters(const KvDiskTierStats& from, KvDiskTierStats& to) {
  to.saves += from.saves;
  to.failed_saves += from.failed_saves;
  to.loads += from.loads;
  to.failed_loads += from.failed_loads;
  to.drops += from.drops;
  to.bytes_written += from.bytes_written;
  to.bytes_read += from.bytes_read;
  to.checksum_failures += from.checksum_failures;
  to.save_seconds += from.save_seconds;
  to.load_seconds += from.load_seconds;
}

}  // namespace

KvDiskHost::KvDiskHost(KvDiskTierOptions options) : options_(std::move(options)) {
  // Ids differ across the node's restarts too: a mover of a previous process never matches.
  std::random_device random;
  next_id_ = (static_cast<uint64_t>(random()) << 32 | random()) | 1;
}

void KvDiskHost::RetireLocked() {
  if (tier_ == nullptr) return;
  if (!retired_) retired_.emplace();
  AddCounters(tier_->stats(), *retired_);
  tier_.reset();
  tier_id_ = 0;
}

void KvDiskHost::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  std::lock_guard<std::mutex> ptr_lock(ptr_mu_);
  RetireLocked();
}

absl::StatusOr<DiskTierAck> KvDiskHost::Open(uint64_t epoch, KvStore* store, int block_tokens,
                                             const std::string& fingerprint) {
  std::lock_guard<std::mutex> lock(mu_);
  {
    // The old tier's blocks belong to the old index.
    std::lock_guard<std::mutex> ptr_lock(ptr_mu_);
    RetireLocked();
  }
  epoch_ = epoch;
  if (!enabled()) return absl::FailedPreconditionError("this node has no --kv_disk_dir");
  KvDiskTierOptions options = options_;
  options.gate = &gate_;
  auto tier = KvDiskTier::Open(options, store, block_tokens, fingerprint);
  if (!tier.ok()) return tier.status();
  tier_id_ = next_id_++;
  if (tier_id_ == 0) tier_id_ = next_id_++;
  DiskTierAck info{(*tier)->extents(), (*tier)->direct(), (*tier)->block_bytes(), tier_id_};
  std::lock_guard<std::mutex> ptr_lock(ptr_mu_);
  tier_ = std::move(*tier);
  return info;
}

absl::StatusOr<std::vector<absl::Status>> KvDiskHost::Move(uint64_t epoch, uint64_t tier,
                                                           std::span<const KvMove> moves,
                                                           absl::Time deadline) {
  // Steps that wait for these loads learn of them (and of their deadline) now, before the
  // moves queue behind others. Loads a step already gave up on are refused: whatever they
  // read would be reported failed.
  std::vector<absl::Status> out(moves.size());
  std::vector<size_t> run;  // the moves that run, by index
  for (size_t i = 0; i < moves.size(); ++i) {
    if (moves[i].kind == KvMove::Kind::kLoad && !gate_.Expect(moves[i].ticket, deadline)) {
      out[i] = absl::DeadlineExceededError("the step waiting for this block gave up");
    } else {
      run.push_back(i);
    }
  }
  std::vector<KvMove> subset;  // only when some were refused
  std::span<const KvMove> to_run = moves;
  if (run.size() < moves.size()) {
    for (size_t i : run) subset.push_back(moves[i]);
    to_run = subset;
  }
  // Loads go first: a step may wait for them. A batch without loads (saves, drops) runs
  // kMovesPerTurn moves at a time and lets loads that wait meanwhile go in between (the
  // scheduler never loads a block it is still saving, nor reuses the slots or extents of
  // moves in flight, so the order between batches is free).
  const bool loads = std::any_of(to_run.begin(), to_run.end(),
                                 [](const KvMove& m) { return m.kind == KvMove::Kind::kLoad; });
  if (loads) ++loads_waiting_;
  absl::Status refused;
  size_t first = 0;
  do {
    std::unique_lock<std::mutex> lock(mu_);
    // Loads that keep coming hold a batch without loads back until its own deadline at most.
    if (!loads && !to_run.empty()) {
      // (No later than a day: an infinite time point overflows the wait's clock arithmetic.)
      const absl::Time until = std::min(deadline, absl::Now() + absl::Hours(24));
      turn_cv_.wait_until(lock, absl::ToChronoTime(until),
                          [&] { return loads_waiting_.load() == 0; });
    }
    refused = RefusedLocked(epoch, tier, deadline);
    if (refused.ok()) {
      const size_t count = loads ? to_run.size() : std::min(kMovesPerTurn, to_run.size() - first);
      const std::vector<absl::Status> done = tier_->Execute(to_run.subspan(first, count), deadline);
      for (size_t k = 0; k < count; ++k) out[run[first + k]] = done[k];
      first += count;
    }
    if (loads) --loads_waiting_;
    lock.unlock();
    turn_cv_.notify_all();
  } while (refused.ok() && first < to_run.size());
  if (refused.ok()) return out;
  if (first > 0) {
    // Refused part-way (its deadline passed, or the tier was replaced): the rest fails.
    for (size_t k = first; k < run.size(); ++k) out[run[k]] = refused;
    return out;
  }
  for (const KvMove& m : moves) {
    if (m.kind == KvMove::Kind::kLoad) gate_.Finish(m.ticket, false);
  }
  return refused;
}

absl::Status KvDiskHost::RefusedLocked(uint64_t epoch, uint64_t tier, absl::Time deadline) const {
  if (absl::Now() > deadline) {
    return absl::DeadlineExceededError("KV moves whose caller gave up waiting (not run)");
  }
  if (epoch != epoch_) {
    return absl::FailedPreconditionError(
        absl::StrCat("KV moves of epoch ", epoch, " for a node of epoch ", epoch_));
  }
  if (tier_ == nullptr) return absl::FailedPreconditionError("this node has no disk tier");
  if (tier != tier_id_) {
    return absl::FailedPreconditionError(
        "KV moves for a disk tier that a reconfiguration has replaced");
  }
  return absl::OkStatus();
}

std::optional<KvDiskTierStats> KvDiskHost::stats() const {
  // Read under ptr_mu_ (the tier's counters never wait for its I/O): a reader that held its
  // own reference could keep a retired tier, and its directory lock, alive past Open, whose
  // new tier then found the directory taken and the node ran without one.
  std::lock_guard<std::mutex> lock(ptr_mu_);
  if (tier_ == nullptr) return retired_;
  KvDiskTierStats now = tier_->stats();
  if (retired_) AddCounters(*retired_, now);
  return now;
}

}  // namespace strata
