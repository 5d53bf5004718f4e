#include "server/scheduler.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/logging.h"
#include "server/scheduler_internal.h"

namespace strata {
namespace {

// How long shutdown waits for the steps in flight before failing their requests.
constexpr absl::Duration kDrainTimeout = absl::Seconds(10);
// How often an unreachable compute node is looked at again.
constexpr absl::Duration kReachableRecheck = absl::Milliseconds(100);

}  // namespace

Scheduler::Scheduler(SchedulerConfig config, const Tokenizer* tokenizer)
    : config_(std::move(config)), tokenizer_(tokenizer) {
  policy_ = MakePolicy(config_.policy);
}

Scheduler::~Scheduler() { Stop(); }

absl::Status Scheduler::ValidateConfig(const SchedulerConfig& c) {
  if (c.max_num_seqs <= 0 || c.max_num_batched_tokens <= 0 || c.max_prefill_tokens <= 0) {
    return absl::InvalidArgumentError("batch limits must be positive");
  }
  if (c.max_plans_in_flight < 1) {
    return absl::InvalidArgumentError("max_plans_in_flight must be at least 1");
  }
  if (!(c.kv_prefetch_reserve >= 0 && c.kv_prefetch_reserve < 1)) {
    return absl::InvalidArgumentError("kv_prefetch_reserve must be in [0, 1)");
  }
  if (!(c.plan_ahead_lead >= 0 && c.plan_ahead_lead <= 1)) {
    return absl::InvalidArgumentError("plan_ahead_lead must be between 0 and 1");
  }
  if (c.async_scheduling && c.max_plans_in_flight < 2) {
    return absl::InvalidArgumentError(
        "asynchronous scheduling needs max_plans_in_flight of at least 2 (the next plan goes "
        "out while the current one runs)");
  }
  if (c.pipelining == Pipelining::kTwo && c.max_plans_in_flight < 2) {
    return absl::InvalidArgumentError(
        "two batches in flight need max_plans_in_flight of at least 2");
  }
  if (c.pipelining == Pipelining::kTwo && c.async_scheduling) {
    // An asynchronous plan names the token a plan in flight samples; on the other lane it
    // would run before that token exists.
    return absl::InvalidArgumentError(
        "two batches in flight and asynchronous scheduling do not combine (yet): choose one");
  }
  if (c.pipelining == Pipelining::kFixed && (c.max_plans_in_flight != 1 || c.async_scheduling)) {
    return absl::InvalidArgumentError(
        "fixed staggered pipelining gives each compute node one batch: it needs "
        "max_plans_in_flight of 1 and synchronous scheduling");
  }
  if (c.pipelining == Pipelining::kRotational &&
      (c.max_plans_in_flight < 3 || c.async_scheduling)) {
    return absl::InvalidArgumentError(
        "rotational pipelining runs n >= 3 batches (max_plans_in_flight) on n - 1 replicas, "
        "with synchronous scheduling (a replica may not have sampled a batch's last token)");
  }
  if (c.max_model_len <= 0 || c.block_tokens <= 0 || c.max_n <= 0 || c.max_waiting <= 0) {
    return absl::InvalidArgumentError(
        "max_model_len, block_tokens, max_n and max_waiting must be positive");
  }
  if (c.prefill_chunk_tokens <= 0 && c.max_num_batched_tokens < c.max_model_len) {
    return absl::InvalidArgumentError(
        "without chunked prefill, max_num_batched_tokens must cover max_model_len");
  }
  if (c.context_overflow == ContextOverflow::kTruncate &&
      (c.context_keep_tokens < 0 || c.context_keep_tokens >= c.max_model_len)) {
    return absl::InvalidArgumentError("context_keep_tokens must be in [0, max_model_len)");
  }
  return absl::OkStatus();
}

void Scheduler::Start() {
  {
    absl::MutexLock lock(&mu_);
    if (started_ || stopping_) return;
    started_ = true;
  }
  loop_.SetAfterBatch([this] { AfterBatch(); });
  loop_.Start();
}

void Scheduler::StartManual() {
  {
    absl::MutexLock lock(&mu_);
    if (started_ || stopping_) return;
    started_ = true;
    manual_ = true;
  }
  loop_.SetAfterBatch([this] { AfterBatch(); });
}

void Scheduler::RunPending() { loop_.RunUntilIdle(); }

void Scheduler::Stop() {
  bool manual;
  {
    absl::MutexLock lock(&mu_);
    const bool first = !stopping_;
    stopping_ = true;
    manual = manual_;
    if (!started_ || !first) {
      if (!started_) loop_.Quit();
      return;
    }
  }
  if (manual) {
    Post([this] { FinishShutdown(); });
    loop_.RunUntilIdle();
    return;
  }
  Post([this] { BeginShutdown(); });
  loop_.Join();
}

void Scheduler::Post(EventLoop::Closure fn) { loop_.Post(std::move(fn)); }

void Scheduler::AfterBatch() {
  if (shut_down_) return;
  if (draining_) {
    for (const auto& e : executors_) {
      if (e->busy()) return;  // its result is an event; we look again then
    }
    FinishShutdown();
    return;
  }
  ScheduleIdleExecutors();
  Prefetch();
  FlushDiskMoves();
  WatchUnreachable();
  PublishStats();
}

void Scheduler::WatchUnreachable() {
  if (watching_unreachable_) return;
  bool any = false;
  for (const auto& e : executors_) any = any || (e->alive && !e->reachable && !e->busy());
  if (!any) return;
  watching_unreachable_ = true;
  // The timer's batch runs AfterBatch, which looks at every unreachable node again.
  loop_.RunAfter(kReachableRecheck, [this] { watching_unreachable_ = false; });
}

// Shutdown: wait for steps in flight (their sinks post here), then fail the rest.
void Scheduler::BeginShutdown() {
  draining_ = true;
  loop_.RunAfter(kDrainTimeout, [this] { FinishShutdown(); });
}

void Scheduler::FinishShutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  std::vector<Request*> all;
  for (auto& [id, req] : requests_) all.push_back(req.get());
  for (Request* req : all) {
    req->in_flight = 0;
    for (auto& seq : req->seqs) seq->in_flight = 0;
    req->preempt_when_landed = false;
    if (req->state == Request::State::kDone) {  // finished, waiting for its plans
      Land(req);
      continue;
    }
    FailRequest(req, FinishReason::kAbort, absl::UnavailableError("the server is shutting down"));
  }
  PublishStats();
  loop_.Quit();
}

int Scheduler::AddExecutor(std::unique_ptr<StepExecutor> executor,
                           std::optional<PoolIndex> local_pool) {
  // Indices are handed out here; the insertion runs on the scheduler thread, before any
  // later event can name the index.
  int index;
  {
    absl::MutexLock lock(&mu_);
    index = num_executors_++;
  }
  auto e = std::make_shared<std::unique_ptr<Executor>>(std::make_unique<Executor>());
  (*e)->impl = std::move(executor);
  (*e)->local_pool = local_pool;
  Post([this, e] { executors_.push_back(std::move(*e)); });
  return index;
}

void Scheduler::ResendSetups(int executor, std::function<void()> then) {
  Post([this, executor, then = std::move(then)] {
    for (auto& [id, req] : requests_) {
      if (req->executor != executor) continue;
      for (auto& seq : req->seqs) seq->setup_sent = false;
    }
    if (then) then();
  });
}

void Scheduler::RefreshExecutorAlive(int executor, std::function<bool()> alive) {
  Post([this, executor, alive = std::move(alive)] { SetExecutorAliveNow(executor, alive()); });
}

void Scheduler::SetExecutorAlive(int executor, bool alive) {
  Post([this, executor, alive] { SetExecutorAliveNow(executor, alive); });
}

void Scheduler::SetExecutorAliveNow(int executor, bool alive) {
  {
    if (executor < 0 || executor >= static_cast<int>(executors_.size())) return;
    Executor& e = *executors_[executor];
    if (e.alive == alive) return;
    e.alive = alive;
    LOG(WARNING) << "compute node " << e.impl->name() << (alive ? " is back" : " is gone");
    if (alive) return;
    // Its plans in flight fail now, not at their step deadline (a hung node's connection
    // stays open); their requests move to another node (OnStepResult: the node is lost).
    e.impl->Abandon(absl::UnavailableError(
        absl::StrCat("compute node ", e.impl->name(), " was declared dead")));
    // Its requests move to another executor (disaggregated) or lose their pool
    // (co-located: the pool was the node's own cache).
    if (e.local_pool) SetPoolAliveNow(*e.local_pool, false, -1);
    for (auto& [id, req] : requests_) {
      if (req->executor == executor && !req->in_flight) ForgetExecutor(req.get());
    }
    // Another node carries the releases queued on it; one that comes back is a new process,
    // with no failed plans behind it.
    HandOnReleases(executor);
    e.release_resends.clear();
    e.ClearReleaseBackoff();
  }
}

void Scheduler::QueueRelease(int executor, const TableRelease& release) {
  if (executor >= 0) {
    Executor& ex = *executors_[executor];
    if (ex.alive && ex.reachable) {
      ex.pending_releases.push_back(release);
      return;
    }
    // Unreachable but alive, it may come back with the sequence's compute-side state; dead,
    // it is a new process when it does. Either way another node drops the memory node's
    // table.
    if (ex.alive) ex.pending_releases.push_back(release);
  }
  const bool pool_alive =
      release.pool.value() < pools_.size() && pools_[release.pool.value()]->alive;
  if (!pool_alive) return;
  for (size_t e = 0; e < executors_.size(); ++e) {
    Executor& other = *executors_[e];
    if (static_cast<int>(e) == executor || !other.alive || !other.reachable) continue;
    if (other.local_pool && *other.local_pool != release.pool) continue;
    other.pending_releases.push_back(release);
    return;
  }
}

void Scheduler::HandOnReleases(int executor) {
  Executor& ex = *executors_[executor];
  std::vector<TableRelease> queued = std::move(ex.pending_releases);
  ex.pending_releases.clear();
  queued.insert(queued.end(), ex.parked_releases.begin(), ex.parked_releases.end());
  ex.parked_releases.clear();
  for (const TableRelease& r : queued) QueueRelease(executor, r);
}

PoolIndex Scheduler::AddPool(const std::string& name, int64_t num_slots) {
  return NewPool(name, num_slots, /*alive=*/true);
}

PoolIndex Scheduler::ReservePool(const std::string& name) {
  return NewPool(name, 0, /*alive=*/false);
}

PoolIndex Scheduler::NewPool(const std::string& name, int64_t num_slots, bool alive) {
  PoolIndex index;
  {
    absl::MutexLock lock(&mu_);
    index = PoolIndex(num_pools_++);
    largest_pool_slots_ = std::max(largest_pool_slots_, num_slots);
  }
  Post([this, index, name, num_slots, alive] {
    auto p = std::make_unique<Pool>();
    p->name = name;
    p->alive = alive;
    p->num_slots = num_slots;
    p->kv = std::make_unique<KvPool>(index, num_slots, config_.block_tokens, config_.kv_eviction);
    pools_.push_back(std::move(p));
  });
  return index;
}

void Scheduler::SetPoolAlive(PoolIndex pool, bool alive, int64_t num_slots) {
  if (alive && num_slots > 0) {
    // Submit checks requests against it from now on.
    absl::MutexLock lock(&mu_);
    largest_pool_slots_ = std::max(largest_pool_slots_, num_slots);
  }
  Post([this, pool, alive, num_slots] { SetPoolAliveNow(pool, alive, num_slots); });
}

void Scheduler::ForgetLostKv(Request* req) {
  for (auto& s : req->seqs) {
    s->table.clear();
    s->held.clear();
    s->shifts.clear();
    s->shift_sources.clear();
    s->table_sent = 0;
    s->registered_blocks = 0;
  }
}

void Scheduler::SetPoolAliveNow(PoolIndex pool, bool alive, int64_t num_slots) {
  {
    if (pool.value() >= pools_.size()) return;
    Pool& p = *pools_[pool.value()];
    if (alive) {
      if (p.alive) return;
      p.alive = true;
      if (num_slots > 0) p.num_slots = num_slots;
      p.kv = std::make_unique<KvPool>(pool, p.num_slots, config_.block_tokens, config_.kv_eviction);
      ++p.kv_epoch;
      p.prefetching.clear();
      LOG(INFO) << "KV pool " << p.name << " is up with " << p.num_slots << " slots";
      return;
    }
    if (!p.alive) return;
    p.alive = false;
    LOG(WARNING) << "KV pool " << p.name << " is gone; re-prefilling its requests elsewhere";
    // Its KV is lost: forget the tables without touching the (discarded) ledger.
    retired_dram_evicted_ += p.kv->evicted_blocks();
    p.kv = std::make_unique<KvPool>(pool, 0, config_.block_tokens);
    ++p.kv_epoch;
    p.prefetching.clear();
    // Its disk tier is reopened empty when it comes back; late outcomes are ignored.
    if (p.disk) {
      retired_disk_evicted_ += p.disk->Stats().evicted;
      retired_disk_expired_ += p.disk->Stats().expired;
    }
    p.disk.reset();
    p.mover.reset();
    ++p.generation;
    p.loads.clear();
    p.moves.clear();
    p.saving_slots = 0;
    for (auto& e : executors_) {
      for (auto* rel : {&e->pending_releases, &e->parked_releases}) {
        for (const TableRelease& r : *rel) {
          if (r.pool == pool) e->release_resends.erase(r.request_id);
        }
        rel->erase(std::remove_if(rel->begin(), rel->end(),
                                  [&](const TableRelease& r) { return r.pool == pool; }),
                   rel->end());
      }
    }
    bool any_alive = false;
    for (const auto& other : pools_) any_alive = any_alive || other->alive;
    std::vector<Request*> affected;
    for (auto& [id, req] : requests_) {
      if (req->pool != pool) continue;
      if (req->state == Request::State::kRunning) affected.push_back(req.get());
      // Finished with a plan still out, its slots to be released when it lands (Land): they
      // went with this ledger, and the pool may come back with a new one before then.
      if (req->state == Request::State::kDone) ForgetLostKv(req.get());
    }
    for (Request* req : affected) {
      // A request with a plan out is preempted (or failed) now; its KV, lost with the pool,
      // is forgotten once the plan is back, and whatever that plan sampled is discarded.
      ForgetLostKv(req);
      if (any_alive) {
        Preempt(req);
      } else {
        FailRequest(req, FinishReason::kError,
                    absl::UnavailableError(
                        absl::StrCat("memory node ", p.name, " died and no other is alive")));
      }
    }
  }
}

void Scheduler::SetPoolDeathHandler(std::function<void(PoolIndex)> handler) {
  Post(
      [this, handler = std::move(handler)]() mutable { pool_death_handler_ = std::move(handler); });
}

void Scheduler::SetObserver(SchedulerObserver observer) {
  Post([this, observer = std::move(observer)]() mutable { observer_ = std::move(observer); });
}

absl::StatusOr<uint64_t> Scheduler::Submit(GenerateRequest request, UpdateCallback on_update) {
  const int64_t prompt_len = static_cast<int64_t>(request.prompt_tokens.size());
  if (prompt_len == 0) return absl::InvalidArgumentError("the prompt is empty");
  for (int32_t t : request.prompt_tokens) {
    if (t < 0 || t >= config_.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", t, " is outside the vocabulary [0, ", config_.vocab_size, ")"));
    }
  }
  if (request.n < 1 || request.n > config_.max_n) {
    return absl::InvalidArgumentError(absl::StrCat("n must be between 1 and ", config_.max_n));
  }
  if (request.max_tokens < 1) return absl::InvalidArgumentError("max_tokens must be at least 1");
  std::optional<Truncation> truncation;
  std::vector<int32_t> untruncated;
  if (prompt_len + request.max_tokens > config_.max_model_len) {
    if (config_.context_overflow == ContextOverflow::kTruncate) {
      truncation = PlanTruncation(prompt_len, request.max_tokens, config_.max_model_len,
                                  config_.context_keep_tokens, config_.block_tokens);
    }
    if (!truncation) {
      return absl::InvalidArgumentError(absl::StrCat(
          "This model's maximum context length is ", config_.max_model_len,
          " tokens. However, you requested ", prompt_len + request.max_tokens, " tokens (",
          prompt_len, " in the prompt, ", request.max_tokens, " in the completion). ",
          config_.context_overflow == ContextOverflow::kTruncate
              ? "Even with the middle of the prompt dropped it does not fit. "
              : "",
          "Please reduce the length of the prompt or completion."));
    }
    untruncated = std::move(request.prompt_tokens);
    request.prompt_tokens = Truncate(untruncated, *truncation);
  }
  const int64_t truncated_len = static_cast<int64_t>(request.prompt_tokens.size());
  const int64_t needed = truncated_len + static_cast<int64_t>(request.n) * request.max_tokens;
  int64_t largest_pool = 0;
  int64_t num_queued = 0;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("the server is shutting down");
    largest_pool = largest_pool_slots_;
  }
  if (largest_pool > 0 && needed > largest_pool) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the request needs up to ", needed, " KV slots (prompt ", truncated_len, " + ", request.n,
        " x max_tokens ", request.max_tokens, ") but the largest KV pool holds ", largest_pool));
  }
  num_queued = queued_.fetch_add(1);
  if (num_queued >= config_.max_waiting) {
    queued_.fetch_sub(1);
    {
      absl::MutexLock lock(&stats_mu_);
      ++counters_.rejected_total;
    }
    return absl::ResourceExhaustedError(
        absl::StrCat("the server is overloaded: ", num_queued, " requests are already waiting"));
  }
  if (!request.has_seed) {
    thread_local std::mt19937_64 rng(std::random_device{}());
    request.sampling.seed = rng();
  }
  uint64_t id;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      queued_.fetch_sub(1);
      return absl::UnavailableError("the server is shutting down");
    }
    id = next_request_id_++;
  }
  if (truncation) {
    absl::MutexLock lock(&stats_mu_);
    ++counters_.context_truncated_total;
    counters_.context_dropped_tokens_total += truncation->dropped;
  }
  Post([this, id, request = std::move(request), on_update = std::move(on_update), truncation,
        untruncated = std::move(untruncated)]() mutable {
    auto req = std::make_unique<Request>();
    req->id = id;
    req->spec = std::move(request);
    if (truncation) {
      req->truncation = *truncation;
      req->untruncated = std::move(untruncated);
    }
    req->callback = std::move(on_update);
    req->arrival = arrival_counter_++;
    req->submitted = absl::Now();
    const absl::Duration timeout =
        req->spec.timeout > absl::ZeroDuration() ? req->spec.timeout : config_.default_timeout;
    if (timeout > absl::ZeroDuration()) {
      req->deadline_timer = loop_.RunAt(req->submitted + timeout, [this, id] { OnDeadline(id); });
    }
    StopConditions stop;
    if (!req->spec.ignore_eos) stop.eos_tokens = config_.eos_token_ids;
    stop.stop_token_ids = req->spec.stop_token_ids;
    stop.stop_strings = req->spec.stop;
    stop.include_stop_str_in_output = req->spec.include_stop_str_in_output;
    stop.max_tokens = req->spec.max_tokens;
    stop.min_tokens = req->spec.min_tokens;
    stop.skip_special_tokens = req->spec.skip_special_tokens;
    for (int i = 0; i < req->spec.n; ++i) {
      auto seq = std::make_unique<Sequence>();
      seq->id = SequenceId(next_sequence_id_++);
      seq->request = req.get();
      seq->index = static_cast<uint32_t>(i);
      seq->tokens = req->spec.prompt_tokens;
      seq->waiting_for_owner = i > 0;
      seq->output = std::make_unique<OutputProcessor>(tokenizer_, req->spec.prompt_tokens, stop);
      req->seqs.push_back(std::move(seq));
    }
    for (const auto& seq : req->seqs) sequences_[seq->id] = seq.get();
    InsertWaiting(req.get());
    requests_.emplace(id, std::move(req));
  });
  return id;
}

void Scheduler::Cancel(uint64_t request_id) {
  Post([this, request_id] {
    auto it = requests_.find(request_id);
    if (it == requests_.end()) return;
    Request* req = it->second.get();
    if (req->in_flight) {
      req->pending_finish = FinishReason::kAbort;
      return;
    }
    FailRequest(req, FinishReason::kAbort, absl::CancelledError("cancelled by the client"));
  });
}

bool Scheduler::HasCapacity() const {
  absl::MutexLock lock(&stats_mu_);
  if (stats_.alive_executors == 0) return false;
  for (const PoolStatus& p : stats_.pools) {
    if (p.alive) return true;
  }
  return false;
}

SchedulerStats Scheduler::Stats() const {
  absl::MutexLock lock(&stats_mu_);
  return stats_;
}

PolicyKey Scheduler::KeyOf(const Request* req) const { return {req->spec.priority, req->arrival}; }

bool Scheduler::RankOrder::operator()(const Request* a, const Request* b) const {
  return scheduler->policy_->Before(scheduler->KeyOf(a), scheduler->KeyOf(b));
}

void Scheduler::InsertWaiting(Request* req) {
  waiting_.insert(std::upper_bound(waiting_.begin(), waiting_.end(), req, RankOrder{this}), req);
}

void Scheduler::EraseWaiting(Request* req) {
  auto [first, last] = std::equal_range(waiting_.begin(), waiting_.end(), req, RankOrder{this});
  auto it = std::find(first, last, req);
  if (it != last) waiting_.erase(it);
}

void Scheduler::SetState(Request* req, RequestState state) {
  if (req->state == state) return;
  if (req->state == RequestState::kRunning) running_.erase(req);
  if (req->state == RequestState::kWaiting) EraseWaiting(req);
  req->state = state;
  if (state == RequestState::kRunning) running_.insert(req);
  if (state == RequestState::kWaiting) InsertWaiting(req);
}

void Scheduler::EraseRequest(uint64_t id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  for (const auto& seq : it->second->seqs) sequences_.erase(seq->id);
  requests_.erase(it);
}

void Scheduler::OnDeadline(uint64_t request_id) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return;
  Request* req = it->second.get();
  req->deadline_timer = 0;
  if (req->state == Request::State::kDone || req->pending_finish != FinishReason::kNone) return;
  if (req->in_flight) {
    req->pending_finish = FinishReason::kTimeout;
    return;
  }
  FailRequest(req, FinishReason::kTimeout,
              absl::DeadlineExceededError("the request exceeded its timeout"));
}

void Scheduler::ReleaseKv(Sequence* seq) {
  Request* req = seq->request;
  DropShiftSources(seq);
  if (req->pool && req->pool->value() < pools_.size() && pools_[req->pool->value()]->alive) {
    KvPool& kv = *pools_[req->pool->value()]->kv;
    for (const auto& [block, hash] : seq->held) {
      SaveBlock(*req->pool, hash);  // save early: a later eviction from DRAM is then free
      kv.DropBlock(hash);
    }
    kv.Unref(seq->table);
    if (seq->setup_sent && req->executor >= 0) {
      QueueRelease(req->executor, {seq->id, *req->pool});
    } else if (seq->table_sent > 0) {
      // Its table reached the pool through a node that was lost or died (ForgetExecutor),
      // and no node has set it up since: any live node that reaches the pool drops it.
      QueueRelease(-1, {seq->id, *req->pool});
    }
  } else if (seq->setup_sent && req->executor >= 0) {
    // The pool is gone; the compute node still drops its cache.
    QueueRelease(req->executor, {seq->id, req->pool.value_or(PoolIndex(0))});
  }
  seq->table.clear();
  seq->held.clear();
  seq->table_sent = 0;
  seq->registered_blocks = 0;
  seq->setup_sent = false;
}

void Scheduler::FinishSequence(Sequence* seq, FinishReason reason, RequestUpdate* update,
                               const std::string& text) {
  if (seq->finished) return;
  Request* req = seq->request;
  // Siblings waiting for this sequence's prompt KV take it before it goes.
  if (req->state == Request::State::kRunning && seq->computed >= req->prompt_len()) {
    for (auto& other : req->seqs) {
      if (other.get() != seq && !other->finished && other->waiting_for_owner &&
          req->Owner() == seq) {
        ShareParentPrompt(other.get(), seq);
      }
    }
  }
  seq->finished = true;
  if (seq->in_flight > 0) {
    seq->release_deferred = true;  // a plan in flight still writes its KV
  } else {
    ReleaseKv(seq);
  }
  SequenceUpdate* su = nullptr;
  for (auto& u : update->sequences) {
    if (u.index == seq->index) su = &u;
  }
  if (su == nullptr) {
    update->sequences.push_back({});
    su = &update->sequences.back();
    su->index = seq->index;
  }
  su->text += text;
  su->finish = reason;
  {
    absl::MutexLock lock(&stats_mu_);
    ++counters_.finished_total[FinishReasonName(reason)];
  }
}

void Scheduler::FailRequest(Request* req, FinishReason reason, const absl::Status& status) {
  req->last_finish = reason;
  RequestUpdate update;
  update.request_id = req->id;
  for (auto& seq : req->seqs) {
    if (seq->finished) continue;
    const std::string rest = reason == FinishReason::kError ? "" : seq->output->Flush();
    FinishSequence(seq.get(), reason, &update, rest);
  }
  update.finished = true;
  update.error = status;
  update.prompt_tokens = req->prompt_len();
  update.cached_prompt_tokens = req->cached_prompt_tokens;
  if (req->callback) req->callback(update);
  MaybeRemoveRequest(req);
}

bool Scheduler::FinishPending(Request* req) {
  if (req->pending_finish == FinishReason::kAbort) {
    FailRequest(req, FinishReason::kAbort, absl::CancelledError("cancelled by the client"));
  } else if (req->pending_finish == FinishReason::kTimeout) {
    FailRequest(req, FinishReason::kTimeout,
                absl::DeadlineExceededError("the request exceeded its timeout"));
  } else {
    return false;
  }
  return true;
}

void Scheduler::MaybeRemoveRequest(Request* req) {
  if (req->state == Request::State::kDone) return;  // already counted
  for (const auto& s : req->seqs) {
    if (!s->finished) return;
  }
  if (req->admitted == absl::InfinitePast()) queued_.fetch_sub(1);
  if (observer_.on_finish) {
    const absl::Time now = absl::Now();
    int64_t generated = 0;
    for (const auto& s : req->seqs) generated += s->num_outputs;
    const FinishReason reason = req->last_finish;
    const absl::Time admitted = req->admitted == absl::InfinitePast() ? now : req->admitted;
    const absl::Time first = req->first_token == absl::InfinitePast() ? now : req->first_token;
    observer_.on_finish(req->spec, reason, req->prompt_len(), generated, now - req->submitted,
                        admitted - req->submitted, first - admitted, now - first);
  }
  SetState(req, Request::State::kDone);
  if (req->deadline_timer != 0) loop_.Cancel(req->deadline_timer);
  req->deadline_timer = 0;
  if (req->in_flight > 0) return;  // erased when its plans are back (Land)
  RemoveFinished(req->id);
}

void Scheduler::RemoveFinished(uint64_t id) {
  if (defer_removals_) {
    deferred_removals_.push_back(id);
  } else {
    EraseRequest(id);
  }
}

void Scheduler::Land(Request* req) {
  for (auto& seq : req->seqs) {
    if (!seq->release_deferred || seq->in_flight > 0) continue;
    seq->release_deferred = false;
    ReleaseKv(seq.get());
  }
  if (req->in_flight > 0) return;
  if (req->preempt_when_landed) {
    req->preempt_when_landed = false;
    if (req->state == Request::State::kRunning) Preempt(req);
  }
  if (req->state == Request::State::kDone) RemoveFinished(req->id);
}

void Scheduler::RemoveDeferred() {
  defer_removals_ = false;
  for (uint64_t id : deferred_removals_) EraseRequest(id);
  deferred_removals_.clear();
}

void Scheduler::PublishStats() {
  SchedulerStats s;
  {
    absl::MutexLock lock(&stats_mu_);
    s = counters_;
  }
  s.dram_evicted_blocks_total = retired_dram_evicted_;
  s.disk_evicted_blocks_total = retired_disk_evicted_;
  s.disk_expired_blocks_total = retired_disk_expired_;
  int64_t used = 0, total = 0;
  for (size_t i = 0; i < pools_.size(); ++i) {
    PoolStatus ps;
    ps.index = PoolIndex(i);
    ps.name = pools_[i]->name;
    ps.alive = pools_[i]->alive;
    if (ps.alive) {
      ps.stats = pools_[i]->kv->Stats();
      ps.has_disk = pools_[i]->disk != nullptr;
      if (ps.has_disk) ps.disk = pools_[i]->disk->Stats();
      s.dram_evicted_blocks_total += pools_[i]->kv->evicted_blocks();
      s.disk_evicted_blocks_total += ps.disk.evicted;
      s.disk_expired_blocks_total += ps.disk.expired;
      used += ps.stats.used_slots;
      total += ps.stats.total_slots;
    }
    s.pools.push_back(ps);
  }
  s.num_running = static_cast<int64_t>(running_.size());
  s.num_waiting = static_cast<int64_t>(waiting_.size());
  s.lookahead_window_requests = lookahead_window_requests_;
  for (const Request* req : running_) {
    if (!req->pool || req->pool->value() >= s.pools.size()) continue;
    for (const auto& seq : req->seqs) {
      const int64_t length = static_cast<int64_t>(seq->table.size());
      s.pools[req->pool->value()].stats.live_positions += length;
      // What pages of kPagedCompareTokens would waste on this sequence's last page.
      s.kv_paged_waste_slots +=
          (length + kPagedCompareTokens - 1) / kPagedCompareTokens * kPagedCompareTokens - length;
    }
  }
  s.alive_executors = LiveReplicas();
  s.step_period_seconds = absl::ToDoubleSeconds(clock_.period());
  if (config_.pipelining == Pipelining::kFixed) {
    s.stagger_seconds = absl::ToDoubleSeconds(clock_.StaggerGap(LiveReplicas()));
  }
  for (const auto& ex : executors_) {
    if (!ex->alive) continue;
    s.plan_ahead_margin_seconds = std::max(s.plan_ahead_margin_seconds, ex->ahead_margin);
  }
  s.step_compute_seconds = clock_.compute_seconds();
  s.step_attention_seconds = clock_.attention_seconds();
  s.advised_memory_nodes = advised_memory_nodes_;
  s.kv_usage = total > 0 ? static_cast<double>(used) / total : 0.0;
  absl::MutexLock lock(&stats_mu_);
  stats_ = std::move(s);
}

}  // namespace strata
