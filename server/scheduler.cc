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

constexpr absl::Duration kTick = absl::Milliseconds(20);

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
  if (c.max_model_len <= 0 || c.block_tokens <= 0 || c.max_n <= 0 || c.max_waiting <= 0) {
    return absl::InvalidArgumentError(
        "max_model_len, block_tokens, max_n and max_waiting must be positive");
  }
  if (c.prefill_chunk_tokens <= 0 && c.max_num_batched_tokens < c.max_model_len) {
    return absl::InvalidArgumentError(
        "without chunked prefill, max_num_batched_tokens must cover max_model_len");
  }
  return absl::OkStatus();
}

void Scheduler::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void Scheduler::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ || !thread_.joinable()) {
      stopping_ = true;
      return;
    }
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Scheduler::Post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(fn));
  }
  cv_.notify_one();
}

int Scheduler::AddExecutor(std::unique_ptr<StepExecutor> executor,
                           std::optional<PoolIndex> local_pool) {
  // Indices are handed out here; the insertion runs on the scheduler thread, before any
  // later event can name the index.
  int index;
  {
    std::lock_guard<std::mutex> lock(mu_);
    index = num_executors_++;
  }
  auto e = std::make_shared<std::unique_ptr<Executor>>(std::make_unique<Executor>());
  (*e)->impl = std::move(executor);
  (*e)->local_pool = local_pool;
  Post([this, e] { executors_.push_back(std::move(*e)); });
  return index;
}

void Scheduler::SetExecutorAlive(int executor, bool alive) {
  Post([this, executor, alive] {
    if (executor < 0 || executor >= static_cast<int>(executors_.size())) return;
    Executor& e = *executors_[executor];
    if (e.alive == alive) return;
    e.alive = alive;
    LOG(WARNING) << "compute node " << e.impl->name() << (alive ? " is back" : " is gone");
    if (alive) return;
    // Its requests move to another executor (disaggregated) or lose their pool
    // (co-located: the pool was the node's own cache).
    if (e.local_pool) SetPoolAliveNow(*e.local_pool, false, -1);
    for (auto& [id, req] : requests_) {
      if (req->executor == executor && !req->in_flight) ForgetExecutor(req.get());
    }
    e.pending_releases.clear();
  });
}

PoolIndex Scheduler::AddPool(const std::string& name, int64_t num_slots) {
  PoolIndex index;
  {
    std::lock_guard<std::mutex> lock(mu_);
    index = PoolIndex(num_pools_++);
    largest_pool_slots_ = std::max(largest_pool_slots_, num_slots);
  }
  Post([this, index, name, num_slots] {
    auto p = std::make_unique<Pool>();
    p->name = name;
    p->alive = true;
    p->num_slots = num_slots;
    p->kv = std::make_unique<KvPool>(index, num_slots, config_.block_tokens);
    pools_.push_back(std::move(p));
  });
  return index;
}

void Scheduler::SetPoolAlive(PoolIndex pool, bool alive, int64_t num_slots) {
  Post([this, pool, alive, num_slots] { SetPoolAliveNow(pool, alive, num_slots); });
}

void Scheduler::SetPoolAliveNow(PoolIndex pool, bool alive, int64_t num_slots) {
  {
    if (pool.value() >= pools_.size()) return;
    Pool& p = *pools_[pool.value()];
    if (alive) {
      if (p.alive) return;
      p.alive = true;
      if (num_slots > 0) p.num_slots = num_slots;
      p.kv = std::make_unique<KvPool>(pool, p.num_slots, config_.block_tokens);
      LOG(INFO) << "KV pool " << p.name << " is back with " << p.num_slots << " slots";
      return;
    }
    if (!p.alive) return;
    p.alive = false;
    LOG(WARNING) << "KV pool " << p.name << " is gone; re-prefilling its requests elsewhere";
    // Its KV is lost: forget the tables without touching the (discarded) ledger.
    p.kv = std::make_unique<KvPool>(pool, 0, config_.block_tokens);
    for (auto& e : executors_) {
      auto& rel = e->pending_releases;
      rel.erase(std::remove_if(rel.begin(), rel.end(),
                               [&](const TableRelease& r) { return r.pool == pool; }),
                rel.end());
    }
    bool any_alive = false;
    for (const auto& other : pools_) any_alive = any_alive || other->alive;
    std::vector<Request*> affected;
    for (auto& [id, req] : requests_) {
      if (req->pool == pool && req->state == Request::State::kRunning)
        affected.push_back(req.get());
    }
    for (Request* req : affected) {
      if (req->in_flight) continue;  // handled when its step returns
      for (auto& s : req->seqs) {
        s->table.clear();
        s->held.clear();
        s->table_sent = 0;
        s->registered_blocks = 0;
      }
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
  if (prompt_len + request.max_tokens > config_.max_model_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("This model's maximum context length is ", config_.max_model_len,
                     " tokens. However, you requested ", prompt_len + request.max_tokens,
                     " tokens (", prompt_len, " in the prompt, ", request.max_tokens,
                     " in the completion). Please reduce the length of the prompt or completion."));
  }
  const int64_t needed = prompt_len + static_cast<int64_t>(request.n) * request.max_tokens;
  int64_t largest_pool = 0;
  int64_t num_queued = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return absl::UnavailableError("the server is shutting down");
    largest_pool = largest_pool_slots_;
  }
  if (largest_pool > 0 && needed > largest_pool) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the request needs up to ", needed, " KV slots (prompt ", prompt_len, " + ", request.n,
        " x max_tokens ", request.max_tokens, ") but the largest KV pool holds ", largest_pool));
  }
  num_queued = queued_.fetch_add(1);
  if (num_queued >= config_.max_waiting) {
    queued_.fetch_sub(1);
    {
      std::lock_guard<std::mutex> lock(stats_mu_);
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
    std::lock_guard<std::mutex> lock(mu_);
    id = next_request_id_++;
  }
  Post([this, id, request = std::move(request), on_update = std::move(on_update)]() mutable {
    auto req = std::make_unique<Request>();
    req->id = id;
    req->spec = std::move(request);
    req->callback = std::move(on_update);
    req->arrival = arrival_counter_++;
    req->submitted = absl::Now();
    const absl::Duration timeout =
        req->spec.timeout > absl::ZeroDuration() ? req->spec.timeout : config_.default_timeout;
    if (timeout > absl::ZeroDuration()) req->deadline = req->submitted + timeout;
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
    waiting_.push_back(req.get());
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
  std::lock_guard<std::mutex> lock(stats_mu_);
  if (stats_.alive_executors == 0) return false;
  for (const PoolStatus& p : stats_.pools) {
    if (p.alive) return true;
  }
  return false;
}

SchedulerStats Scheduler::Stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return stats_;
}

void Scheduler::Loop() {
  while (true) {
    std::deque<std::function<void()>> events;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, absl::ToChronoMilliseconds(kTick),
                   [&] { return !events_.empty() || stopping_; });
      events.swap(events_);
      if (stopping_ && events.empty()) break;
    }
    for (auto& event : events) event();
    CheckTimeouts();
    ScheduleIdleExecutors();
    PublishStats();
  }
  // Shutdown: wait for steps in flight (their sinks post here), then fail the rest.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    bool busy = false;
    for (const auto& e : executors_) busy = busy || e->busy;
    if (!busy) break;
    std::deque<std::function<void()>> events;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, absl::ToChronoNanoseconds(absl::Milliseconds(20)),
                   [&] { return !events_.empty(); });
      events.swap(events_);
    }
    for (auto& event : events) event();
  }
  std::vector<Request*> all;
  for (auto& [id, req] : requests_) all.push_back(req.get());
  for (Request* req : all) {
    req->in_flight = false;
    FailRequest(req, FinishReason::kAbort, absl::UnavailableError("the server is shutting down"));
  }
  PublishStats();
}

PolicyKey Scheduler::KeyOf(const Request* req) const { return {req->spec.priority, req->arrival}; }

void Scheduler::CheckTimeouts() {
  const absl::Time now = absl::Now();
  std::vector<Request*> expired;
  for (auto& [id, req] : requests_) {
    if (req->deadline < now && req->pending_finish == FinishReason::kNone)
      expired.push_back(req.get());
  }
  for (Request* req : expired) {
    if (req->in_flight) {
      req->pending_finish = FinishReason::kTimeout;
      continue;
    }
    FailRequest(req, FinishReason::kTimeout,
                absl::DeadlineExceededError("the request exceeded its timeout"));
  }
}

void Scheduler::ReleaseKv(Sequence* seq) {
  Request* req = seq->request;
  if (req->pool && req->pool->value() < pools_.size() && pools_[req->pool->value()]->alive) {
    KvPool& kv = *pools_[req->pool->value()]->kv;
    for (const auto& [block, hash] : seq->held) kv.DropBlock(hash);
    kv.Unref(seq->table);
    if (seq->setup_sent && req->executor >= 0) {
      executors_[req->executor]->pending_releases.push_back({seq->id, *req->pool});
    }
  } else if (seq->setup_sent && req->executor >= 0) {
    // The pool is gone; the compute node still drops its cache.
    executors_[req->executor]->pending_releases.push_back(
        {seq->id, req->pool.value_or(PoolIndex(0))});
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
  ReleaseKv(seq);
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
    std::lock_guard<std::mutex> lock(stats_mu_);
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

void Scheduler::MaybeRemoveRequest(Request* req) {
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
  req->state = Request::State::kDone;
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), req), waiting_.end());
  if (defer_removals_) {
    deferred_removals_.push_back(req->id);
    return;
  }
  requests_.erase(req->id);
}

void Scheduler::RemoveDeferred() {
  defer_removals_ = false;
  for (uint64_t id : deferred_removals_) requests_.erase(id);
  deferred_removals_.clear();
}

void Scheduler::PublishStats() {
  SchedulerStats s;
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    s = counters_;
  }
  int64_t used = 0, total = 0;
  for (size_t i = 0; i < pools_.size(); ++i) {
    PoolStatus ps;
    ps.index = PoolIndex(i);
    ps.name = pools_[i]->name;
    ps.alive = pools_[i]->alive;
    if (ps.alive) {
      ps.stats = pools_[i]->kv->Stats();
      used += ps.stats.used_slots;
      total += ps.stats.total_slots;
    }
    s.pools.push_back(ps);
  }
  for (auto& [id, req] : requests_) {
    if (req->state == Request::State::kRunning) {
      ++s.num_running;
      if (req->pool && req->pool->value() < s.pools.size()) {
        for (const auto& seq : req->seqs) {
          const int64_t length = static_cast<int64_t>(seq->table.size());
          s.pools[req->pool->value()].stats.live_positions += length;
          // What pages of kPagedCompareTokens would waste on this sequence's last page.
          s.kv_paged_waste_slots +=
              (length + kPagedCompareTokens - 1) / kPagedCompareTokens * kPagedCompareTokens -
              length;
        }
      }
    } else if (req->state == Request::State::kWaiting) {
      ++s.num_waiting;
    }
  }
  for (const auto& e : executors_) s.alive_executors += e->alive && e->reachable ? 1 : 0;
  s.kv_usage = total > 0 ? static_cast<double>(used) / total : 0.0;
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_ = std::move(s);
}

}  // namespace strata
