// The scheduler: continuous batching over compute nodes and KV pools.
//
// Every iteration, for each idle compute node ("executor"), it builds one step: decode rows
// for running sequences first (one new KV slot each, preempting the lowest-priority or
// newest request when a pool runs out), then chunks of prompts still prefilling, then newly
// admitted requests (Sarathi-style chunked prefill within the token budget). It sends the
// step plan, and when the result arrives appends the sampled tokens, streams text out,
// finishes sequences and releases their KV. New requests join after at most one step;
// finished ones leave at once.
//
// It is the only KV allocator (kv_manager.h). A request is placed on one pool: the one with
// the longest cached prefix first, then the one with the most available slots. In
// co-located mode each compute node's own cache is a pool and its requests run there; in
// disaggregated mode pools are memory nodes shared by all compute nodes, and each request
// sticks to the compute node that admitted it.
//
// Preemption is by recompute: a preempted request returns to the front of the queue with
// its tokens, and is prefilled again on re-admission, except what the prefix cache still
// holds; with a disk tier its full blocks are saved as it leaves, so it comes back mostly
// from disk (a swap; scheduler_disk.cc). Sampling is keyed by (seed, sample
// index, output position), so its output is exactly what it would have been. A pool or
// compute node that dies has its requests re-prefilled elsewhere, or failed with a clear
// error if nothing else is alive.
//
// Thread-safety: public methods are thread-safe. All state lives on the scheduler's event
// loop (common/base/event_loop.h); the methods post work to it. The loop plans once per
// batch of events, and sleeps until the next event or request deadline: there is no tick.
// Update callbacks run on the loop thread.
#ifndef STRATA_SERVER_SCHEDULER_H_
#define STRATA_SERVER_SCHEDULER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/event_loop.h"
#include "common/protocol/pipelining.h"
#include "common/tokenizer/tokenizer.h"
#include "server/batch_planner.h"
#include "server/disk_ledger.h"
#include "server/kv_manager.h"
#include "server/kv_mover.h"
#include "server/load_rule.h"
#include "server/output_processor.h"
#include "server/policy.h"
#include "server/request.h"
#include "server/step_clock.h"
#include "server/step_executor.h"
#include "server/truncation.h"

namespace strata {

struct SchedulerConfig {
  int64_t max_num_seqs = 256;  // sequences with rows in one step
  // Plans a compute node holds at once. With more than one, the next plan (of other
  // sequences: plans in flight never share one) waits at the node while the current one
  // runs, instead of being built after its result is back.
  int max_plans_in_flight = 1;
  // Asynchronous scheduling: while a step that samples a sequence's next token runs, the
  // next plan already carries that sequence's following row, naming its input as "the token
  // this node sampled last" (kLastSampledToken) instead of a literal id. The compute node
  // then goes from one step to the next without waiting for the scheduler. Needs
  // max_plans_in_flight >= 2. Output is bit-identical to synchronous scheduling; a stop is
  // seen one step late and the extra token is discarded.
  bool async_scheduling = false;
  // When the plan ahead is built: this fraction of the node's step time (at least 1 ms)
  // before the running step is expected to end, so that a request arriving meanwhile joins
  // the next step rather than the one after. 1: as soon as the running step starts. Where
  // the node reports that it still waited for plans ahead, they go out earlier by a margin
  // learnt from those waits (Scheduler::AdjustAheadMargin).
  double plan_ahead_lead = 0.25;
  // After a failed plan that carried releases, a plan of releases alone waits this long
  // before it goes again, doubled after each further failure (a plan with rows carries
  // them at once). A release goes again after each of up to three failed plans, then is
  // given up (OnStepResult).
  absl::Duration release_retry_backoff = absl::Milliseconds(200);
  // kTwo needs max_plans_in_flight >= 2 and synchronous scheduling; kFixed needs one plan
  // in flight per compute node (each replica owns one batch) and synchronous scheduling.
  Pipelining pipelining = Pipelining::kOff;
  int64_t max_num_batched_tokens = 2048;  // rows in one step
  int64_t max_prefill_tokens = 2048;      // prompt rows in one step
  int64_t prefill_chunk_tokens = 512;     // <= 0: whole prompts only (no chunking)
  int64_t max_model_len = 4096;           // prompt + output tokens
  int64_t max_waiting = 1024;             // queued requests before refusing (overload)
  int block_tokens = 16;                  // prefix-cache granularity
  bool enable_prefix_caching = true;
  // Which idle cached block DRAM gives up first when it runs short (kv_manager.h): lru,
  // fifo, or scheduler-aware: blocks that the look-ahead window (the next
  // lookahead_requests waiting requests, in the order they will run) needs go last, and
  // that window's history on disk is prefetched into DRAM before its requests run
  // (AttentionStore's scheduler-aware placement).
  KvEviction kv_eviction = KvEviction::kLru;
  int lookahead_requests = 32;
  // The window also ends where it would protect more blocks in a pool than that pool has
  // room for beside its running requests (scheduler_disk.cc, Prefetch); false: exactly the
  // next lookahead_requests.
  bool lookahead_fits_dram = true;
  // Scheduler-aware eviction: this fraction of each pool's slots is kept for the look-ahead
  // window (AttentionStore's read buffer). A request is admitted beside others running in
  // its pool only if the pool's free and idle cached slots stay at least this many after
  // it: the window's history is then prefetched into that room while its requests wait,
  // instead of read from disk when they are admitted. The running batch is the smaller for
  // it. 0: no reserve. On the session workload at saturation 0.25 served 95.6-97.4% of
  // hits from DRAM in three runs, 0.15 92.4-96.1% with a lower TTFT, none about 60%
  // (docs/benchmarks.md, "A DRAM reserve for the look-ahead window").
  double kv_prefetch_reserve = 0.25;
  int max_n = 16;
  PolicyKind policy = PolicyKind::kFifo;
  absl::Duration default_timeout = absl::ZeroDuration();  // zero: none
  uint64_t cache_salt = 0;  // separates prefix caches of different models
  std::vector<int32_t> eos_token_ids;
  int32_t vocab_size = 0;
  uint64_t epoch = 0;  // stamped on plans
  // The disk tier (pools given one with SetPoolDisk): blocks idle longer than this are
  // deleted (persisted KV is user data).
  absl::Duration disk_ttl = absl::Hours(1);
  // Load a prefix found on disk only when that is measured to be faster than recomputing
  // it (server/load_rule.h); false: always load.
  bool disk_load_when_faster = true;
  // Layer-wise pre-loading: a request whose prefix is read from disk computes its new
  // tokens while the read runs, each layer's attention waiting on the node for that layer
  // (memory_node/load_gate.h); its first chunk goes out once the read-ahead rule says the
  // load is far enough ahead (load_rule.h, PreloadLead; BuildPlan allows half a decode
  // step of waiting). false: its rows wait for the whole load.
  bool disk_layerwise = true;
  // Delayed write-back (HILOS): KV produced during decode gathers in DRAM, and each block
  // of a running request is saved to disk asynchronously as soon as it is full, rather
  // than when the request finishes or is preempted (false). Either way nothing is written
  // per token, and a block is written once.
  bool disk_save_on_fill = false;
  // The model's layers (for the read-ahead rule; 0: unknown, taken as one).
  int num_layers = 0;
  // A prompt that does not fit in max_model_len with its max_tokens (server/truncation.h):
  // kError refuses it (400); kTruncate keeps its first `context_keep_tokens` (rounded up to
  // whole blocks) and its most recent tokens and drops the middle.
  ContextOverflow context_overflow = ContextOverflow::kError;
  int64_t context_keep_tokens = 16;
  // RoPE's inverse frequencies (RopeInverseFrequencies): truncation moves the kept tail's
  // cached KV to its new positions with them. Empty: the kept tail is recomputed.
  std::vector<double> rope_inv_freq;
};

struct PoolStatus {
  PoolIndex index;
  std::string name;
  bool alive = false;
  PoolStats stats;
  bool has_disk = false;
  DiskLedgerStats disk;
};

struct SchedulerStats {
  int64_t num_running = 0;
  int64_t num_waiting = 0;
  // Scheduler-aware eviction: the waiting requests in the look-ahead window (Prefetch).
  int64_t lookahead_window_requests = 0;
  int64_t num_preemptions_total = 0;
  // Preemptions that freed fewer slots than the batch planner counted on, and chunks
  // dropped for want of them. It counts only what a preemption surely frees (a lower
  // bound), so this stays 0 unless that bound is wrong.
  int64_t planner_shortfalls_total = 0;
  int64_t prompt_tokens_total = 0;  // prompt tokens of admitted requests
  int64_t generation_tokens_total = 0;
  int64_t prefix_query_tokens_total = 0;
  int64_t prefix_hit_tokens_total = 0;
  int64_t prefill_rows_total = 0;  // prompt rows actually computed
  // The disk tier: prompt tokens whose KV was loaded from disk (also in
  // prefix_hit_tokens_total), blocks saved and loaded, and moves that failed (a save: not
  // cached; a load: its tokens are recomputed, and a block found bad is dropped).
  int64_t disk_hit_tokens_total = 0;
  int64_t disk_saved_blocks_total = 0;
  int64_t disk_loaded_blocks_total = 0;
  int64_t disk_failed_saves_total = 0;
  int64_t disk_failed_loads_total = 0;
  // Blocks found on disk but recomputed, which was measured to be faster (load_rule.h).
  int64_t disk_recomputed_blocks_total = 0;
  // Scheduler-aware placement: blocks read from disk into DRAM for a request still waiting
  // in the queue (prefetch), before it was admitted.
  int64_t disk_prefetched_blocks_total = 0;
  // Scheduler-aware placement's misses: blocks a request read from disk when it was
  // admitted, by why DRAM did not have them. Its request was outside the last look-ahead
  // window; or inside it, and the block's prefetch was still being read; or inside it, and
  // the block was not prefetched (no room for it), or was and was evicted again.
  int64_t admission_loads_outside_window_total = 0;
  int64_t admission_loads_prefetching_total = 0;
  int64_t admission_loads_not_prefetched_total = 0;
  // Layer-wise pre-loading: requests whose new tokens computed while their prefix loaded,
  // and those of them whose load then failed (preempted, and recomputed).
  int64_t disk_preloaded_requests_total = 0;
  int64_t disk_preload_failed_total = 0;
  // Blocks evicted from DRAM to make room (each was saved to disk first where a disk tier
  // is, so that the eviction itself is free).
  int64_t dram_evicted_blocks_total = 0;
  // Disk blocks given up for newer ones, and deleted by the TTL.
  int64_t disk_evicted_blocks_total = 0;
  int64_t disk_expired_blocks_total = 0;
  // Context truncation: requests truncated, the tokens dropped from their prompts, and the
  // kept tokens whose cached KV moved to new positions instead of being recomputed (also in
  // prefix_hit_tokens_total).
  int64_t context_truncated_total = 0;
  int64_t context_dropped_tokens_total = 0;
  int64_t context_moved_tokens_total = 0;
  int64_t steps_total = 0;
  // Asynchronous scheduling: rows planned before the previous token was known, and tokens
  // sampled for sequences that had already finished (never streamed nor billed).
  int64_t async_rows_total = 0;
  int64_t discarded_tokens_total = 0;
  int64_t rejected_total = 0;
  // Scheduler-thread time spent building plans and applying results (not the step itself).
  int64_t plans_total = 0;
  double plan_seconds_total = 0.0;
  double apply_seconds_total = 0.0;
  std::map<std::string, int64_t> finished_total;  // by finish reason
  std::vector<PoolStatus> pools;
  int64_t alive_executors = 0;
  // Step timing (step_clock.h): the smoothed step period, the stagger between compute
  // replicas under fixed pipelining (zero otherwise), t_m and t_a of decode steps, and the
  // memory nodes that would balance them (0: co-located, or nothing measured yet).
  double step_period_seconds = 0.0;
  double stagger_seconds = 0.0;
  // Asynchronous scheduling: how much earlier than plan_ahead_lead the plans ahead go out,
  // learnt from compute nodes that waited for them (the largest over compute nodes).
  double plan_ahead_margin_seconds = 0.0;
  double step_compute_seconds = 0.0;
  double step_attention_seconds = 0.0;
  int64_t advised_memory_nodes = 0;
  double kv_usage = 0.0;  // used / total slots over alive pools
  // Fragmentation. Slots are allocated per token, so no slot is lost to partly filled pages
  // (internal fragmentation is zero by construction, and free slots need not be
  // contiguous). For comparison: the slots a page allocator with pages of
  // kPagedCompareTokens tokens (vLLM's default block size) would waste on the same
  // running sequences.
  int64_t kv_paged_waste_slots = 0;
};

inline constexpr int64_t kPagedCompareTokens = 16;

// Observer of scheduler events for metrics (all called on the scheduler thread).
struct SchedulerObserver {
  std::function<void(const StepPlan&, const StepResult&, absl::Duration wall)> on_step;
  std::function<void(uint64_t request_id, absl::Duration queue, absl::Duration ttft)>
      on_first_token;
  std::function<void(absl::Duration inter_token)> on_inter_token;
  std::function<void(const GenerateRequest&, FinishReason, int64_t prompt_tokens,
                     int64_t generation_tokens, absl::Duration e2e, absl::Duration queue,
                     absl::Duration prefill, absl::Duration decode)>
      on_finish;
};

class Scheduler {
 public:
  // `tokenizer` may be null (no text output).
  Scheduler(SchedulerConfig config, const Tokenizer* tokenizer);
  ~Scheduler();
  static absl::Status ValidateConfig(const SchedulerConfig& config);

  void Start();
  void Stop();  // fails everything still queued or running with kAbort
  // Tests of the planner, without threads: instead of Start(), RunPending() runs the
  // scheduler's work (posted calls, step results, planning) on the calling thread until
  // nothing is left. Stop() then fails what is left at once, without waiting for plans.
  void StartManual();
  void RunPending();

  // Topology. Indices are stable for the scheduler's lifetime.
  int AddExecutor(std::unique_ptr<StepExecutor> executor, std::optional<PoolIndex> local_pool);
  void SetExecutorAlive(int executor, bool alive);
  // The executor lost the requests' set-ups (a replica joined a rotation group): the next
  // plan of each of its requests carries them again, with their history. `then` runs on
  // the scheduler thread once no later plan can go out without them.
  void ResendSetups(int executor, std::function<void()> then);
  // SetExecutorAlive with the answer of `alive`, asked on the scheduler thread when the
  // change is applied (so that changes posted from several threads cannot apply stale
  // answers out of order).
  void RefreshExecutorAlive(int executor, std::function<bool()> alive);
  PoolIndex AddPool(const std::string& name, int64_t num_slots);
  // The index of a pool that comes alive later (SetPoolAlive with its slots), dead and empty
  // until then: a memory node's, which must know its index before it is configured, while
  // other nodes configure at the same time.
  PoolIndex ReservePool(const std::string& name);
  // Gives a live pool a disk tier of `extents` blocks, empty, whose moves `mover` carries
  // (the memory node's tier was just opened empty). It goes when the pool dies.
  void SetPoolDisk(PoolIndex pool, int64_t extents, std::shared_ptr<KvMover> mover);
  // A dead pool's requests are re-prefilled on other pools. Reviving it starts it empty.
  void SetPoolAlive(PoolIndex pool, bool alive, int64_t num_slots = -1);

  // Validates and queues a request. Errors: InvalidArgument (bad request, too long for the
  // context or for any pool), ResourceExhausted (queue full), Unavailable (stopping).
  absl::StatusOr<uint64_t> Submit(GenerateRequest request, UpdateCallback on_update);
  void Cancel(uint64_t request_id);

  SchedulerStats Stats() const;
  bool HasCapacity() const;  // an alive executor and an alive pool
  void SetObserver(SchedulerObserver observer);
  // Called (on the scheduler thread) when a compute node reports a pool dead during a step,
  // so that the control plane can take the memory node out until it registers again.
  void SetPoolDeathHandler(std::function<void(PoolIndex)> handler);
  const SchedulerConfig& config() const { return config_; }

 private:
  enum class RequestState { kWaiting, kRunning, kDone };
  struct Request;
  struct Sequence;
  struct Pool;
  struct Executor;

  void Post(EventLoop::Closure fn);
  PoolIndex NewPool(const std::string& name, int64_t num_slots, bool alive);
  void SetPoolAliveNow(PoolIndex pool, bool alive, int64_t num_slots);
  // A step result's dead pools: each still alive is marked dead (its requests move).
  void MarkPoolsDead(const std::vector<PoolIndex>& dead);
  void SetExecutorAliveNow(int executor, bool alive);
  // After each batch of events: plan idle executors (or, while stopping, see whether the
  // steps in flight are back), then publish stats.
  void AfterBatch();
  void BeginShutdown();
  void FinishShutdown();
  void OnDeadline(uint64_t request_id);
  // While a compute node is unreachable, look again every so often (a timer, not a tick).
  void WatchUnreachable();
  void ScheduleIdleExecutors();
  // Fixed pipelining: whether a step may start now; if not, sets a timer for when it may.
  bool StaggerAllowsStart();
  // Asynchronous scheduling: whether the plan ahead of executor `index`'s running step may
  // be built now; if not, sets a timer for when it may.
  bool AheadPlanDue(int index);
  static constexpr double kAheadLeadMin = 1e-3;  // seconds
  // Learns from a plan ahead's slack at executor `index` (StepTiming::plan_slack_us).
  void AdjustAheadMargin(int index, int64_t slack_us);
  // The part of a plan ahead's slack that its margin gives back.
  static constexpr double kAheadMarginGiveBack = 1.0 / 32;
  int LiveReplicas() const;
  // Memory-node sizing advice from the step clock (logged when it changes).
  void UpdateAdvice();
  // Sends a plan (already recorded in the executor's in_flight) and applies its result.
  void SubmitPlan(int executor, std::shared_ptr<const StepPlan> plan);
  // Whether `pool` is alive and `executor` reaches it (co-located: its own pool only); no
  // pool (a request not placed) serves nobody.
  bool PoolServes(std::optional<PoolIndex> pool, int executor) const;
  // The batch planner's view for the next plan of `executor` (planner_view_, less the
  // budgets), and the running requests whose prefix loads a chunk may run over.
  void FillPlannerView(int executor, std::vector<Request*>* preloading);
  bool BuildPlan(int executor, StepPlan* plan);
  void OnStepResult(int executor, const StepPlan& plan, StepResult result, absl::Time started);
  // What the look-ahead window's reserve (SchedulerConfig::kv_prefetch_reserve) lets `req`
  // do in `pool`, taking `fresh` slots there (PrefetchReserve).
  ReserveVerdict CheckPrefetchReserve(const Request* req, PoolIndex pool, int64_t fresh,
                                      bool has_prefix) const;
  bool Place(Request* req, int executor);
  // Preempts now, or once the plans in flight holding the request are back (Land).
  void Preempt(Request* req);
  // What preempting `req` now frees in its pool, counting only slots that no other request
  // references (so a lower bound where two requests given up together share blocks).
  PreemptionFrees PreemptionFreesOf(const Request* req) const;
  // A plan of the request is back: frees the KV of its finished sequences that no plan holds
  // any more; once no plan holds the request, carries out a deferred preemption and erases
  // it if it has finished.
  void Land(Request* req);
  // The request no longer has a compute node: the next one gets its setup again.
  void ForgetExecutor(Request* req);
  // Scheduler-aware placement: why DRAM lacked the `count` blocks from `from` that `req`
  // is about to load from `pool` at admission (SchedulerStats::admission_loads_*).
  void CountAdmissionLoads(const Request& req, PoolIndex pool, int from, int count);
  void ReleaseKv(Sequence* seq);
  // Queues a release of a table no sequence will use again on `executor`'s next plan. For
  // a node out of service another live node that reaches the pool carries it now (any
  // node's plan may: the id is retired, Preempt); one alive but unreachable also keeps a
  // copy for when it is back (a dead one comes back as a new process). `executor` -1: no
  // node has the sequence set up, and any live node that reaches the pool carries it. Where
  // the pool is gone it goes only to `executor`.
  void QueueRelease(int executor, const TableRelease& release);
  // `executor` went out of service: another live node carries the releases queued on it.
  void HandOnReleases(int executor);
  // Its pool died with its KV: forgets the request's slot tables and cached blocks without
  // touching the pool's (discarded) ledger.
  void ForgetLostKv(Request* req);
  void RegisterBlocks(Sequence* seq);
  // Context truncation (scheduler_truncation.cc). A truncated request on `pool` with blocks
  // [0, from) of its prompt cached: the following blocks (before `max_blocks`) that earlier
  // turns of the conversation cached at later positions, and the shift that moves them to
  // theirs. Changes nothing but a cache of the request's own hashes.
  // With `with_disk`, the run may also take blocks on the pool's disk tier only; those are
  // marked in `on_disk`, to be read back before they can move.
  struct ShiftSource {
    std::vector<uint64_t> blocks;  // the source blocks' hashes, one per moved block
    std::vector<bool> on_disk;     // per block
    int32_t shift = 0;
    bool any_on_disk() const;
  };
  ShiftSource FindShiftSource(Request* req, PoolIndex pool, int from, int max_blocks,
                              bool with_disk = false);
  // Reads a source's blocks that are on disk only back into DRAM, cached and idle, as
  // scheduler-aware prefetches are (PrefetchDone), so that the request's next placement
  // finds them there. false if there is no room for them.
  // `hashes`: the request's own block hashes, whose blocks [0, from) it will take from DRAM.
  bool PrefetchShiftSource(Request* req, PoolIndex pool, int from, const ShiftSource& source,
                           const std::vector<uint64_t>& hashes);
  // The owner's first assignment will move `source` (whose blocks the caller already holds)
  // to blocks [from, from + blocks) of its table (KvShift); the holds pass to the owner.
  void TakeShiftSource(Request* req, PoolIndex pool, int from, const ShiftSource& source);
  // Remembers that a conversation was truncated (its untruncated prefix through the first
  // kept block after the drop), so that its later turns can move KV from it.
  void RememberTruncation(Request* req);
  // The chained block hashes of the request's untruncated prompt, computed once.
  const std::vector<uint64_t>& UntruncatedHashes(Request* req);
  // The blocks a sequence's shifts copy from are no longer needed (the step is back, or the
  // sequence lost its KV).
  void DropShiftSources(Sequence* seq);
  // The disk tier (scheduler_disk.cc).
  struct DiskOp;
  // Orders a save of a cached block of `pool` that just went idle, unless it is on disk
  // already; the block stays in DRAM (held) until the save is done.
  // `frees`: the block goes idle once saved (its request is done with it), so its slots
  // count as soon-free room meanwhile; false for a running request's block (save on fill).
  void SaveBlock(PoolIndex pool, uint64_t hash, bool frees = true);
  // How many blocks from `from` on (at most `max`) `pool`'s disk holds for `req`'s owner's
  // `tokens`: none without the prefix cache, or for a request whose loads failed before.
  int DiskMatch(PoolIndex pool, const Request& req, const std::vector<int32_t>& tokens,
                const std::vector<uint64_t>& hashes, int from, int max) const;
  // Orders the loads of blocks [from, from + count) of the request's owner into its table;
  // the request is not planned until they are back (OnDiskMoves).
  void StartLoads(Request* req, int from, int count);
  // Submits the moves ordered since the last batch of events.
  void FlushDiskMoves();
  // `took`: from submitting the batch to its outcome.
  void OnDiskMoves(PoolIndex pool, uint64_t generation, std::vector<DiskOp> ops,
                   std::vector<absl::Status> status, absl::Duration took);
  // `current`: the pool's tier is the one that ordered them.
  void LoadsDone(Request* req, PoolIndex pool, bool current,
                 std::vector<std::pair<DiskOp, absl::Status>> loads);
  void Drop(PoolIndex pool, int64_t extent);
  // Deletes blocks idle longer than the TTL; runs on a timer while a pool has a disk.
  void ExpireDisk();
  bool expire_timer_set_ = false;
  // Layer-wise pre-loading: tickets name each request's loads on the node (KvMove::ticket).
  // A step result that carries a chunk over loads still out waits (parked) for their
  // outcome: a failed load voids what the step computed for that request.
  uint64_t next_load_ticket_ = 0;  // 0: not drawn yet (StartLoads draws a random start)
  struct ParkedResult {
    int executor = 0;
    std::shared_ptr<const StepPlan> plan;
    StepResult result;
    absl::Time started;
    absl::Time arrived;  // the step's time is arrived - started, not the time parked
  };
  std::deque<ParkedResult> parked_;
  // Whether `plan` has a chunk over loads whose outcome is not back yet.
  bool AwaitsLoads(const StepPlan& plan) const;
  void ReplayParked();
  // When the request's first chunk over its loads may go out (the read-ahead rule).
  absl::Time PreloadAt(const Request& req, int blocks) const;
  bool preload_timer_set_ = false;
  // Scheduler-aware placement: names the look-ahead window's blocks to each pool (they are
  // evicted last) and starts reading the window's history on disk into DRAM.
  void Prefetch();
  void PrefetchDone(PoolIndex pool, bool current, DiskOp& op, const absl::Status& status);
  // Orders the read of block `hash` (on the pool's disk) into fresh slots, cached in DRAM
  // when it is back (PrefetchDone); `tokens` are the block's. false if it is not ready.
  bool OrderPrefetch(PoolIndex pool, uint64_t hash, const int32_t* tokens, int block,
                     absl::Time now);
  // Slots per pool that running sequences' decode grows into: a block per sequence. A
  // prefetch leaves them free, so that it never makes a running request yield.
  std::vector<int64_t> DecodeHeadroom() const;
  // Eviction counts of pools' ledgers that died with them (the totals never go back).
  int64_t retired_dram_evicted_ = 0, retired_disk_evicted_ = 0, retired_disk_expired_ = 0;
  void ShareParentPrompt(Sequence* child, Sequence* owner);
  void FinishSequence(Sequence* seq, FinishReason reason, RequestUpdate* update,
                      const std::string& text);
  void FailRequest(Request* req, FinishReason reason, const absl::Status& status);
  // A cancellation or timeout that arrived while the request was in flight (a step, or loads
  // from disk): fails it now. Returns whether it did (the request may be gone then).
  bool FinishPending(Request* req);
  void MaybeRemoveRequest(Request* req);
  // Erases a finished request now, or at the end of the result being applied.
  void RemoveFinished(uint64_t id);
  // Erases the requests MaybeRemoveRequest finished while removals were deferred.
  void RemoveDeferred();
  void PublishStats();
  PolicyKey KeyOf(const Request* req) const;
  // Policy order over requests (keys never change while a request lives).
  struct RankOrder {
    const Scheduler* scheduler;
    bool operator()(const Request* a, const Request* b) const;
  };
  // The one place a request changes state: keeps running_ and waiting_ in step.
  void SetState(Request* req, RequestState state);
  void InsertWaiting(Request* req);
  void EraseWaiting(Request* req);
  void EraseRequest(uint64_t id);

  SchedulerConfig config_;
  const Tokenizer* tokenizer_;
  std::unique_ptr<SchedulingPolicy> policy_;

  // Shared with callers' threads.
  mutable absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool manual_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int num_executors_ ABSL_GUARDED_BY(mu_) = 0;
  size_t num_pools_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t largest_pool_slots_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_request_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::atomic<int64_t> queued_{0};  // submitted, not yet admitted for the first time
  EventLoop loop_{"scheduler"};

  // Loop-thread state.
  bool draining_ = false;  // stopping: waiting for the steps in flight
  bool shut_down_ = false;
  bool watching_unreachable_ = false;
  // Fixed pipelining: the last step start on any compute node, and whether a timer is set
  // for the next allowed one.
  StepClock clock_;
  PrefillRate prefill_rate_;  // for the disk tier's load-or-recompute rule
  // Context truncation: chained block hashes of untruncated conversation prefixes that were
  // truncated right before their last block (RememberTruncation), oldest first.
  std::unordered_set<uint64_t> truncated_prefixes_;
  std::deque<uint64_t> truncated_order_;
  absl::Time last_start_ = absl::InfinitePast();
  bool stagger_timer_set_ = false;
  int advised_memory_nodes_ = 0;
  int64_t lookahead_window_requests_ = 0;  // Prefetch's last window
  uint64_t lookahead_pass_ = 0;            // Prefetch's passes (Request::lookahead_pass)
  std::unordered_map<uint64_t, std::unique_ptr<Request>> requests_;
  // While a step's result is applied, finished requests stay allocated (state kDone) until
  // it is done, because it holds pointers to them and their sequences.
  bool defer_removals_ = false;
  std::vector<uint64_t> deferred_removals_;
  // Sequences by wire id, for applying results without walking every request.
  std::unordered_map<SequenceId, Sequence*> sequences_;
  // Requests waiting for admission, in policy order (sorted insertion).
  std::vector<Request*> waiting_;
  // Running requests (holding KV), in policy order. Planning walks these, never all
  // requests, so its cost grows with the batch and not with the queue.
  std::set<Request*, RankOrder> running_{RankOrder{this}};
  // BuildPlan's view for the batch planner (buffers kept from plan to plan), and the
  // running requests it lists, in the same order.
  PlannerInput planner_view_;
  std::vector<Request*> planner_requests_;
  std::vector<std::unique_ptr<Pool>> pools_;
  std::vector<std::unique_ptr<Executor>> executors_;
  uint64_t next_sequence_id_ = 1;
  uint64_t next_step_id_ = 1;
  uint64_t arrival_counter_ = 0;
  SchedulerObserver observer_;
  std::function<void(PoolIndex)> pool_death_handler_;

  // Published snapshot.
  mutable absl::Mutex stats_mu_;
  SchedulerStats stats_ ABSL_GUARDED_BY(stats_mu_);
  SchedulerStats counters_ ABSL_GUARDED_BY(stats_mu_);  // running totals
};

}  // namespace strata

#endif  // STRATA_SERVER_SCHEDULER_H_
