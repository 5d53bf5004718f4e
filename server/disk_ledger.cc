#include "server/disk_ledger.h"

#include <algorithm>
#include <unordered_set>

#include "common/base/logging.h"
#include "server/lookahead.h"

namespace strata {

DiskLedger::DiskLedger(int64_t num_extents, int block_tokens, absl::Duration ttl)
    : block_tokens_(block_tokens), ttl_(ttl), num_extents_(num_extents) {
  for (int64_t e = num_extents - 1; e >= 0; --e) free_.push_back(e);
}

void DiskLedger::MakeReady(uint64_t hash, Block& block, absl::Time now) {
  block.state = State::kReady;
  block.last_used = now;
  block.lru_it = lru_.insert(lru_.end(), hash);
}

void DiskLedger::Unlist(Block& block) {
  if (block.state == State::kReady) lru_.erase(block.lru_it);
}

std::optional<int64_t> DiskLedger::BeginSave(uint64_t hash, const int32_t* tokens, absl::Time now) {
  if (blocks_.count(hash)) return std::nullopt;  // on disk, or on its way
  int64_t extent;
  if (!free_.empty()) {
    extent = free_.back();
    free_.pop_back();
  } else if (!lru_.empty()) {
    const auto pick =
        FirstOutsideLookahead(lru_.begin(), lru_.end(), lookahead_, [](uint64_t h) { return h; });
    const uint64_t victim = *pick;
    lru_.erase(pick);
    extent = blocks_.at(victim).extent;
    blocks_.erase(victim);
    ++counters_.evicted;
  } else {
    return std::nullopt;  // every extent is being written or read
  }
  Block& block = blocks_[hash];
  block.extent = extent;
  block.state = State::kWriting;
  block.tokens.assign(tokens, tokens + block_tokens_);
  block.last_used = now;
  return extent;
}

void DiskLedger::SaveDone(uint64_t hash, bool ok, absl::Time now) {
  auto it = blocks_.find(hash);
  if (it == blocks_.end() || it->second.state != State::kWriting) return;
  if (!ok) {
    ++counters_.failed_writes;
    free_.push_back(it->second.extent);
    blocks_.erase(it);
    return;
  }
  MakeReady(hash, it->second, now);
}

int DiskLedger::Match(const std::vector<int32_t>& tokens, const std::vector<uint64_t>& hashes,
                      int from, int max) const {
  int n = 0;
  for (int b = from; b < static_cast<int>(hashes.size()) && n < max; ++b, ++n) {
    auto it = blocks_.find(hashes[b]);
    if (it == blocks_.end() || it->second.state == State::kWriting) break;
    const size_t start = static_cast<size_t>(b) * block_tokens_;
    if (start + block_tokens_ > tokens.size() ||
        !std::equal(it->second.tokens.begin(), it->second.tokens.end(), tokens.begin() + start)) {
      break;  // a hash collision: a miss
    }
  }
  return n;
}

std::optional<int64_t> DiskLedger::BeginLoad(uint64_t hash, absl::Time now) {
  auto it = blocks_.find(hash);
  if (it == blocks_.end() || it->second.state == State::kWriting) return std::nullopt;
  Unlist(it->second);
  it->second.state = State::kReading;
  ++it->second.readers;
  it->second.last_used = now;
  return it->second.extent;
}

bool LoadCondemnsBlock(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kResourceExhausted:
      return false;
    default:
      return true;
  }
}

std::optional<int64_t> DiskLedger::LoadDone(uint64_t hash, const absl::Status& status,
                                            absl::Time now) {
  auto it = blocks_.find(hash);
  if (it == blocks_.end() || it->second.state != State::kReading) return std::nullopt;
  if (LoadCondemnsBlock(status)) {
    ++counters_.failed_reads;
    const int64_t extent = it->second.extent;
    punching_.insert(extent);
    blocks_.erase(it);  // other readers' LoadDone find nothing: their loads failed too
    return extent;
  }
  if (--it->second.readers == 0) MakeReady(hash, it->second, now);
  return std::nullopt;
}

std::vector<int64_t> DiskLedger::Expire(absl::Time now) {
  std::vector<int64_t> out;
  while (!lru_.empty()) {
    auto it = blocks_.find(lru_.front());
    if (now - it->second.last_used <= ttl_) break;  // the rest were used later
    lru_.pop_front();
    out.push_back(it->second.extent);
    punching_.insert(it->second.extent);
    blocks_.erase(it);
    ++counters_.expired;
  }
  return out;
}

void DiskLedger::PunchDone(int64_t extent) {
  if (punching_.erase(extent) > 0) free_.push_back(extent);
}

DiskLedgerStats DiskLedger::Stats() const {
  DiskLedgerStats s = counters_;
  s.extents = num_extents_;
  s.free = static_cast<int64_t>(free_.size());
  s.punching = static_cast<int64_t>(punching_.size());
  for (const auto& [hash, b] : blocks_) {
    s.writing += b.state == State::kWriting;
    s.ready += b.state == State::kReady;
    s.reading += b.state == State::kReading;
  }
  return s;
}

bool DiskLedger::CheckInvariants() const {
  std::unordered_set<int64_t> seen;
  for (int64_t e : free_) {
    if (e < 0 || e >= num_extents_ || !seen.insert(e).second) return false;
  }
  for (int64_t e : punching_) {
    if (e < 0 || e >= num_extents_ || !seen.insert(e).second) return false;
  }
  size_t ready = 0;
  for (const auto& [hash, b] : blocks_) {
    if (b.extent < 0 || b.extent >= num_extents_ || !seen.insert(b.extent).second) return false;
    ready += b.state == State::kReady;
    if ((b.state == State::kReading) != (b.readers > 0)) return false;
  }
  return static_cast<int64_t>(seen.size()) == num_extents_ && ready == lru_.size();
}

}  // namespace strata
