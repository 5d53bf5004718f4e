#include "memory_node/load_gate.h"

#include <algorithm>
#include <chrono>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace strata {
LoadGate::LoadGate(absl::Duration arrival_wait, absl::Duration keep, size_t max_entries,
                   size_t max_per_owner)
    : arrival_wait_(arrival_wait),
      keep_(keep),
      max_entries_(max_entries),
      max_per_owner_(max_per_owner != 0 ? max_per_owner : std::max<size_t>(1, max_entries / 8)),
      last_prune_(absl::Now()) {}

bool LoadGate::Expect(uint64_t ticket, absl::Time deadline) {
  if (ticket == 0) return true;
  const absl::Time now = absl::Now();
  std::unique_lock<std::mutex> lock(mu_);
  PruneLocked(now);
  if (tombstones_.contains(ticket)) return false;
  Entry& e = entries_[ticket];
  e.touched = now;
  if (e.abandoned) return false;
  if (!e.arrived) ++stats_.tickets;
  e.arrived = true;
  DisownLocked(e);
  e.deadline = deadline;
  Changed(lock);
  return true;
}

void LoadGate::Advance(uint64_t ticket, int layers) {
  if (ticket == 0) return;
  std::unique_lock<std::mutex> lock(mu_);
  auto it = entries_.find(ticket);
  if (it == entries_.end() || it->second.abandoned || it->second.finished) return;
  it->second.ready = std::max(it->second.ready, layers);
  Changed(lock);
}

bool LoadGate::Finish(uint64_t ticket, bool ok) {
  if (ticket == 0) return ok;
  const absl::Time now = absl::Now();
  std::unique_lock<std::mutex> lock(mu_);
  if (tombstones_.contains(ticket)) return false;
  Entry& e = entries_[ticket];
  e.touched = now;
  e.finished = true;
  const bool stands = ok && !e.abandoned;
  Changed(lock);
  return stands;
}

absl::StatusOr<bool> LoadGate::PollLocked(std::span<const uint64_t> tickets, int layer,
                                          absl::Time now, absl::Time* wake, uint64_t owner) {
  bool ready = true;
  *wake = absl::InfiniteFuture();
  // The look's unknown tickets fit in the gate, and in the owner's share, all of them or it
  // is refused before any is brought in (a step a refusal fails never looks again).
  size_t unknown = 0;
  for (uint64_t ticket : tickets) {
    unknown += ticket != 0 && !entries_.contains(ticket) && !tombstones_.contains(ticket);
  }
  const auto found = owner != 0 ? owned_.find(owner) : owned_.end();
  const size_t owned = found != owned_.end() ? found->second : 0;
  if (unknown > 0 && owner != 0 && owned + unknown > max_per_owner_) {
    ++stats_.refused;
    return absl::ResourceExhaustedError(absl::StrCat(
        "layer-wise pre-loading: ", unknown, " ticket(s) are unknown and this peer's steps await ",
        owned, " tickets whose moves never came, of ", max_per_owner_, " at most"));
  }
  if (unknown > 0 && entries_.size() + unknown > max_entries_ &&
      !TakeRoomLocked(owner, owned, unknown)) {
    ++stats_.refused;
    return absl::ResourceExhaustedError(absl::StrCat("layer-wise pre-loading: ", unknown,
                                                     " ticket(s) are unknown and ", entries_.size(),
                                                     " tickets are awaited already"));
  }
  for (uint64_t ticket : tickets) {
    if (ticket == 0 || tombstones_.contains(ticket)) continue;  // given up on
    const bool known = entries_.contains(ticket);
    Entry& e = entries_[ticket];  // a step may come before its ticket's moves
    if (!known && owner != 0) {
      e.owner = owner;
      ++owned_[owner];
    }
    if (e.touched == absl::Time()) e.touched = now;
    if (e.finished || e.abandoned || e.ready > layer) continue;
    const absl::Time until = e.arrived ? e.deadline : e.touched + arrival_wait_;
    if (now >= until) {
      e.abandoned = true;
      ++stats_.abandoned;
      continue;
    }
    ready = false;
    *wake = std::min(*wake, until);
  }
  return ready;
}

bool LoadGate::TakeRoomLocked(uint64_t owner, size_t owned, size_t unknown) {
  const size_t after = owned + unknown;  // what the looking owner would hold
  size_t need = entries_.size() + unknown - max_entries_;
  size_t above = 0;
  for (const auto& [o, n] : owned_) above += o != owner && n > after ? n - after : 0;
  if (above < need) return false;
  // Each other owner's unknown tickets in the order they go, taken from the back: those a
  // step gave up on first (they cost only a tombstone, where one that a step still awaits
  // would make its step wait again or fail), each kind oldest first.
  struct Candidate {
    bool awaited;
    absl::Time touched;
    uint64_t ticket;
    bool operator<(const Candidate& o) const {
      return std::tie(awaited, touched, ticket) < std::tie(o.awaited, o.touched, o.ticket);
    }
  };
  std::unordered_map<uint64_t, std::vector<Candidate>> by_owner;
  for (const auto& [ticket, e] : entries_) {
    if (e.owner != 0 && e.owner != owner && !e.arrived) {
      by_owner[e.owner].push_back({!e.abandoned, e.touched, ticket});
    }
  }
  for (auto& [o, list] : by_owner) std::sort(list.rbegin(), list.rend());
  // Chosen first, taken only if they make all the room: otherwise nothing is taken.
  std::unordered_map<uint64_t, size_t> left(owned_.begin(), owned_.end());
  size_t tombstone_room = max_entries_ - std::min(max_entries_, tombstones_.size());
  std::vector<uint64_t> chosen;
  std::unordered_set<uint64_t> spent;  // owners with nothing left that can be taken
  while (chosen.size() < need) {
    // One at a time from whoever holds the most now (ties: the lower owner, for the same
    // outcome on every node).
    uint64_t most = 0;
    size_t most_n = 0;
    for (const auto& [o, n] : left) {
      if (o == owner || n <= after || spent.contains(o)) continue;
      if (n > most_n || (n == most_n && o < most)) {
        most = o;
        most_n = n;
      }
    }
    if (most_n == 0) return false;
    auto& list = by_owner[most];
    // A ticket a step gave up on must keep refusing its moves (Expect): it goes only where
    // its tombstone has room.
    while (!list.empty() && !list.back().awaited && tombstone_room == 0) list.pop_back();
    if (list.empty()) {
      spent.insert(most);
      continue;
    }
    if (!list.back().awaited) --tombstone_room;
    chosen.push_back(list.back().ticket);
    list.pop_back();
    --left[most];
  }
  for (uint64_t ticket : chosen) {
    auto it = entries_.find(ticket);
    if (it->second.abandoned) tombstones_[ticket] = it->second.touched;
    DisownLocked(it->second);
    entries_.erase(it);
    ++stats_.evicted;
  }
  return true;
}

absl::Status LoadGate::Wait(std::span<const uint64_t> tickets, int layer) {
  if (NoLoads(tickets)) return absl::OkStatus();
  const absl::Time start = absl::Now();
  std::unique_lock<std::mutex> lock(mu_);
  PruneLocked(start);
  bool waited = false;
  for (;;) {
    const absl::Time now = absl::Now();
    absl::Time wake;
    absl::StatusOr<bool> ready = PollLocked(tickets, layer, now, &wake, /*owner=*/0);
    if (!ready.ok()) return ready.status();
    if (*ready) break;
    waited = true;
    const absl::Duration left = std::min(wake - now, absl::Seconds(1));
    changed_.wait_for(lock, absl::ToChronoNanoseconds(left));
  }
  RecordLocked(waited ? absl::Now() - start : absl::ZeroDuration());
  return absl::OkStatus();
}

absl::StatusOr<bool> LoadGate::Poll(std::span<const uint64_t> tickets, int layer, absl::Time* wake,
                                    uint64_t owner) {
  *wake = absl::InfiniteFuture();
  if (NoLoads(tickets)) return true;
  const absl::Time now = absl::Now();
  std::lock_guard<std::mutex> lock(mu_);
  PruneLocked(now);
  return PollLocked(tickets, layer, now, wake, owner);
}

void LoadGate::Record(absl::Duration waited) {
  std::lock_guard<std::mutex> lock(mu_);
  RecordLocked(waited);
}

void LoadGate::RecordLocked(absl::Duration waited) {
  if (waited > absl::ZeroDuration()) {
    ++stats_.waited_layers;
    stats_.wait_seconds += absl::ToDoubleSeconds(waited);
  } else {
    ++stats_.ready_layers;
  }
}

bool LoadGate::NoLoads(std::span<const uint64_t> tickets) {
  return std::all_of(tickets.begin(), tickets.end(), [](uint64_t t) { return t == 0; });
}

void LoadGate::SetListener(std::function<void()> listener) {
  std::lock_guard<std::mutex> lock(mu_);
  listener_ = listener ? std::make_shared<std::function<void()>>(std::move(listener)) : nullptr;
}

void LoadGate::Changed(std::unique_lock<std::mutex>& lock) {
  ++generation_;
  changed_.notify_all();
  std::shared_ptr<std::function<void()>> listener = listener_;
  lock.unlock();
  if (listener) (*listener)();
}

void LoadGate::PruneLocked(absl::Time now) {
  if (now - last_prune_ < std::min(keep_, absl::Seconds(1))) return;
  last_prune_ = now;
  for (auto it = entries_.begin(); it != entries_.end();) {
    Entry& e = it->second;
    // Over, or a ticket whose moves never came that no step looked at again by its arrival
    // wait: a look that brought it in and then failed on a later ticket of the step (the
    // gate or its owner's share full) failed the step, which never looks again. Nothing
    // waits for such a ticket, and moves that came for it now would be past their deadline.
    const bool over = e.finished || e.abandoned;
    if ((over || !e.arrived) && now - e.touched > (over ? keep_ : arrival_wait_ + keep_)) {
      DisownLocked(e);
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
  std::erase_if(tombstones_, [&](const auto& t) { return now - t.second > keep_; });
}

void LoadGate::DisownLocked(Entry& e) {
  if (e.owner == 0) return;
  auto it = owned_.find(e.owner);
  if (it != owned_.end() && --it->second == 0) owned_.erase(it);
  e.owner = 0;
}

size_t LoadGate::entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

LoadGateStats LoadGate::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace strata
