// Applying a step's result: tokens to their sequences, stops, failures of steps, nodes and
// pools, and the step clock. Building steps is in scheduler_plan.cc.
#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/stopwatch.h"
#include "server/scheduler.h"
#include "server/scheduler_internal.h"

namespace strata {
namespace {

// A request whose steps fail more often than this (not for a lost node) fails itself.
constexpr int kMaxStepFailures = 2;
// A release whose plans keep failing is sent again at most this many times in a row, then
// parked until one of the node's plans lands (Executor::parked_releases): a node that fails
// every plan does not get it for ever.
constexpr int kMaxReleaseResends = 3;

}  // namespace

void Scheduler::MarkPoolsDead(const std::vector<PoolIndex>& dead) {
  for (PoolIndex p : dead) {
    if (p.value() < pools_.size() && pools_[p.value()]->alive) {
      // Mark dead now, before the next step is built.
      SetPoolAliveNow(p, false, -1);
      if (pool_death_handler_) pool_death_handler_(p);
    }
  }
}

void Scheduler::OnStepResult(int executor, const StepPlan& plan, StepResult result,
                             absl::Time started) {
  // Requests that fail or finish below are erased only on the way out: by_id and involved
  // point into them.
  defer_removals_ = true;
  absl::Cleanup remove_deferred = [this] { RemoveDeferred(); };
  std::vector<Request*> involved;
  // Last of all (before the removals above), the finished sequences of this plan free
  // their KV, and requests with no plan left out land.
  absl::Cleanup land = [this, &involved] {
    for (Request* req : involved) Land(req);
  };
  Executor& ex = *executors_[executor];
  const absl::Time now = absl::Now();
  int64_t prefill_rows = 0;
  bool waited_on_disk = false;  // layer-wise pre-loading: its time holds the disk's
  for (const SequenceChunk& c : plan.chunks) {
    if (c.samples.empty() || c.tokens.size() > 1) prefill_rows += c.tokens.size();
    waited_on_disk = waited_on_disk || c.load_ticket != 0;
  }
  {
    absl::MutexLock lock(&stats_mu_);
    ++counters_.steps_total;
    counters_.prefill_rows_total += prefill_rows;
  }
  // How fast prompts compute, against which loading from disk is weighed.
  if (result.status.ok() && !waited_on_disk) {
    prefill_rate_.Observe(prefill_rows, absl::ToDoubleSeconds(now - started));
  }
  if (observer_.on_step) observer_.on_step(plan, result, now - started);
  if (result.status.ok()) {
    const bool decode_only = DecodeOnly(plan);
    // Under two and rotational the step's wall time holds other batches' work.
    const bool overlapped =
        (config_.pipelining == Pipelining::kTwo || config_.pipelining == Pipelining::kRotational) &&
        !ex.local_pool;
    clock_.Observe(now - started, result.timing, decode_only, overlapped);
    UpdateAdvice();
  }

  // Sequences of this step, by wire id.
  const std::unordered_map<SequenceId, Sequence*>& by_id = sequences_;
  std::unordered_set<Request*> seen;
  for (const SequenceChunk& c : plan.chunks) {
    auto it = by_id.find(c.request_id);
    if (it == by_id.end()) continue;
    if (it->second->in_flight > 0) --it->second->in_flight;
    Request* req = it->second->request;
    if (seen.insert(req).second) involved.push_back(req);
  }
  for (Request* req : involved) {
    if (req->in_flight > 0) --req->in_flight;
  }
  // On the way out, whether the step worked or failed (before its requests land):
  // cancellations and timeouts that arrived while it ran end their requests. Put back in the
  // queue instead, such a request would be skipped for its pending finish for ever.
  absl::Cleanup finish_pending = [this, &involved] {
    for (Request* req : involved) {
      if (req->state != Request::State::kDone) FinishPending(req);
    }
  };

  if (!result.status.ok()) {
    LOG(ERROR) << "step " << plan.step_id << " on " << ex.impl->name()
               << " failed: " << result.status;
    // A node that cannot be reached is out of service at once (before its heartbeats stop),
    // and its requests wait for another: losing the node is not their fault. Another node
    // carries the releases queued on it (HandOnReleases). So is one declared dead, whose
    // connection may still look fine (a hung node's).
    const bool lost = (result.node_unreachable && !ex.impl->Reachable()) || !ex.alive;
    if (lost && ex.reachable) {
      ex.reachable = false;
      LOG(WARNING) << "compute node " << ex.impl->name() << " is unreachable";
      HandOnReleases(executor);
    }
    // Its releases may never have reached the KV side (a failed plan may have reached some
    // of its memory nodes and not others): the next plan carries them again (a release is
    // idempotent), kMaxReleaseResends times, then after the next plan that lands. Each names
    // a table no sequence will use again: its sequence finished, left, or was preempted and
    // took a new id (Preempt).
    if (!plan.releases.empty()) {
      ex.release_retry_at =
          now + config_.release_retry_backoff * (1 << std::min(ex.release_failures++, 10));
    }
    for (const TableRelease& r : plan.releases) {
      if (++ex.release_resends[r.request_id] <= kMaxReleaseResends) {
        QueueRelease(executor, r);
      } else {
        LOG(WARNING) << "the release of sequence " << r.request_id.value() << " on "
                     << ex.impl->name() << " failed " << kMaxReleaseResends + 1
                     << " plans; it waits for one that lands";
        ex.release_resends.erase(r.request_id);
        ex.parked_releases.push_back(r);
      }
    }
    bool other_node = false;
    for (size_t e = 0; e < executors_.size(); ++e) {
      other_node = other_node || (static_cast<int>(e) != executor && executors_[e]->alive &&
                                  executors_[e]->reachable);
    }
    // A step that failed whole for a memory node that died does not count toward
    // kMaxStepFailures: its pools are marked dead first, so that the requests move, as
    // after a step that failed only their rows.
    // (A row ahead of a request whose row failed before is refused alone by the node, in
    // result.failed below: the plan's other rows run.)
    MarkPoolsDead(result.dead_pools);
    const bool not_theirs = !result.dead_pools.empty();
    for (Request* req : involved) {
      // Finished already (a stop seen before this plan came back), moved already (its pool
      // died above), or a failure that an earlier plan's explains: this plan's rows depended
      // on that plan's tokens.
      if (req->state != Request::State::kRunning || req->preempt_when_landed) continue;
      // Cancelled or timed out meanwhile: it ends on the way out instead of running again.
      if (req->pending_finish != FinishReason::kNone) continue;
      if (lost) {
        // Another node takes it; with none left it fails below, with the rest.
        // Preempt queues the releases of its old ids before it forgets the node.
        if (other_node) Preempt(req);
      } else if (!not_theirs && ++req->step_failures > kMaxStepFailures) {
        // The detail (node names, addresses) is in the log, not in the client's error.
        FailRequest(req, FinishReason::kError,
                    absl::InternalError(absl::StrCat("a compute node failed this request's step ",
                                                     req->step_failures, " times")));
      } else {
        Preempt(req);
      }
    }
    if (lost) {
      // Requests placed on the lost node look for another one. With none left, every request
      // fails (503) rather than wait for a node that may never return.
      std::vector<Request*> failing;
      for (auto& [id, req] : requests_) {
        if (req->state == Request::State::kDone || req->in_flight) continue;
        if (!other_node) {
          failing.push_back(req.get());
        } else if (req->executor == executor) {
          ForgetExecutor(req.get());
        }
      }
      for (Request* req : failing) {
        FailRequest(req, FinishReason::kError,
                    absl::UnavailableError("no compute node is available"));
      }
      PublishStats();
    }
    return;
  }
  for (const TableRelease& r : plan.releases) ex.release_resends.erase(r.request_id);
  ex.ClearReleaseBackoff();
  MarkPoolsDead(result.dead_pools);
  std::unordered_set<Request*> failed_now;
  for (const auto& [id, status] : result.failed) {
    auto it = by_id.find(id);
    if (it == by_id.end()) continue;
    Request* req = it->second->request;
    if (failed_now.insert(req).second) {
      // Already moved when its pool was declared dead above, or ended when its row before
      // this one failed (this row, ahead of it, was refused alone).
      if (req->state != Request::State::kRunning || req->preempt_when_landed) continue;
      const bool pool_dead =
          req->pool && std::find(result.dead_pools.begin(), result.dead_pools.end(), *req->pool) !=
                           result.dead_pools.end();
      bool other_alive = false;
      for (size_t p = 0; p < pools_.size(); ++p) {
        other_alive = other_alive || (pools_[p]->alive &&
                                      std::find(result.dead_pools.begin(), result.dead_pools.end(),
                                                PoolIndex(p)) == result.dead_pools.end());
      }
      if (pool_dead && other_alive) {
        ForgetLostKv(req);
        Preempt(req);  // re-prefill on another pool
      } else {
        FailRequest(req, FinishReason::kError, status);
      }
    }
  }

  for (const SequenceChunk& c : plan.chunks) {
    auto it = by_id.find(c.request_id);
    if (it == by_id.end()) continue;
    Sequence* seq = it->second;
    Request* req = seq->request;
    if (failed_now.count(req) || seq->finished || req->state != Request::State::kRunning ||
        req->preempt_when_landed) {
      continue;
    }
    seq->computed =
        std::max<int64_t>(seq->computed, c.start_position + static_cast<int64_t>(c.tokens.size()));
    RegisterBlocks(seq);
    // Context truncation: the step that moved KV from these blocks is back.
    if (seq->shifts.empty() && !seq->shift_sources.empty()) {
      {
        absl::MutexLock lock(&stats_mu_);
        counters_.context_moved_tokens_total +=
            static_cast<int64_t>(seq->shift_sources.size()) * config_.block_tokens;
      }
      DropShiftSources(seq);
    }
  }

  std::unordered_map<Request*, RequestUpdate> updates;
  for (const SampledToken& t : result.tokens) {
    auto it = by_id.find(t.request_id);
    if (it == by_id.end()) continue;
    Sequence* seq = it->second;
    Request* req = seq->request;
    if (seq->finished) {
      // Sampled by a row planned before the stop was known: never streamed nor billed.
      absl::MutexLock lock(&stats_mu_);
      ++counters_.discarded_tokens_total;
      continue;
    }
    if (failed_now.count(req) || req->state != Request::State::kRunning ||
        req->preempt_when_landed) {
      continue;
    }
    if (seq->waiting_for_owner) {
      Sequence* owner = req->Owner();
      if (owner == nullptr || owner == seq || owner->computed < req->prompt_len()) continue;
      ShareParentPrompt(seq, owner);
    }
    RequestUpdate& update = updates[req];
    update.request_id = req->id;
    SequenceUpdate* su = nullptr;
    for (auto& u : update.sequences) {
      if (u.index == seq->index) su = &u;
    }
    if (su == nullptr) {
      update.sequences.push_back({});
      su = &update.sequences.back();
      su->index = seq->index;
    }
    seq->tokens.push_back(t.token);
    ++seq->num_outputs;
    su->tokens.push_back(t.token);
    if (req->spec.sampling.num_logprobs >= 0) {
      su->logprobs.push_back({t.token, t.logprob, t.top_logprobs});
    }
    OutputProcessor::Delta delta = seq->output->Push(t.token);
    su->text += delta.text;
    if (req->first_token == absl::InfinitePast()) {
      req->first_token = now;
      if (observer_.on_first_token) {
        observer_.on_first_token(req->id, req->admitted - req->submitted, now - req->submitted);
      }
    } else if (seq->last_token_time != absl::InfinitePast() && observer_.on_inter_token) {
      observer_.on_inter_token(now - seq->last_token_time);
    }
    seq->last_token_time = now;
    {
      absl::MutexLock lock(&stats_mu_);
      ++counters_.generation_tokens_total;
    }
    if (delta.finish != FinishReason::kNone) {
      req->last_finish = delta.finish;
      FinishSequence(seq, delta.finish, &update, "");
      for (auto& u : update.sequences) {
        if (u.index == seq->index) u.stop_reason = delta.stop_reason;
      }
    }
  }
  for (auto& [req, update] : updates) {
    bool all_done = true;
    for (const auto& s : req->seqs) all_done = all_done && s->finished;
    update.finished = all_done;
    update.prompt_tokens = req->prompt_len();
    update.cached_prompt_tokens = req->cached_prompt_tokens;
    if (req->callback) req->callback(update);
    if (all_done) MaybeRemoveRequest(req);
  }
}

}  // namespace strata
