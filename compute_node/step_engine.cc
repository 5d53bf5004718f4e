#include "compute_node/step_engine.h"

#include <algorithm>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/stopwatch.h"

namespace strata {

struct StepEngine::Lane {
  Lane(AttentionBackend* a, const ModelConfig& config, int64_t rows)
      : attention(a), buffers(config, rows) {}
  AttentionBackend* attention;
  BatchBuffers buffers;
  std::vector<float> logits;
  // The plan in progress (the caller keeps it alive until Finish: sampled_chunks point
  // into it).
  bool busy = false;
  StepResult result;
  Stopwatch watch;
  uint64_t busy_us = 0;  // in this lane's stages (the other lane's are not its cost)
  StepKvPlan kv;
  std::vector<int32_t> tokens;
  std::vector<int32_t> last_rows;  // per chunk with samples
  std::vector<const SequenceChunk*> sampled_chunks;
  int64_t m = 0;
  int layer = 0;  // the layer whose attention is out
  bool forward_done = false;
  absl::Status status;
  // Sequences of the plan that fail alone: one that cannot follow its grammar (its rows
  // run), and one whose row asks for a token this node has not sampled (its row does not).
  std::vector<std::pair<SequenceId, absl::Status>> failed_alone;
  // Rotational pipelining: this replica's part of the plan (rotation.h).
  bool rotated = false;
  RotationRole role;
  int next_slice = 0;   // the next slice this replica runs
  bool samples = true;  // this replica runs the last slice
  absl::Time deadline;  // for the inputs of next_slice
};

StepEngine::StepEngine(const ModelRunner* runner, AttentionBackend* attention,
                       StepEngineOptions options)
    : StepEngine(runner, std::vector<AttentionBackend*>{attention}, options) {}

StepEngine::StepEngine(const ModelRunner* runner, std::vector<AttentionBackend*> lanes,
                       StepEngineOptions options)
    : runner_(runner), options_(options) {
  CHECK(!lanes.empty() && lanes.size() <= kMaxLanes)
      << "a step engine has 1 to " << kMaxLanes << " lanes";
  for (AttentionBackend* a : lanes) {
    if (options.trace != nullptr) {
      options.trace->NameTrack(static_cast<int>(lanes_.size()),
                               absl::StrCat("lane ", lanes_.size()));
    }
    lanes_.push_back(std::make_unique<Lane>(a, runner->config(), options.max_batch_rows));
  }
}

StepEngine::~StepEngine() = default;

bool StepEngine::lane_busy(int lane) const { return lanes_.at(lane)->busy; }

StepResult StepEngine::Execute(const StepPlan& plan) {
  if (std::optional<StepResult> done = Begin(0, plan)) return std::move(*done);
  while (!Advance(0)) {
  }
  return Finish(0);
}

std::optional<StepResult> StepEngine::Begin(int index, const StepPlan& plan) {
  Lane& lane = *lanes_.at(index);
  CHECK(!lane.busy) << "lane " << index << " already runs a plan";
  const Stopwatch stage;
  TraceSpan span(options_.trace, index,
                 options_.trace ? absl::StrCat("step ", plan.step_id, " begin") : "");
  if (std::optional<StepResult> refused = Prepare(lane, plan)) return refused;
  lane.busy = true;
  for (const auto& other : lanes_) {
    if (other.get() != &lane && other->busy) ++overlapped_steps_;
  }
  if (lane.m == 0) {
    // Nothing to compute, but releases and assignments must still reach the KV side.
    lane.status = lane.attention->BeginStep(lane.kv);
    lane.forward_done = true;
  } else {
    StartForward(lane);
  }
  lane.busy_us += stage.ElapsedMicros();
  if (!lane.forward_done) return std::nullopt;
  return Finish(index);
}

std::optional<StepResult> StepEngine::Prepare(Lane& lane, const StepPlan& plan) {
  lane.rotated = false;  // BeginRotated sets its own part once the plan is prepared
  lane.samples = true;
  lane.watch = Stopwatch();
  lane.busy_us = 0;
  lane.result = StepResult();
  lane.result.step_id = plan.step_id;
  lane.status = absl::OkStatus();
  lane.forward_done = false;
  StepResult& result = lane.result;
  const ModelConfig& config = runner_->config();

  // Releases first, then setups (a re-admitted request is released and set up again).
  for (const TableRelease& r : plan.releases) requests_.erase(r.request_id);
  for (const RequestSetup& s : plan.setups) {
    RequestCache cache;
    cache.sampling = s.sampling;
    cache.prompt_len = s.prompt_len;
    cache.parent = s.parent_request_id;
    if (s.parent_request_id != SequenceId()) {
      auto parent = requests_.find(s.parent_request_id);
      if (parent == requests_.end()) {
        result.status = absl::InvalidArgumentError(
            absl::StrCat("request ", s.request_id, " names unknown parent ", s.parent_request_id));
        return std::move(result);
      }
      cache.prompt_counts = parent->second.prompt_counts;
    } else {
      cache.prompt_counts = std::make_shared<std::unordered_map<int32_t, int32_t>>();
    }
    if (!s.grammar.empty()) {
      if (options_.grammar_vocabulary == nullptr) {
        cache.grammar_error = absl::FailedPreconditionError(
            "structured output needs the model's tokenizer on the compute node, and this one has "
            "none");
      } else if (auto g = grammars_.Get(s.grammar); !g.ok()) {
        cache.grammar_error = g.status();
      } else {
        cache.grammar =
            std::make_shared<SequenceGrammar>(*g, options_.grammar_vocabulary, cache.prompt_len);
        for (size_t i = cache.prompt_len; i < s.history.size() && cache.grammar_error.ok(); ++i) {
          cache.grammar_error = cache.grammar->Feed(s.history[i], static_cast<int64_t>(i));
        }
      }
    }
    if (cache.sampling.uses_penalties()) {
      for (size_t i = 0; i < s.history.size(); ++i) {
        if (static_cast<int32_t>(i) < cache.prompt_len) {
          ++(*cache.prompt_counts)[s.history[i]];
        } else {
          ++cache.output_counts[s.history[i]];
        }
      }
    }
    requests_[s.request_id] = std::move(cache);
  }

  // Rows, grouped by pool (stable), as the attention side expects.
  std::vector<const SequenceChunk*> chunks;
  for (const SequenceChunk& c : plan.chunks) chunks.push_back(&c);
  std::stable_sort(
      chunks.begin(), chunks.end(),
      [](const SequenceChunk* a, const SequenceChunk* b) { return a->pool < b->pool; });
  StepKvPlan& kv = lane.kv;
  kv = StepKvPlan();
  kv.step_id = plan.step_id;
  kv.releases = plan.releases;
  kv.assignments = plan.assignments;
  std::vector<int32_t>& tokens = lane.tokens;
  tokens.clear();
  lane.last_rows.clear();
  lane.sampled_chunks.clear();
  lane.failed_alone.clear();
  std::vector<const SequenceChunk*> kept;  // the chunks whose rows run
  for (const SequenceChunk* c : chunks) {
    if (!requests_.count(c->request_id)) {
      result.status = absl::InvalidArgumentError(
          absl::StrCat("chunk of request ", c->request_id, " before its setup"));
      return std::move(result);
    }
    // A chunk's logits sample for its own sequence, or for children of it (n > 1): never
    // another's (its draw, penalties, grammar and last sampled token would be this chunk's).
    for (const SampleTarget& t : c->samples) {
      auto target = requests_.find(t.request_id);
      if (t.request_id != c->request_id &&
          (target == requests_.end() || target->second.parent != c->request_id)) {
        result.status = absl::InvalidArgumentError(
            absl::StrCat("a chunk of request ", c->request_id, " samples for request ",
                         t.request_id, ", which is neither it nor a child of it"));
        return std::move(result);
      }
    }
    const int64_t end = static_cast<int64_t>(c->start_position) + c->tokens.size();
    if (end > options_.max_positions) {
      result.status = absl::InvalidArgumentError(
          absl::StrCat("request ", c->request_id, " reaches position ", end,
                       " beyond the context of ", options_.max_positions));
      return std::move(result);
    }
    // A row ahead whose token was never sampled here: the row before it failed (its memory
    // node died, or the whole step failed). That sequence alone fails, taking no slots; the
    // others' rows run, and their KV stays where it is.
    if (c->tokens.size() == 1 && c->tokens[0] == kLastSampledToken &&
        requests_.at(c->request_id).last_sampled_position != c->start_position) {
      lane.failed_alone.emplace_back(
          c->request_id, absl::FailedPreconditionError(absl::StrCat(
                             "request ", c->request_id, " asks for the token sampled for position ",
                             c->start_position, ", which this node has not sampled")));
      std::erase_if(kv.assignments,
                    [&](const SlotAssignment& a) { return a.request_id == c->request_id; });
      continue;
    }
    kept.push_back(c);
    for (size_t i = 0; i < c->tokens.size(); ++i) {
      int32_t t = c->tokens[i];
      if (t == kLastSampledToken) {
        if (c->tokens.size() != 1) {
          result.status = absl::InvalidArgumentError(
              absl::StrCat("request ", c->request_id,
                           ": the last sampled token stands only in a one-row chunk"));
          return std::move(result);
        }
        t = requests_.at(c->request_id).last_sampled;
      }
      if (t < 0 || t >= config.vocab_size) {
        result.status = absl::InvalidArgumentError(
            absl::StrCat("request ", c->request_id, " has token ", t, " outside the vocabulary of ",
                         config.vocab_size));
        return std::move(result);
      }
      kv.rows.push_back({c->request_id, c->pool, c->start_position + static_cast<int32_t>(i), -1});
      tokens.push_back(t);
    }
    if (c->load_ticket != 0) kv.loads.push_back({c->request_id, c->pool, c->load_ticket});
    if (!c->samples.empty()) {
      lane.last_rows.push_back(static_cast<int32_t>(tokens.size()) - 1);
      lane.sampled_chunks.push_back(c);
    }
  }
  chunks.swap(kept);
  const int64_t m = static_cast<int64_t>(tokens.size());
  if (m > options_.max_batch_rows) {
    result.status = absl::InvalidArgumentError(
        absl::StrCat("step has ", m, " rows; this node takes at most ", options_.max_batch_rows));
    return std::move(result);
  }
  lane.m = m;
  result.timing.rows = m;

  // Penalty counts from the rows (tokens as resolved), before sampling (a decode row feeds
  // back the previous output, which the next draw must see).
  size_t row = 0;
  for (const SequenceChunk* c : chunks) {
    RequestCache& cache = requests_[c->request_id];
    const size_t first = row;
    row += c->tokens.size();
    if (cache.grammar) {
      for (size_t i = 0; i < c->tokens.size() && cache.grammar_error.ok(); ++i) {
        const int64_t position = c->start_position + static_cast<int64_t>(i);
        if (position >= cache.prompt_len) {
          cache.grammar_error = cache.grammar->Feed(tokens[first + i], position);
        }
      }
    }
    if (!cache.grammar_error.ok())
      lane.failed_alone.emplace_back(c->request_id, cache.grammar_error);
    if (!cache.sampling.uses_penalties()) continue;
    for (size_t i = 0; i < c->tokens.size(); ++i) {
      if (c->start_position + static_cast<int32_t>(i) < cache.prompt_len) {
        ++(*cache.prompt_counts)[tokens[first + i]];
      } else {
        ++cache.output_counts[tokens[first + i]];
      }
    }
  }
  return std::nullopt;
}

void StepEngine::StartForward(Lane& lane) {
  BatchBuffers& b = lane.buffers;
  const int64_t m = lane.m;
  absl::Status status = lane.attention->BeginStep(lane.kv);
  if (!status.ok()) return EndForward(lane, std::move(status));
  std::vector<int32_t> positions(m);
  for (int64_t r = 0; r < m; ++r) positions[r] = lane.kv.rows[r].position;
  runner_->Embed(b, m, lane.tokens.data(), positions.data());
  lane.layer = 0;
  runner_->PreAttention(b, m, 0);
  status = lane.attention->SendLayer(0, b, m);
  if (!status.ok()) return EndForward(lane, std::move(status));
}

void StepEngine::EndForward(Lane& lane, absl::Status status) {
  // A rotated lane that gives up may still have answers registered into its buffers.
  if (!status.ok() && lane.rotated) {
    lane.attention->Abandon();
    PassFailureOn(lane, status);
  }
  lane.status = std::move(status);
  lane.forward_done = true;
}

bool StepEngine::Advance(int index) {
  Lane& lane = *lanes_.at(index);
  CHECK(lane.busy) << "lane " << index << " runs no plan";
  if (lane.forward_done) return true;
  const Stopwatch stage;
  BatchBuffers& b = lane.buffers;
  const int64_t m = lane.m;
  absl::Status status;
  {
    TraceSpan span(options_.trace, index, options_.trace ? absl::StrCat("wait L", lane.layer) : "");
    status = lane.attention->WaitLayer(lane.layer, b, m);
  }
  TraceSpan span(
      options_.trace, index,
      options_.trace ? absl::StrCat("step ", lane.result.step_id, " L", lane.layer) : "");
  if (!status.ok()) {
    EndForward(lane, std::move(status));
  } else {
    runner_->PostAttention(b, m, lane.layer);
    if (++lane.layer == static_cast<int>(runner_->config().num_layers)) {
      EndForward(lane, absl::OkStatus());
    } else {
      runner_->PreAttention(b, m, lane.layer);
      status = lane.attention->SendLayer(lane.layer, b, m);
      if (!status.ok()) EndForward(lane, std::move(status));
    }
  }
  lane.busy_us += stage.ElapsedMicros();
  return lane.forward_done;
}

StepResult StepEngine::Finish(int index) {
  Lane& lane = *lanes_.at(index);
  CHECK(lane.busy && lane.forward_done) << "lane " << index << " has no finished forward pass";
  lane.busy = false;
  const Stopwatch stage;
  TraceSpan span(options_.trace, index,
                 options_.trace ? absl::StrCat("step ", lane.result.step_id, " sample") : "");
  StepResult result = std::move(lane.result);
  lane.result = StepResult();
  const ModelConfig& config = runner_->config();
  AttentionStepOutcome outcome = lane.attention->EndStep();
  result.timing.attention_us = outcome.wait_us;
  result.timing.bytes_sent = outcome.bytes_sent;
  result.timing.bytes_received = outcome.bytes_received;
  result.dead_pools = outcome.dead_pools;
  result.failed = outcome.failed;
  result.failed.insert(result.failed.end(), lane.failed_alone.begin(), lane.failed_alone.end());
  lane.failed_alone.clear();
  if (lane.rotated) lane.role.exchange->Retire(lane.role.batch, result.step_id);
  if (!lane.status.ok()) {
    result.status = std::move(lane.status);
    lane.status = absl::OkStatus();
    return result;
  }
  if (!lane.samples) {
    // Another replica runs this batch's last slice and samples it.
    result.timing.total_us = lane.watch.ElapsedMicros();
    lane.busy_us += stage.ElapsedMicros();
    result.timing.gemm_us =
        lane.busy_us > result.timing.attention_us ? lane.busy_us - result.timing.attention_us : 0;
    ++steps_executed_;
    return result;
  }
  std::unordered_set<SequenceId> failed;
  for (const auto& [id, why] : result.failed) failed.insert(id);
  const Stopwatch sample_watch;
  const std::vector<int32_t>& last_rows = lane.last_rows;
  const std::vector<const SequenceChunk*>& sampled_chunks = lane.sampled_chunks;
  if (!last_rows.empty()) {
    const int64_t vocab = config.vocab_size;
    lane.logits.resize(RowsCapacity(last_rows.size()) * vocab);
    runner_->Logits(lane.buffers, last_rows, lane.logits.data());
    struct Job {
      size_t chunk;
      const SampleTarget* target;
    };
    std::vector<Job> jobs;
    for (size_t i = 0; i < sampled_chunks.size(); ++i) {
      if (failed.count(sampled_chunks[i]->request_id)) continue;  // its attention was lost
      for (const SampleTarget& t : sampled_chunks[i]->samples) {
        if (!failed.count(t.request_id)) jobs.push_back({i, &t});
      }
    }
    result.tokens.resize(jobs.size());
    for (const Job& job : jobs) {
      if (!requests_.count(job.target->request_id)) {
        result.status = absl::InvalidArgumentError(
            absl::StrCat("sample target ", job.target->request_id, " has no setup"));
        result.tokens.clear();
        return result;
      }
    }
    const float* logits = lane.logits.data();
    std::vector<absl::Status> grammar_errors(jobs.size());
#pragma omp parallel for schedule(dynamic, 1) if (jobs.size() > 1)
    for (size_t j = 0; j < jobs.size(); ++j) {
      const Job& job = jobs[j];
      const RequestCache& cache = requests_.at(job.target->request_id);
      SampleInput input;
      input.params = &cache.sampling;
      input.sample_index = job.target->sample_index;
      input.output_position = job.target->output_position;
      input.prompt_counts = cache.prompt_counts.get();
      input.output_counts = &cache.output_counts;
      input.banned = &job.target->banned_tokens;
      const SequenceChunk& chunk = *sampled_chunks[job.chunk];
      absl::StatusOr<TokenMask> allowed;
      if (cache.grammar) {
        allowed = cache.grammar->Allowed(chunk.start_position +
                                         static_cast<int64_t>(chunk.tokens.size()));
        if (!allowed.ok()) {
          grammar_errors[j] = allowed.status();
          continue;
        }
        input.allowed = allowed->get();
      }
      SampleOutput out = Sample(logits + job.chunk * vocab, static_cast<int32_t>(vocab), input);
      result.tokens[j] = {job.target->request_id, out.token, out.logprob,
                          std::move(out.top_logprobs)};
    }
    // Draws whose grammar state was lost fail alone; the others feed their grammar.
    std::vector<SampledToken> kept;
    std::vector<Job> kept_jobs;
    for (size_t j = 0; j < jobs.size(); ++j) {
      const SequenceId id = jobs[j].target->request_id;
      RequestCache& cache = requests_.at(id);
      const SequenceChunk& c = *sampled_chunks[jobs[j].chunk];
      absl::Status status = grammar_errors[j];
      if (status.ok() && cache.grammar) {
        status = cache.grammar->Feed(result.tokens[j].token,
                                     c.start_position + static_cast<int64_t>(c.tokens.size()));
      }
      if (!status.ok()) {
        cache.grammar_error = status;
        result.failed.emplace_back(id, status);
        continue;
      }
      kept.push_back(std::move(result.tokens[j]));
      kept_jobs.push_back(jobs[j]);
    }
    result.tokens = std::move(kept);
    jobs = std::move(kept_jobs);
    // What a later kLastSampledToken row of each target stands for: the token of the
    // position after its chunk.
    for (size_t j = 0; j < jobs.size(); ++j) {
      const SequenceChunk& c = *sampled_chunks[jobs[j].chunk];
      RequestCache& cache = requests_.at(jobs[j].target->request_id);
      cache.last_sampled = result.tokens[j].token;
      cache.last_sampled_position = c.start_position + static_cast<int64_t>(c.tokens.size());
    }
  }
  result.timing.sample_us = sample_watch.ElapsedMicros();
  result.timing.total_us = lane.watch.ElapsedMicros();
  lane.busy_us += stage.ElapsedMicros();
  // The rest of the lane's own work: GEMMs, norms, RoPE, and local attention when
  // co-located. With two lanes the step's wall time (total_us) also holds the other lane's
  // stages.
  const uint64_t other = result.timing.attention_us + result.timing.sample_us;
  result.timing.gemm_us = lane.busy_us > other ? lane.busy_us - other : 0;
  ++steps_executed_;
  return result;
}

std::optional<StepResult> StepEngine::BeginRotated(int index, const StepPlan& plan,
                                                   const RotationRole& role) {
  Lane& lane = *lanes_.at(index);
  CHECK(!lane.busy) << "lane " << index << " already runs a plan";
  const Stopwatch stage;
  TraceSpan span(options_.trace, index,
                 options_.trace ? absl::StrCat("step ", plan.step_id, " begin") : "");
  if (role.num_replicas() < 2 || role.replica < 0 || role.replica >= role.num_replicas() ||
      role.batch < 0 || role.exchange == nullptr) {
    StepResult refused;
    refused.step_id = plan.step_id;
    refused.status = absl::InvalidArgumentError(
        absl::StrCat("step ", plan.step_id, ": rotation of replica ", role.replica, " of ",
                     role.num_replicas(), ", batch ", role.batch, " is not one this node runs"));
    return refused;
  }
  for (const SequenceChunk& c : plan.chunks) {
    for (int32_t t : c.tokens) {
      if (t != kLastSampledToken) continue;
      StepResult refused;
      refused.step_id = plan.step_id;
      refused.status = absl::InvalidArgumentError(
          "a rotated plan names its tokens: another replica may have sampled the last one");
      return refused;
    }
  }
  if (std::optional<StepResult> refused = Prepare(lane, plan)) return refused;
  const int layers = static_cast<int>(runner_->config().num_layers);
  const int r = role.num_replicas();
  lane.rotated = true;
  lane.role = role;
  lane.samples = role.ReplicaOf(layers) == role.replica;
  lane.busy = true;
  // This replica's first slice: the smallest k with (batch + k) mod R == replica.
  lane.next_slice = ((role.replica - role.batch) % r + r) % r;
  const bool first = lane.next_slice == 0;
  absl::Status status =
      lane.attention->BeginRoutedStep(lane.kv, /*send_descriptors=*/first, role.EndpointOf(1));
  if (!status.ok() || lane.m == 0) {
    EndForward(lane, std::move(status));
  } else {
    for (int64_t row = 0; row < lane.m; ++row)
      lane.buffers.positions[row] = lane.kv.rows[row].position;
    if (first) {
      BatchBuffers& b = lane.buffers;
      runner_->Embed(b, lane.m, lane.tokens.data(), lane.buffers.positions.data());
      runner_->PreAttention(b, lane.m, 0);
      HandOff(lane, 0);
    } else {
      HandOff(lane, -1);
    }
  }
  lane.busy_us += stage.ElapsedMicros();
  if (!lane.forward_done) return std::nullopt;
  return Finish(index);
}

void StepEngine::HandOff(Lane& lane, int k) {
  const RotationRole& role = lane.role;
  const int layers = static_cast<int>(runner_->config().num_layers);
  if (k >= 0) {
    // Layer k's answers and the residual rows go to the replica of slice k + 1.
    // Pools whose memory nodes failed the step get no frames (SendLayerTo) and are named in
    // the context, so that the replica after this one expects no answers from them.
    absl::Status status =
        lane.attention->SendLayerTo(k, lane.buffers, lane.m, role.EndpointOf(k + 1));
    if (status.ok()) {
      status = role.exchange->Send(role.AddressOf(k + 1), lane.result.step_id, k + 1, role.batch,
                                   lane.buffers.x.data(), lane.m, lane.attention->FailedPools());
    }
    if (!status.ok()) return EndForward(lane, std::move(status));
    lane.next_slice = k + role.num_replicas();
  }
  if (lane.next_slice > layers) return EndForward(lane, absl::OkStatus());  // share over
  // The inputs of the next slice: layer next-1's answers, and the context.
  absl::Status status = lane.attention->ExpectLayer(lane.next_slice - 1, lane.buffers, lane.m);
  if (!status.ok()) return EndForward(lane, std::move(status));
  lane.deadline = absl::Now() + role.handoff_timeout;
}

void StepEngine::PassFailureOn(const Lane& lane, const absl::Status& why) {
  const int k = lane.next_slice + 1;
  if (k > static_cast<int>(runner_->config().num_layers)) return;  // nobody waits for it
  const RotationRole& role = lane.role;
  const absl::Status sent =
      role.exchange->SendFailure(role.AddressOf(k), lane.result.step_id, k, role.batch, why);
  LOG_IF(WARNING, !sent.ok()) << "step " << lane.result.step_id << ": could not tell the replica "
                              << "of slice " << k << " that this one gave up: " << sent;
}

bool StepEngine::RotationReady(int index) const {
  const Lane& lane = *lanes_.at(index);
  if (!lane.busy || !lane.rotated) return false;
  if (lane.forward_done) return true;
  if (absl::Now() >= lane.deadline) return true;
  const ContextExchange& exchange = *lane.role.exchange;
  const int batch = lane.role.batch;
  // A failure in place of the context, or the replica that owes it gone: the answers still
  // out will not be needed.
  if (exchange.FailureArrived(batch, lane.result.step_id, lane.next_slice)) return true;
  // A context that names failed pools: their answers will not come (AdvanceRotated stops
  // expecting them, then waits for the others').
  if (exchange.ArrivedWithFailedPools(batch, lane.result.step_id, lane.next_slice)) return true;
  // The replica before is gone: its context, or the answers its layer frames asked the
  // memory nodes for, may never come (one that hung may have handed the context over with
  // its frames still queued on it). AdvanceRotated goes on only with both.
  if (exchange.Departed(lane.role.AddressOf(lane.next_slice - 1), lane.result.step_id)) {
    return true;
  }
  return lane.attention->LayerSettled() &&
         exchange.Arrived(batch, lane.result.step_id, lane.next_slice);
}

absl::Time StepEngine::RotationDeadline(int index) const {
  const Lane& lane = *lanes_.at(index);
  if (!lane.busy || !lane.rotated || lane.forward_done) return absl::InfiniteFuture();
  // The layer's own deadline may come first: the answers a hung memory node owes are given
  // up at it, while the context may take until the hand-off deadline. Once it has passed,
  // the context's arrival wakes the driver (ContextExchangeOptions::on_arrival).
  const absl::Time layer = lane.attention->LayerDeadline();
  return layer > absl::Now() ? std::min(lane.deadline, layer) : lane.deadline;
}

bool StepEngine::AdvanceRotated(int index) {
  Lane& lane = *lanes_.at(index);
  CHECK(lane.busy && lane.rotated) << "lane " << index << " runs no rotated plan";
  if (lane.forward_done) return true;
  const Stopwatch stage;
  const int k = lane.next_slice;
  const int layers = static_cast<int>(runner_->config().num_layers);
  const RotationRole& role = lane.role;
  TraceSpan span(options_.trace, index,
                 options_.trace ? absl::StrCat("step ", lane.result.step_id, " slice ", k) : "");
  BatchBuffers& b = lane.buffers;
  ContextExchange::Taken taken;
  absl::Status status =
      role.exchange->Take(role.batch, lane.result.step_id, k, b.x.data(), lane.m, &taken);
  if (status.ok()) lane.attention->ContextArrivedAt(taken.arrived);
  const std::string& from = role.AddressOf(k - 1);
  if (absl::IsNotFound(status)) {
    status = role.exchange->Departed(from, lane.result.step_id)
                 ? absl::UnavailableError(absl::StrCat(
                       "step ", lane.result.step_id, ": the replica at ", from,
                       " is gone: it will not hand over slice ", k, " of batch ", role.batch))
                 : absl::DeadlineExceededError(
                       absl::StrCat("step ", lane.result.step_id, ": the replica at ", from,
                                    " did not hand over slice ", k, " of batch ", role.batch,
                                    " within ", absl::FormatDuration(role.handoff_timeout)));
  }
  // Its context came, but the replica is gone with answers still out: they may never come
  // (its layer frames may not have left it), and waiting for them would hold the driver
  // until the layer deadline.
  if (status.ok() && !lane.attention->LayerSettled() &&
      role.exchange->Departed(from, lane.result.step_id)) {
    status = absl::UnavailableError(absl::StrCat("step ", lane.result.step_id, ": the replica at ",
                                                 from, " is gone: the answers of layer ", k - 1,
                                                 " that it asked for may not come"));
  }
  // Memory nodes that failed the step on a replica before this one: their rows go on with
  // zero attention and fail alone (in the result's failed), as where this replica finds a
  // memory node failed itself (WaitLayer); the rest of the step goes on.
  if (status.ok() && !taken.failed_pools.empty()) {
    lane.attention->FailPools(
        taken.failed_pools,
        absl::UnavailableError(absl::StrCat("the memory node failed the step on the replica at ",
                                            from, " or before it")));
  }
  if (status.ok()) status = lane.attention->WaitLayer(k - 1, b, lane.m);
  if (!status.ok()) {
    EndForward(lane, std::move(status));
  } else {
    runner_->PostAttention(b, lane.m, k - 1);
    if (k == layers) {
      EndForward(lane, absl::OkStatus());  // Finish takes the logits and samples
    } else {
      runner_->PreAttention(b, lane.m, k);
      HandOff(lane, k);
    }
  }
  lane.busy_us += stage.ElapsedMicros();
  return lane.forward_done;
}

}  // namespace strata
