// The scheduler's private state, shared by scheduler.cc (loop), scheduler_plan.cc
// (batching), scheduler_admission.cc (placement, preemption), scheduler_results.cc and
// scheduler_disk.cc. Scheduler-thread only.
#ifndef STRATA_SERVER_SCHEDULER_INTERNAL_H_
#define STRATA_SERVER_SCHEDULER_INTERNAL_H_

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "absl/time/time.h"
#include "server/moving_average.h"
#include "server/scheduler.h"

namespace strata {

// One of a request's n output sequences. Its id is the request id on the wire, and names
// one placement of its KV: a preempted sequence takes a new one (Preempt), so a release of
// the old table can never reach the new one, whichever node or plan carries it.
struct Scheduler::Sequence {
  SequenceId id;
  Request* request = nullptr;
  uint32_t index = 0;           // sample index among the request's n
  std::vector<int32_t> tokens;  // prompt, then outputs
  int64_t num_outputs = 0;
  int64_t computed = 0;          // positions whose KV is written
  std::vector<int32_t> table;    // KV slot of each position, in the request's pool
  int64_t table_sent = 0;        // positions whose slots the pool side already knows
  std::vector<uint64_t> hashes;  // chained hashes of the full blocks of `tokens`
  std::vector<std::pair<int64_t, uint64_t>> held;  // cached blocks held: (index, hash)
  int64_t registered_blocks = 0;
  bool setup_sent = false;  // on the request's executor
  // Chunks of this sequence in plans not yet back, and whether the newest of them samples
  // the token after the known ones (asynchronous scheduling may then plan the next row).
  int in_flight = 0;
  bool in_flight_samples = false;
  // Finished while a plan still writes its KV: the slots are freed when the plans are back.
  bool release_deferred = false;
  bool waiting_for_owner = false;  // n > 1: will share the owner's prompt KV
  bool finished = false;
  std::unique_ptr<OutputProcessor> output;
  absl::Time last_token_time = absl::InfinitePast();
  // Context truncation: KV that cached blocks give its table (sent with its first
  // assignment), and those blocks, held until the step that copies them is back.
  std::vector<KvShift> shifts;
  std::vector<uint64_t> shift_sources;
};

struct Scheduler::Request {
  using State = Scheduler::RequestState;
  uint64_t id = 0;
  GenerateRequest spec;
  UpdateCallback callback;
  std::vector<std::unique_ptr<Sequence>> seqs;
  State state = State::kWaiting;
  uint64_t arrival = 0;
  int executor = -1;
  std::optional<PoolIndex> pool;
  // Plans in flight holding any of its sequences (more than one only with asynchronous
  // scheduling). While any is out its KV stays allocated: preemption waits for them.
  int in_flight = 0;
  bool preempt_when_landed = false;
  // Set while in flight; acted on when the step returns.
  FinishReason pending_finish = FinishReason::kNone;
  int step_failures = 0;
  FinishReason last_finish = FinishReason::kStop;
  absl::Time submitted, admitted = absl::InfinitePast(), first_token = absl::InfinitePast();
  EventLoop::TimerId deadline_timer = 0;  // the request's timeout; 0: none, or it has fired
  int64_t cached_prompt_tokens = 0;
  bool prompt_counted = false;
  // Blocks of its prompt are being read from the disk tier into its table: it is not
  // planned meanwhile (and counts as in flight, so that its KV stays allocated).
  bool loading = false;
  bool first_load = false;  // the loads of its first admission (their tokens count as cached)
  // A load of its blocks failed: it recomputes from then on instead of reading the disk
  // again (the blocks stay there for other requests unless the read found them bad).
  bool disk_loads_failed = false;
  // Layer-wise pre-loading: the ticket of its loads in progress (0: none, or they run
  // whole), whether a chunk over them is out, and when it may go (the read-ahead rule).
  uint64_t load_ticket = 0;
  bool preload_planned = false;
  absl::Time preload_at;
  // Scheduler-aware placement, while it waits: the block hashes of its owner's tokens (for
  // `lookahead_tokens` of them).
  std::vector<uint64_t> lookahead_hashes;
  size_t lookahead_tokens = 0;
  // Whether the last look-ahead window held it (Scheduler::lookahead_pass_ then).
  uint64_t lookahead_pass = 0;
  // Context truncation (truncation.h): how the prompt (spec.prompt_tokens) was cut from the
  // one submitted (`untruncated`; empty if it was not).
  Truncation truncation;
  std::vector<int32_t> untruncated;
  std::vector<uint64_t> untruncated_hashes;  // its chained block hashes, once needed
  // The blocks its kept tail moves from were on disk, and their reads were ordered: it
  // waits until they are back (loaded or failed), once, and is not held back again.
  bool shift_prefetched = false;
  std::vector<uint64_t> shift_prefetches;  // those blocks' hashes, being read into
  PoolIndex shift_prefetch_pool;           // this pool

  int32_t prompt_len() const { return static_cast<int32_t>(spec.prompt_tokens.size()); }
  // The first unfinished sequence: it computes the shared prompt.
  Sequence* Owner() const {
    for (const auto& s : seqs) {
      if (!s->finished) return s.get();
    }
    return nullptr;
  }
};

// A move ordered on a pool's disk tier, with what its outcome is applied to.
struct Scheduler::DiskOp {
  KvMove move;              // key: the block's hash
  uint64_t request_id = 0;  // loads: the request, its sequence's sample index, and the
  uint32_t sample = 0;      // block's index in its tokens
  int block = 0;
  // A prefetch (scheduler-aware placement): a load into slots the scheduler allocated for
  // the block itself, cached in DRAM when it is back; `tokens` are the block's.
  bool prefetch = false;
  uint64_t kv_epoch = 0;  // of the pool's KV ledger that allocated the slots
  std::vector<int32_t> tokens;
  bool frees = true;  // saves: counted in the pool's saving_slots until back
};

struct Scheduler::Pool {
  std::string name;
  bool alive = false;
  int64_t num_slots = 0;
  std::unique_ptr<KvPool> kv;
  // The disk tier, if any (the ledger of its extents and the carrier of its moves), and the
  // moves ordered but not yet submitted. `generation` changes whenever the tier goes or
  // comes: outcomes of an older one are ignored.
  std::unique_ptr<DiskLedger> disk;
  std::shared_ptr<KvMover> mover;
  uint64_t generation = 0;
  std::vector<DiskOp> loads, moves;
  // DRAM slots of blocks held until their save is back: free soon, so admission and
  // the batch planner (MakeRoom) wait for them rather than preempt more.
  int64_t saving_slots = 0;
  // Whether a prefix on disk is worth loading (its load times, and prefill speed).
  LoadRule load_rule;
  // Scheduler-aware placement: blocks being prefetched, and which KV ledger `kv` is (it
  // changes when the pool dies and comes back; a late prefetch must not touch a new one).
  std::unordered_set<uint64_t> prefetching;
  uint64_t kv_epoch = 0;
};

// Every row of the plan decodes (one token per chunk).
inline bool DecodeOnly(const StepPlan& plan) {
  bool decode_only = !plan.chunks.empty();
  for (const SequenceChunk& c : plan.chunks) decode_only = decode_only && c.tokens.size() == 1;
  return decode_only;
}

struct Scheduler::Executor {
  std::unique_ptr<StepExecutor> impl;
  std::optional<PoolIndex> local_pool;  // co-located mode
  bool alive = true;                    // the control plane's view (heartbeats)
  bool reachable = true;  // false from a step that could not reach it until Reachable()
  struct InFlight {
    std::shared_ptr<const StepPlan> plan;  // the one the executor was given
    absl::Time started;
    // Asynchronous scheduling: sent while another plan was in flight, or meant to be.
    bool ahead = false;
  };
  std::deque<InFlight> in_flight;  // oldest first: results come back in submission order
  bool busy() const { return !in_flight.empty(); }
  // Asynchronous scheduling: when the oldest plan in flight started on the node (as far as
  // the scheduler can tell); the node's smoothed step time for decode-only plans and for
  // plans with prompt rows (kept apart, so that one prefill chunk does not stretch the
  // estimate for the decode steps after it); and the timer that will plan ahead, with its
  // due time (Scheduler::AheadPlanDue).
  absl::Time running_since;
  MovingAverage decode_step_seconds;
  MovingAverage mixed_step_seconds;
  EventLoop::TimerId ahead_timer = 0;
  absl::Time ahead_due;
  // Seconds by which plans ahead go out before their lead (Scheduler::AdjustAheadMargin),
  // and whether the next plan is one ahead whose timer the running step's result beat.
  double ahead_margin = 0;
  bool ahead_overdue = false;
  std::vector<TableRelease> pending_releases;
  // Releases sent again after failed plans, by sequence: how many times (OnStepResult).
  std::unordered_map<SequenceId, int> release_resends;
  // Releases whose plans failed kMaxReleaseResends times: no plan carries them until one of
  // this node's plans lands or it is reachable again (ClearReleaseBackoff), so that a node
  // that fails every plan is not sent them for ever and none is lost. Another node takes
  // them if this one is lost (HandOnReleases); a pool that dies takes its own with it.
  std::vector<TableRelease> parked_releases;
  // Failed plans in a row that carried releases; until release_retry_at no plan of
  // releases alone goes (SchedulerConfig::release_retry_backoff), and the timer that plans
  // again then.
  int release_failures = 0;
  absl::Time release_retry_at = absl::InfinitePast();
  EventLoop::TimerId release_timer = 0;
  // No failed plans behind it: a plan that worked, or a node that is back. The releases
  // parked after failed plans go on its next plan.
  void ClearReleaseBackoff() {
    release_failures = 0;
    release_retry_at = absl::InfinitePast();
    pending_releases.insert(pending_releases.end(), parked_releases.begin(), parked_releases.end());
    parked_releases.clear();
  }
};

}  // namespace strata

#endif  // STRATA_SERVER_SCHEDULER_INTERNAL_H_
