// Building steps: the batch planner's view of the running requests and its actions applied
// (batch_planner.h chooses the rows and the preemptions), then the waiting requests
// admitted under Admission's rules. Placing a request in a pool and preempting one are in
// scheduler_admission.cc; applying results is in scheduler_results.cc.
#include <algorithm>
#include <unordered_set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/stopwatch.h"
#include "server/scheduler.h"
#include "server/scheduler_internal.h"

namespace strata {

void Scheduler::ScheduleIdleExecutors() {
  for (size_t e = 0; e < executors_.size(); ++e) {
    Executor& ex = *executors_[e];
    if (!ex.reachable && ex.impl->Reachable()) {
      ex.reachable = true;
      // Its plans failed for being out of reach: its releases go again at once.
      ex.ClearReleaseBackoff();
      LOG(INFO) << "compute node " << ex.impl->name() << " is reachable again";
    }
    while (ex.alive && ex.reachable &&
           static_cast<int>(ex.in_flight.size()) < config_.max_plans_in_flight) {
      if (!StaggerAllowsStart()) return;
      if (!ex.in_flight.empty() && !AheadPlanDue(static_cast<int>(e))) break;
      auto plan = std::make_shared<StepPlan>();
      const Stopwatch planning;
      const bool built = BuildPlan(static_cast<int>(e), plan.get());
      {
        absl::MutexLock lock(&stats_mu_);
        counters_.plan_seconds_total += planning.ElapsedSeconds();
        counters_.plans_total += built ? 1 : 0;
      }
      const bool overdue = std::exchange(ex.ahead_overdue, false);
      if (!built) break;
      last_start_ = absl::Now();
      // A plan ahead: built while another runs, or one whose timer had not fired when the
      // running step's result came (it is late, and its slack says by how much).
      const bool ahead = config_.async_scheduling && (!ex.in_flight.empty() || overdue);
      if (ex.in_flight.empty()) ex.running_since = last_start_;
      ex.in_flight.push_back({plan, last_start_, ahead});
      SubmitPlan(static_cast<int>(e), std::move(plan));
    }
  }
}

bool Scheduler::AheadPlanDue(int index) {
  Executor& ex = *executors_[index];
  if (!config_.async_scheduling || config_.plan_ahead_lead >= 1) return true;
  const double step =
      (DecodeOnly(*ex.in_flight.front().plan) ? ex.decode_step_seconds : ex.mixed_step_seconds)
          .value();
  if (step <= 0) return true;
  // The plan ahead is built shortly before the running step is expected to end, not when
  // it starts: a request that arrives meanwhile joins it instead of waiting for the step
  // after. The lead covers planning and the trip to the node; a step that ends sooner than
  // expected waits for its next plan, as under synchronous scheduling. The margin adds what
  // the trip was seen to take beyond the lead (AdjustAheadMargin).
  const double lead = std::max(kAheadLeadMin, config_.plan_ahead_lead * step) + ex.ahead_margin;
  const absl::Time due = ex.running_since + absl::Seconds(step - lead);
  const absl::Time now = absl::Now();
  if (now >= due) return true;
  // One timer per executor, moved earlier when a shorter step took over.
  if (ex.ahead_timer == 0 || due < ex.ahead_due) {
    if (ex.ahead_timer != 0) loop_.Cancel(ex.ahead_timer);
    ex.ahead_due = due;
    // The timer's batch runs AfterBatch, which plans the idle compute nodes again.
    ex.ahead_timer = loop_.RunAt(due, [this, index] { executors_[index]->ahead_timer = 0; });
  }
  return false;
}

// A plan ahead must be at the node when its running step ends. The lead is a share of the
// step; the trip takes longer where the threads on the way wait for a core the step's team
// holds (service threads yield to compute, common/base/wait_policy.h): then the node, free,
// waits for the plan (negative slack), and the next plans ahead go out that much earlier.
// A plan ahead that was queued at the node before it was needed gives back a small part of
// its slack, so that the margin shrinks again when trips are quick. It never exceeds the
// step: plans ahead then go out as soon as the running step starts.
void Scheduler::AdjustAheadMargin(int index, int64_t slack_us) {
  Executor& ex = *executors_[index];
  const double slack = 1e-6 * static_cast<double>(slack_us);
  const double step = std::max(ex.decode_step_seconds.value(), ex.mixed_step_seconds.value());
  if (slack < 0) {
    ex.ahead_margin = std::min(step, ex.ahead_margin - slack);
  } else {
    ex.ahead_margin = std::max(0.0, ex.ahead_margin - kAheadMarginGiveBack * slack);
  }
}

int Scheduler::LiveReplicas() const {
  int live = 0;
  for (const auto& e : executors_) live += e->alive && e->reachable ? 1 : 0;
  return live;
}

bool Scheduler::StaggerAllowsStart() {
  if (config_.pipelining != Pipelining::kFixed) return true;
  const absl::Time allowed = last_start_ + clock_.StaggerGap(LiveReplicas());
  const absl::Time now = absl::Now();
  if (now >= allowed) return true;
  if (!stagger_timer_set_) {
    stagger_timer_set_ = true;
    // The timer's batch runs AfterBatch, which plans the idle compute nodes again.
    loop_.RunAfter(allowed - now, [this] { stagger_timer_set_ = false; });
  }
  return false;
}

void Scheduler::UpdateAdvice() {
  int memory_nodes = 0, batches = 0;
  for (const auto& p : pools_) memory_nodes += p->alive ? 1 : 0;
  for (const auto& e : executors_) {
    if (e->local_pool) return;  // co-located: no memory nodes to size
    if (e->alive && e->reachable) {
      batches += config_.pipelining == Pipelining::kTwo          ? 2
                 : config_.pipelining == Pipelining::kRotational ? config_.max_plans_in_flight
                                                                 : 1;
    }
  }
  const int advice = AdviseMemoryNodes(clock_.compute_seconds(), clock_.attention_seconds(),
                                       memory_nodes, batches);
  if (advice == advised_memory_nodes_) return;
  advised_memory_nodes_ = advice;
  LOG(INFO) << "sizing advice: " << advice << " memory node(s) would balance the pools (now "
            << memory_nodes << "; decode step t_m " << clock_.compute_seconds() * 1e3 << " ms, t_a "
            << clock_.attention_seconds() * 1e3 << " ms, " << batches << " batch(es) in flight)";
}

void Scheduler::SubmitPlan(int index, std::shared_ptr<const StepPlan> plan) {
  executors_[index]->impl->Submit(std::move(plan), [this, index](StepResult result) {
    Post([this, index, result = std::move(result)]() mutable {
      Executor& x = *executors_[index];
      // Results come back in submission order.
      CHECK(!x.in_flight.empty()) << "a result from " << x.impl->name() << " with no plan";
      Executor::InFlight done = std::move(x.in_flight.front());
      x.in_flight.pop_front();
      // The next plan, if one is queued at the node, starts now; the node's own time for
      // this step feeds the estimate of when that one ends. If none is, and the timer that
      // was to build it has not fired, the plan is overdue: it goes now.
      if (!x.in_flight.empty()) x.running_since = absl::Now();
      if (x.in_flight.empty() && x.ahead_timer != 0) {
        loop_.Cancel(x.ahead_timer);
        x.ahead_timer = 0;
        x.ahead_overdue = true;
      }
      if (result.status.ok() && result.timing.total_us > 0) {
        (DecodeOnly(*done.plan) ? x.decode_step_seconds : x.mixed_step_seconds)
            .Observe(1e-6 * static_cast<double>(result.timing.total_us));
      }
      if (done.ahead && result.status.ok() && result.timing.plan_slack_us) {
        AdjustAheadMargin(index, *result.timing.plan_slack_us);
      }
      if (done.plan->step_id != result.step_id && result.status.ok()) {
        result.status = absl::InternalError(
            absl::StrCat("step ", done.plan->step_id, " came back as step ", result.step_id));
      }
      // A chunk computed over loads still out waits for their outcome (it may be void).
      if (!parked_.empty() || AwaitsLoads(*done.plan)) {
        parked_.push_back(
            {index, std::move(done.plan), std::move(result), done.started, absl::Now()});
        return;
      }
      const Stopwatch applying;
      OnStepResult(index, *done.plan, std::move(result), done.started);
      absl::MutexLock lock(&stats_mu_);
      counters_.apply_seconds_total += applying.ElapsedSeconds();
    });
  });
}

void Scheduler::RegisterBlocks(Sequence* seq) {
  Request* req = seq->request;
  if (!config_.enable_prefix_caching || !req->pool || !pools_[req->pool->value()]->alive) return;
  const int64_t block = config_.block_tokens;
  AppendBlockHashes(seq->tokens, config_.block_tokens, config_.cache_salt, &seq->hashes);
  const int64_t complete = std::min<int64_t>(seq->computed, seq->table.size()) / block;
  KvPool& kv = *pools_[req->pool->value()]->kv;
  for (int64_t b = seq->registered_blocks;
       b < complete && b < static_cast<int64_t>(seq->hashes.size()); ++b) {
    if (kv.InsertBlock(seq->hashes[b], seq->tokens.data() + b * block,
                       seq->table.data() + b * block)) {
      seq->held.emplace_back(b, seq->hashes[b]);
      // Delayed write-back: the block is full, and goes to disk now, in the background.
      if (config_.disk_save_on_fill) SaveBlock(*req->pool, seq->hashes[b], /*frees=*/false);
    }
  }
  seq->registered_blocks = std::max(seq->registered_blocks, complete);
}

void Scheduler::ShareParentPrompt(Sequence* child, Sequence* owner) {
  Request* req = child->request;
  KvPool& kv = *pools_[req->pool->value()]->kv;
  const int64_t prompt_len = req->prompt_len();
  child->table.assign(owner->table.begin(), owner->table.begin() + prompt_len);
  kv.Ref(child->table);
  child->held.clear();
  for (const auto& [b, hash] : owner->held) {
    // Any cached block whose slots the child now references, it must hold (kv_manager.h).
    if (b * config_.block_tokens < prompt_len) {
      kv.HoldBlock(hash);
      child->held.emplace_back(b, hash);
    }
  }
  child->hashes.assign(
      owner->hashes.begin(),
      owner->hashes.begin() +
          std::min<int64_t>(owner->hashes.size(), prompt_len / config_.block_tokens));
  child->registered_blocks = prompt_len / config_.block_tokens;
  child->computed = prompt_len;
  child->table_sent = 0;
  child->waiting_for_owner = false;
}

bool Scheduler::PoolServes(std::optional<PoolIndex> pool, int e) const {
  const Executor& ex = *executors_[e];
  return pool && pool->value() < pools_.size() && pools_[pool->value()]->alive &&
         (!ex.local_pool || *ex.local_pool == *pool);
}

void Scheduler::FillPlannerView(int e, std::vector<Request*>* preloading) {
  const Executor& ex = *executors_[e];
  // The running requests, in rank order, as the batch planner sees them. Those this
  // executor may run are eligible, highest priority first. With asynchronous scheduling a
  // request with a plan out on this executor stays eligible: its sequences that are not in
  // flight may join, and one whose token that plan samples may take its next row already.
  const bool async = config_.async_scheduling;
  // The view's buffers are kept from plan to plan: no allocation once they have grown.
  PlannerInput& in = planner_view_;
  std::vector<Request*>& requests = planner_requests_;
  in.async = async;
  // Two batches in flight: this plan takes about half of the decode work, counting what the
  // plans in flight carry, so that the node's two lanes stay balanced. Work is measured by
  // rows (GEMM time) and by KV positions read (attention time). Requests left out decode
  // in the next plan, half a step later. Rotational pipelining spreads the work over its n
  // batches alike: each plan's shares add up to 2 / n.
  in.balance =
      config_.pipelining == Pipelining::kTwo || config_.pipelining == Pipelining::kRotational;
  in.plan_share =
      config_.pipelining == Pipelining::kRotational ? 2.0 / config_.max_plans_in_flight : 1.0;
  in.in_flight_rows = in.in_flight_kv = 0;
  if (in.balance) {
    for (const Executor::InFlight& f : ex.in_flight) {
      for (const SequenceChunk& c : f.plan->chunks) {
        const double n = static_cast<double>(c.tokens.size());
        in.in_flight_rows += n;
        in.in_flight_kv += n * c.start_position + n * (n + 1) / 2;  // positions 0..p per row p
      }
    }
  }
  in.pools.clear();
  for (const auto& p : pools_) {
    in.pools.push_back({p->alive ? p->kv->available() : 0, p->alive ? p->saving_slots : 0});
  }
  requests.assign(running_.begin(), running_.end());
  in.requests.clear();
  in.seqs.clear();
  for (Request* req : requests) {
    PlannerRequest& r = in.requests.emplace_back();
    r.pool = req->pool ? static_cast<int>(req->pool->value()) : -1;
    r.prompt_len = req->prompt_len();
    r.max_tokens = req->spec.max_tokens;
    r.in_flight = req->in_flight > 0;
    r.first_seq = static_cast<int>(in.seqs.size());
    r.num_seqs = static_cast<int>(req->seqs.size());
    const Sequence* owner = req->Owner();
    for (const auto& seq : req->seqs) {
      if (seq.get() == owner) r.owner = static_cast<int>(in.seqs.size()) - r.first_seq;
      PlannerSequence& s = in.seqs.emplace_back();
      s.tokens = static_cast<int64_t>(seq->tokens.size());
      s.computed = seq->computed;
      s.table = static_cast<int64_t>(seq->table.size());
      s.num_outputs = seq->num_outputs;
      s.in_flight = seq->in_flight;
      s.in_flight_samples = seq->in_flight_samples;
      s.finished = seq->finished;
      s.waiting_for_owner = seq->waiting_for_owner;
    }
    if (req->loading && req->load_ticket != 0 && !req->preload_planned) {
      preloading->push_back(req);
      continue;
    }
    if (!PoolServes(req->pool, e) || req->preempt_when_landed || req->loading) {
      continue;
    }
    if (req->in_flight > 0 &&
        (!async || req->executor != e || req->pending_finish != FinishReason::kNone)) {
      continue;
    }
    if (req->executor >= 0 && req->executor != e && executors_[req->executor]->alive) continue;
    r.eligible = true;
  }
}

bool Scheduler::BuildPlan(int e, StepPlan* plan) {
  Executor& ex = *executors_[e];
  const int64_t chunk_limit =
      config_.prefill_chunk_tokens > 0 ? config_.prefill_chunk_tokens : config_.max_model_len;
  std::unordered_set<Request*> planned;

  // Phases 1 and 2, the running requests' rows: the batch planner (batch_planner.h).
  std::vector<Request*> preloading;  // reading their prefix from disk, layer by layer
  FillPlannerView(e, &preloading);
  PlannerInput& in = planner_view_;
  in.budgets = {config_.max_num_batched_tokens, config_.max_num_seqs, config_.max_prefill_tokens};
  in.chunk_limit = chunk_limit;
  in.chunked = config_.prefill_chunk_tokens > 0;
  in.freed = [this](int r) { return PreemptionFreesOf(planner_requests_[r]); };
  const PlannerOutput choice = PlanRunning(in);
  const std::vector<Request*>& requests = planner_requests_;

  struct PendingChunk {
    Sequence* seq;
    int64_t begin, end;
    bool ahead;  // the row of the token a plan in flight samples (kLastSampledToken)
  };
  std::vector<PendingChunk> chunks;
  auto add_chunk = [&](Sequence* seq, int64_t begin, int64_t end, bool ahead = false) {
    chunks.push_back({seq, begin, end, ahead});
    planned.insert(seq->request);
    // Requests stick to the compute node that runs them. One taken over from a node that
    // died has no state on this one: its setups go again (setup_sent is for its node).
    if (seq->request->executor != e) ForgetExecutor(seq->request);
    seq->request->executor = e;
  };
  // The planner counted on slots that the ledger does not have: a bug in its bound.
  auto shortfall = [&](const std::string& what) {
    LOG(ERROR) << what;
    absl::MutexLock lock(&stats_mu_);
    ++counters_.planner_shortfalls_total;
  };
  for (const PlannerAction& a : choice.actions) {
    Request* req = requests[a.request];
    switch (a.kind) {
      case PlannerAction::Kind::kPreempt: {
        const KvPool& kv = *pools_[req->pool->value()]->kv;
        const int64_t before = kv.available();
        Preempt(req);
        if (kv.available() - before < a.frees) {
          shortfall(absl::StrCat("preempting request ", req->id, " freed ", kv.available() - before,
                                 " slots; the planner counted on ", a.frees));
        }
        break;
      }
      case PlannerAction::Kind::kShare:
        ShareParentPrompt(req->seqs[a.seq].get(), req->Owner());
        break;
      case PlannerAction::Kind::kChunk: {
        Sequence* seq = req->seqs[a.seq].get();
        // The planner counts only what a preemption surely frees, so the slots are there.
        if (a.allocate > 0 && !pools_[req->pool->value()]->kv->Allocate(a.allocate, &seq->table)) {
          shortfall(absl::StrCat("the planner's slots for request ", req->id, " are not there"));
          break;
        }
        add_chunk(seq, a.begin, a.end, a.ahead);
        break;
      }
    }
  }

  // Layer-wise pre-loading: a request whose prefix is still being read from disk computes
  // its new tokens meanwhile, each layer waiting on the node for that layer of the load.
  // The read-ahead rule gives the lead the load needs for no layer to wait (preload_at).
  // The chunk joins this step if what is left of that lead, the most the step may then wait
  // for the disk, is at most half a decode step (a stall that costs the batch less than
  // deferring the chunk a whole step costs the request), or when nothing else is in the
  // step (waiting on the disk then delays nobody else). Otherwise it joins the first step
  // planned after the lead has passed.
  const absl::Time now = absl::Now();
  const absl::Duration stall_allowed = absl::Seconds(0.5 * clock_.compute_seconds());
  AdmissionLimits limits;
  limits.chunk_limit = chunk_limit;
  limits.chunked = config_.prefill_chunk_tokens > 0;
  // Fixed pipelining: each replica owns one batch, and staggering their steps hides one
  // batch's attention behind another's GEMMs only if the batches are alike. So a replica
  // admits no more than its share of the requests running and waiting; the rest wait for
  // the other replicas' next plans (at most a step away). Otherwise the first replica to
  // plan would take a whole burst of arrivals and the others would idle.
  if (const int64_t replicas = LiveReplicas();
      config_.pipelining == Pipelining::kFixed && replicas > 1) {
    const int64_t share =
        (static_cast<int64_t>(running_.size() + waiting_.size()) + replicas - 1) / replicas;
    int64_t own = 0;
    for (const Request* req : running_) own += req->executor == e ? 1 : 0;
    limits.admit_cap = share - own;
  }
  for (size_t p = 0; p < pools_.size(); ++p) {
    if (PoolServes(PoolIndex(p), e)) {
      limits.largest_pool = std::max(limits.largest_pool, pools_[p]->num_slots);
    }
  }
  Admission admission(choice.budgets, limits);
  auto preload = [&](Request* req) {
    Sequence* owner = req->Owner();
    if (!req->loading || req->load_ticket == 0 || req->preload_planned || owner == nullptr ||
        req->preempt_when_landed || req->pending_finish != FinishReason::kNone ||
        !PoolServes(req->pool, e) || (req->executor >= 0 && req->executor != e)) {
      return false;
    }
    const int64_t count =
        admission.PreloadRows(static_cast<int64_t>(owner->tokens.size()) - owner->computed,
                              static_cast<int64_t>(owner->table.size()) - owner->computed);
    if (count <= 0) return false;
    if (now + stall_allowed < req->preload_at && !chunks.empty()) {
      if (!preload_timer_set_) {
        preload_timer_set_ = true;
        // The timer's batch plans the idle compute nodes again.
        loop_.RunAfter(req->preload_at - now, [this] { preload_timer_set_ = false; });
      }
      return false;
    }
    add_chunk(owner, owner->computed, owner->computed + count);
    req->preload_planned = true;
    admission.Take(count);
    return true;
  };
  for (Request* req : preloading) preload(req);

  // Phase 3: admissions, in policy order, while the budget lasts (Admission). A request that
  // cannot be placed now stops admission (no overtaking under FIFO).
  std::vector<Request*> failed;
  // Placing a request takes it out of waiting_ (at index i); the rest stay where they are.
  for (size_t i = 0; i < waiting_.size(); ++i) {
    Request* req = waiting_[i];
    Sequence* owner = req->Owner();
    const int64_t length = owner ? static_cast<int64_t>(owner->tokens.size()) : 0;
    const Admission::Verdict verdict =
        admission.Consider(length, owner != nullptr, req->pending_finish != FinishReason::kNone);
    if (verdict == Admission::Verdict::kStop) break;
    if (verdict == Admission::Verdict::kSkip) continue;
    if (verdict == Admission::Verdict::kFail) {
      failed.push_back(req);
      continue;
    }
    if (!Place(req, e)) break;
    --i;  // Place took it out of waiting_: index i is now the next one
    // Its prefix is being read from disk into its slots: no row runs before that is done,
    // or (layer-wise) before each layer of it is.
    if (req->loading) {
      admission.AdmitLoading(preload(req));
      continue;
    }
    const int64_t count = admission.Admit(owner->computed, length);
    add_chunk(owner, owner->computed, owner->computed + count);
  }
  for (Request* req : failed) {
    FailRequest(req, FinishReason::kError,
                absl::ResourceExhaustedError("the request no longer fits in any live KV pool"));
  }

  // Releases alone, soon after a failed plan that carried them: they wait for the backoff
  // (or for a plan with rows, which takes them at once).
  if (chunks.empty() && !ex.pending_releases.empty() && absl::Now() < ex.release_retry_at) {
    if (ex.release_timer == 0) {
      // The timer's batch runs AfterBatch, which plans the idle compute nodes again.
      ex.release_timer =
          loop_.RunAt(ex.release_retry_at, [this, e] { executors_[e]->release_timer = 0; });
    }
    return false;
  }

  // Assemble the plan: setups, releases, slot extents and rows.
  plan->step_id = next_step_id_++;
  plan->epoch = config_.epoch;
  plan->releases = std::move(ex.pending_releases);
  ex.pending_releases.clear();
  std::unordered_set<Sequence*> setup_done;
  // What every setup of a sequence carries: its request's fixed data.
  auto new_setup = [](const Sequence* seq) {
    const Request* req = seq->request;
    RequestSetup setup;
    setup.request_id = seq->id;
    setup.sampling = req->spec.sampling;
    setup.prompt_len = req->prompt_len();
    setup.grammar = req->spec.grammar;
    return setup;
  };
  auto ensure_setup = [&](Sequence* seq) {
    if (seq->setup_sent || setup_done.count(seq)) return;
    Request* req = seq->request;
    RequestSetup setup = new_setup(seq);
    Sequence* owner = req->Owner();
    // A sample shares its owner's prompt counts while it has no outputs of its own; one set
    // up again later (another compute node, a replica that joined) carries its own history.
    if (seq != owner && owner != nullptr && seq->num_outputs == 0 &&
        (owner->setup_sent || setup_done.count(owner))) {
      setup.parent_request_id = owner->id;
    }
    if (seq->computed > 0 && setup.parent_request_id == SequenceId()) {
      setup.history.assign(seq->tokens.begin(), seq->tokens.begin() + seq->computed);
    }
    plan->setups.push_back(std::move(setup));
    setup_done.insert(seq);
  };
  auto ensure_assignment = [&](Sequence* seq) {
    Request* req = seq->request;
    if (static_cast<int64_t>(seq->table.size()) <= seq->table_sent) return;
    SlotAssignment a;
    a.request_id = seq->id;
    a.pool = *req->pool;
    a.start = static_cast<int32_t>(seq->table_sent);
    a.slots.assign(seq->table.begin() + seq->table_sent, seq->table.end());
    a.shifts = std::move(seq->shifts);  // context truncation: filled before any row runs
    seq->shifts.clear();
    plan->assignments.push_back(std::move(a));
    seq->table_sent = static_cast<int64_t>(seq->table.size());
  };
  // Owners before their samples, so that a sample's setup names a parent already set up.
  std::stable_sort(chunks.begin(), chunks.end(), [](const PendingChunk& a, const PendingChunk& b) {
    return std::make_pair(a.seq->request->id, a.seq->index) <
           std::make_pair(b.seq->request->id, b.seq->index);
  });
  for (const PendingChunk& c : chunks) {
    Sequence* seq = c.seq;
    Request* req = seq->request;
    ensure_setup(seq);
    ensure_assignment(seq);
    SequenceChunk chunk;
    chunk.request_id = seq->id;
    chunk.pool = *req->pool;
    chunk.start_position = static_cast<int32_t>(c.begin);
    if (req->loading) chunk.load_ticket = req->load_ticket;
    if (c.ahead) {
      chunk.tokens = {kLastSampledToken};
      const int64_t draw = seq->num_outputs + 1;  // the one after the draw in flight
      chunk.samples.push_back({seq->id, seq->index, draw, seq->output->banned_tokens_at(draw)});
      plan->chunks.push_back(std::move(chunk));
      continue;
    }
    chunk.tokens.assign(seq->tokens.begin() + c.begin, seq->tokens.begin() + c.end);
    if (c.end == static_cast<int64_t>(seq->tokens.size())) {
      chunk.samples.push_back(
          {seq->id, seq->index, seq->num_outputs, seq->output->banned_tokens()});
      // The owner's first draw is also every waiting sample's first draw.
      if (seq == req->Owner() && c.end == req->prompt_len()) {
        for (auto& other : req->seqs) {
          if (other.get() == seq || other->finished || !other->waiting_for_owner) continue;
          if (other->tokens.size() != static_cast<size_t>(req->prompt_len())) continue;
          RequestSetup setup = new_setup(other.get());
          setup.parent_request_id = seq->id;
          if (!other->setup_sent && !setup_done.count(other.get())) {
            plan->setups.push_back(std::move(setup));
            setup_done.insert(other.get());
          }
          chunk.samples.push_back({other->id, other->index, 0, other->output->banned_tokens()});
        }
      }
    }
    plan->chunks.push_back(std::move(chunk));
  }
  for (Sequence* seq : setup_done) seq->setup_sent = true;
  if (plan->chunks.empty() && plan->releases.empty()) return false;
  int64_t ahead_rows = 0;
  for (const PendingChunk& c : chunks) {
    ++c.seq->in_flight;
    c.seq->in_flight_samples = c.ahead || c.end == static_cast<int64_t>(c.seq->tokens.size());
    ahead_rows += c.ahead ? 1 : 0;
  }
  for (Request* req : planned) ++req->in_flight;
  if (ahead_rows > 0) {
    absl::MutexLock lock(&stats_mu_);
    counters_.async_rows_total += ahead_rows;
  }
  return true;
}

}  // namespace strata
