// Layer-wise pre-loading's meeting point (docs/architecture.md, "The disk tier"): a node's
// disk tier reads a request's blocks layer by layer under a ticket (KvMove::ticket), while a
// step that already runs the request's new tokens attends layer by layer. Attention of
// layer l waits here until every block of the ticket has layer l in DRAM, or the load is
// over (failed loads too: the scheduler then discards what the step computed for the
// request, since its load report says so).
//
// A step that waits past the load's deadline (the scheduler's, carried by the moves), or
// for a ticket whose moves never arrived, stops waiting and abandons the ticket: its load
// is then reported failed whatever it does later (Finish returns false), so that nothing
// computed over half-loaded slots is ever kept.
//
// Tickets come in step descriptors, from compute nodes, before or after their moves. An
// entry lives while its load runs and `keep` after it is over or abandoned (a ticket whose
// moves never came and that no step looked at again: `keep` after its arrival wait); the
// gate holds at most `max_entries`, and a step that names an unknown ticket when it is full
// fails instead of waiting (so descriptors full of made-up tickets cannot grow it). The unknown
// tickets one owner's looks bring in (a memory node's peer: Poll's `owner`) count against
// `max_per_owner` until their moves arrive or they are forgotten: past it only that owner's
// steps fail. With the gate full, the room a look's unknown tickets need is taken from the
// owners holding the most unknown tickets (those a step gave up on first, each kind oldest
// first), never from one that holds no more than the looking owner then would, and never a
// ticket whose moves came; if not all of it can be taken, none is. So owners that fill the
// gate between them (each within its share) cannot keep another out. A ticket taken after
// a step gave up on it stays given up on (its moves are still refused). A look whose
// unknown tickets do not all fit is refused whole, before it brings any in.
//
// A caller that must not block (the memory server, which runs every peer's frames on one
// thread) looks with Poll instead, parks its work, and looks again when the listener is
// called or the deadline Poll gave passes.
//
// Thread-safety: every method may be called from any thread.
#ifndef STRATA_MEMORY_NODE_LOAD_GATE_H_
#define STRATA_MEMORY_NODE_LOAD_GATE_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace strata {

struct LoadGateStats {
  uint64_t tickets = 0;        // loads that arrived under a ticket
  uint64_t ready_layers = 0;   // layer waits that found the layer in DRAM (read-ahead hits)
  uint64_t waited_layers = 0;  // layer waits that had to wait for the disk
  uint64_t abandoned = 0;      // tickets a step gave up on
  uint64_t refused = 0;        // looks refused: unknown tickets past the share or the gate
  uint64_t evicted = 0;        // unknown tickets taken from the biggest owners for another's
  double wait_seconds = 0;     // attention's time waiting for the disk
};

class LoadGate {
 public:
  // `arrival_wait`: how long a step waits for a ticket whose moves have not arrived.
  // The default is the scheduler's default load deadline (--kv_disk_load_timeout_ms): by
  // then it has given up on those loads anyway.
  // `max_per_owner` 0: an eighth of `max_entries`.
  explicit LoadGate(absl::Duration arrival_wait = absl::Seconds(2),
                    absl::Duration keep = absl::Seconds(60), size_t max_entries = size_t{1} << 16,
                    size_t max_per_owner = 0);

  // The node has `ticket`'s moves; their caller gives up at `deadline`. False if a step
  // already abandoned the ticket: the moves must then be refused.
  bool Expect(uint64_t ticket, absl::Time deadline);
  // Every block of `ticket` has layers [0, layers) in DRAM.
  void Advance(uint64_t ticket, int layers);
  // The ticket's load is over. Whether its outcome stands: false if a step stopped waiting
  // for it, and the load must then be reported failed.
  bool Finish(uint64_t ticket, bool ok);

  // Waits until every ticket has `layer` in DRAM or is over (or abandoned, at its deadline).
  // ResourceExhausted, without waiting, if a ticket is unknown, the gate is full and no room
  // can be taken from other owners (see above): the step must then fail.
  absl::Status Wait(std::span<const uint64_t> tickets, int layer);

  // Wait's one look, for a caller that does something else while a load runs: true if
  // every ticket has `layer` in DRAM or is over (one past its deadline is abandoned here);
  // false if one is still awaited, with `wake` set to when the first of those would be
  // abandoned (look again then, or after the listener is called). ResourceExhausted as Wait.
  // The caller records the layer's wait once it goes on (Record).
  // `owner` (not 0): whose step looks, for `max_per_owner`.
  absl::StatusOr<bool> Poll(std::span<const uint64_t> tickets, int layer, absl::Time* wake,
                            uint64_t owner = 0);
  // A layer's wait, for the stats: zero if it found the layer in DRAM.
  void Record(absl::Duration waited);
  // Called after each change a waiter may be waiting for (Expect, Advance, Finish), on the
  // thread that made it, outside the gate's lock. Null: none.
  void SetListener(std::function<void()> listener);
  // Counts the changes the listener is told of: a caller that looked (Poll) and then
  // parked its work compares it before and after, in case a change fell in between.
  uint64_t generation() const { return generation_.load(); }

  LoadGateStats stats() const;
  size_t entries() const;  // tickets the gate keeps now

 private:
  struct Entry {
    int ready = 0;  // layers in DRAM
    bool arrived = false;
    bool finished = false;
    bool abandoned = false;
    absl::Time deadline = absl::InfiniteFuture();
    absl::Time touched;
    uint64_t owner = 0;  // whose look brought it in before its moves (0: none, or arrived)
  };
  // `e` no longer counts against its owner.
  void DisownLocked(Entry& e);
  // Entries over for a while go (a step needs a ticket's entry only while its load runs).
  void PruneLocked(absl::Time now);
  // The gate is full: takes the room for `unknown` new tickets of `owner` (holding `owned`)
  // from the owners with more unknown tickets, as the header says. False, taking nothing,
  // where they do not have it.
  bool TakeRoomLocked(uint64_t owner, size_t owned, size_t unknown);
  absl::StatusOr<bool> PollLocked(std::span<const uint64_t> tickets, int layer, absl::Time now,
                                  absl::Time* wake, uint64_t owner);
  void RecordLocked(absl::Duration waited);
  static bool NoLoads(std::span<const uint64_t> tickets);
  // Wakes the waiters and tells the listener (`lock` holds mu_, and is released).
  void Changed(std::unique_lock<std::mutex>& lock);

  const absl::Duration arrival_wait_;
  const absl::Duration keep_;
  const size_t max_entries_;
  const size_t max_per_owner_;
  std::unordered_map<uint64_t, size_t> owned_;  // unknown tickets each owner brought in
  // Abandoned tickets taken for another owner's (TakeRoomLocked), with the time their entry
  // was last touched: still given up on (Expect refuses their moves, Finish fails them)
  // until forgotten as their entries would have been. At most max_entries.
  std::unordered_map<uint64_t, absl::Time> tombstones_;
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::unordered_map<uint64_t, Entry> entries_;
  absl::Time last_prune_;
  LoadGateStats stats_;
  std::shared_ptr<std::function<void()>> listener_;  // guarded by mu_
  std::atomic<uint64_t> generation_{0};
};

}  // namespace strata

#endif  // STRATA_MEMORY_NODE_LOAD_GATE_H_
