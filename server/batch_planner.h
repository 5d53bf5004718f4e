// The batch planner: which rows of the running requests the next step of one compute node
// runs, and which requests give their KV slots up for them. A pure function of a view of
// the scheduler's state: no threads, no I/O, no ledger of its own. The scheduler copies the
// view (BuildPlan), calls PlanRunning, and applies the actions it returns in their order:
// preemptions, prompts shared with n > 1 samples, and chunks with the fresh slots each
// takes. Admission of waiting requests (placement, prefix and disk lookups) follows in the
// scheduler with the budgets left.
//
// What a preemption frees is asked of the ledger through `Freed`, a read-only query, only
// for the requests the planner considers giving up their slots: asking it of every running
// request would cost each step the KV of all of them.
#ifndef STRATA_SERVER_BATCH_PLANNER_H_
#define STRATA_SERVER_BATCH_PLANNER_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

namespace strata {

struct PlannerSequence {
  int64_t tokens = 0;    // known tokens: prompt, then outputs
  int64_t computed = 0;  // positions whose KV is written
  int64_t table = 0;     // slots it holds
  int64_t num_outputs = 0;
  int in_flight = 0;               // chunks of it in plans not yet back
  bool in_flight_samples = false;  // the newest of them samples the token after `tokens`
  bool finished = false;
  bool waiting_for_owner = false;  // n > 1: will share the owner's prompt KV
  // Its next row decodes its last known token, and no plan of it is in flight.
  bool DecodeReady() const {
    return !finished && !waiting_for_owner && in_flight == 0 && computed == tokens - 1;
  }
};

// Requests are given in rank order, the first first; those after a request rank below it.
struct PlannerRequest {
  int pool = 0;
  int64_t prompt_len = 0;
  int64_t max_tokens = 0;
  // It may run on the compute node being planned. Others still count: they can give their
  // slots up to a request that ranks above them.
  bool eligible = false;
  bool in_flight = false;  // a plan not yet back carries it: its slots stay until it lands
  // Its sequences are PlannerInput::seqs[first_seq, first_seq + num_seqs); `owner`, the
  // one that computes the shared prompt (-1: all finished), counts from first_seq.
  int owner = -1;
  int first_seq = 0;
  int num_seqs = 0;
};

struct PlannerPool {
  int64_t available = 0;  // slots an allocation can obtain now
  int64_t saving = 0;     // slots that saves to disk in flight free when back
};

// What preempting a request gives its pool: slots available at once, and slots freed
// once the saves to disk it starts are back.
struct PreemptionFrees {
  int64_t available = 0;
  int64_t saving = 0;
};

// What is left of a step's budgets: rows (max_num_batched_tokens), sequences
// (max_num_seqs) and prompt rows (max_prefill_tokens); and the one rule for the prompt rows
// a sequence takes from them, in the running requests' prefill and in admission alike.
struct StepBudgets {
  int64_t rows = 0, seqs = 0, prefill = 0;

  bool Exhausted() const { return rows <= 0 || prefill <= 0 || seqs <= 0; }
  // Prompt rows a sequence with `remaining` of them to compute may take now.
  int64_t PromptRows(int64_t remaining, int64_t chunk_limit) const {
    return std::min({remaining, chunk_limit, rows, prefill});
  }
  void TakePrompt(int64_t n) {
    rows -= n;
    prefill -= n;
    --seqs;
  }
  void TakeDecodeRow() {
    --rows;
    --seqs;
  }
};

struct PlannerInput {
  StepBudgets budgets;
  int64_t chunk_limit = 0;  // the most prompt rows of one sequence in a step
  bool chunked = false;     // a prompt may be split across steps
  bool async = false;       // asynchronous scheduling: rows ahead of a sampled token
  // Two batches, or rotational pipelining: the plan takes `plan_share` of the decode work
  // (rows and KV positions read, each as a share of the total), counting the plans in
  // flight, whose totals are given here.
  bool balance = false;
  double plan_share = 1.0;
  double in_flight_rows = 0;
  double in_flight_kv = 0;
  std::vector<PlannerPool> pools;
  std::vector<PlannerRequest> requests;  // every running request, in rank order
  std::vector<PlannerSequence> seqs;     // theirs, request by request
  std::function<PreemptionFrees(int request)> freed;
};

struct PlannerAction {
  enum class Kind {
    kPreempt,  // the request gives its slots up (one in flight: once it lands)
    kShare,    // the sample takes its owner's prompt slots (computed = prompt_len)
    kChunk,    // rows [begin, end) of the sequence, after `allocate` fresh slots
  };
  Kind kind = Kind::kChunk;
  int request = 0;
  int seq = 0;  // among the request's sequences
  int64_t begin = 0, end = 0;
  int64_t allocate = 0;
  int64_t frees = 0;   // kPreempt: the slots the planner counts on it making available now
  bool ahead = false;  // the row of the token a plan in flight samples
};

struct PlannerOutput {
  std::vector<PlannerAction> actions;  // to apply in this order
  std::vector<bool> planned;           // per request: it has a chunk in this plan
  std::vector<bool> preempted;         // per request
  StepBudgets budgets;                 // what is left
};

// Phase 1, decode rows, highest rank first: a decode-ready sequence decodes its last
// known token; with asynchronous scheduling, one whose plan in flight samples the next
// token may decode that token too, unless that draw is its last (max_tokens). A request
// short of slots takes them from the lowest-ranked running requests below it that are
// neither in flight nor in this plan; if none is left it yields its own. Where saves to
// disk in flight would free enough, nothing is preempted and the request waits.
// Phase 2, prefill chunks of the eligible requests: prompts, recomputed outputs, and n > 1
// samples that can now share their owner's prompt.
PlannerOutput PlanRunning(const PlannerInput& in);

// Phase 3, admission: waiting requests in rank order while the budgets PlanRunning left
// last. Placing a request (its pool, cached prefix, disk loads) changes the ledger and is
// the scheduler's (Scheduler::Place); this class holds the rules around it, without I/O:
// when admission stops, which requests fail outright, and the rows each admitted request
// and each chunk over disk loads in progress take.
struct AdmissionLimits {
  int64_t chunk_limit = 0;  // the most prompt rows of one sequence in a step
  bool chunked = false;     // a prompt may be split across steps
  // Fixed pipelining: the requests this replica may still admit (its share of all); else
  // no limit.
  int64_t admit_cap = std::numeric_limits<int64_t>::max();
  int64_t largest_pool = 0;  // slots of the largest live pool the compute node reaches
};

// Placement: the order in which a waiting request tries the pools its compute node reaches,
// and what a pool's prefetch reserve lets it do there. Finding its prefix in each pool (in
// DRAM, on disk, blocks a truncated conversation moves) is a read-only query of the ledger;
// holding and allocating the slots is the scheduler's (Scheduler::Place), pool by pool in
// this order until one admits it.
struct PlacementCandidate {
  int dram_blocks = 0;    // prefix blocks cached in its DRAM
  int disk_blocks = 0;    // blocks on its disk that continue that prefix
  int move_blocks = 0;    // truncated: blocks after the DRAM prefix that can move
  int64_t available = 0;  // slots an allocation can obtain now
  int64_t used = 0;       // slots live requests hold: the attention the pool serves each step
};

// A prefix shorter than this many tokens (one attention tile) is not worth putting a
// request on a busier pool: recomputing it costs one prompt chunk once, while every step
// of a batch waits for its busiest pool's attention.
inline constexpr int64_t kPrefixOutweighsLoadTokens = 64;

// Indices into `candidates` in the order to try them. A pool's prefix counts its blocks in
// DRAM, then continued on disk or by blocks that move. First come the pools whose prefix
// is within kPrefixOutweighsLoadTokens of the longest, the least used first, then by the
// longest prefix, the most of it in DRAM or moved, and the most free capacity; then the
// others in that order of prefix, DRAM and capacity. Ties keep the given order.
std::vector<int> RankPlacements(const std::vector<PlacementCandidate>& candidates,
                                int block_tokens);

enum class ReserveVerdict {
  kPlace,     // try to allocate in this pool
  kWait,      // stop admission for now: this pool holds its prefix, another would redo it
  kNextPool,  // try the next pool
};
// With scheduler-aware eviction a pool keeps `reserve` of its slots free for the look-ahead
// window's prefetches (negative: no reserve). A request that takes `fresh` of `available`
// slots goes ahead if that leaves the reserve, or if it would be the only request in the
// pool (`alone`: a reserve must never keep one waiting that nothing running will make room
// for). Otherwise it waits when the pool holds part of its prefix (`has_prefix`), else it
// tries the next pool.
ReserveVerdict PrefetchReserve(int64_t available, int64_t fresh, int64_t reserve, bool alone,
                               bool has_prefix);

class Admission {
 public:
  // `budgets`: what the running requests' rows left (PlannerOutput::budgets).
  Admission(const StepBudgets& budgets, const AdmissionLimits& limits);

  enum class Verdict {
    kStop,   // no more admissions in this plan (FIFO: nobody overtakes)
    kSkip,   // not this one (a stop is pending, or every sequence finished)
    kFail,   // it fits in no live pool
    kPlace,  // place it, then Admit or AdmitLoading; if it cannot be placed, stop
  };
  // The next waiting request: its owner's known tokens (`length`; `has_owner` false when
  // every sequence finished) and whether a stop is pending.
  Verdict Consider(int64_t length, bool has_owner, bool finishing) const;
  // Placed, with `computed` of its `length` positions already in its slots: the rows it
  // runs in this plan, [computed, computed + returned).
  int64_t Admit(int64_t computed, int64_t length);
  // Placed while its prefix loads from disk: rows over the loads joined the plan
  // (`over_loads`, taken with Take), or the request holds a sequence of the budget.
  void AdmitLoading(bool over_loads);
  // Rows a chunk over loads in progress may take now: `remaining` rows to compute, `room`
  // of them with slots. 0: none this plan.
  int64_t PreloadRows(int64_t remaining, int64_t room) const;
  // A chunk of `rows` prompt rows over loads joins the plan.
  void Take(int64_t rows);

 private:
  AdmissionLimits limits_;
  StepBudgets budgets_;
};

}  // namespace strata

#endif  // STRATA_SERVER_BATCH_PLANNER_H_
