#include "compute_node/step_engine.h"

#include <algorithm>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "common/base/stopwatch.h"

namespace strata {

StepEngine::StepEngine(const ModelRunner* runner, AttentionBackend* attention,
                       StepEngineOptions options)
    : runner_(runner),
      attention_(attention),
      options_(options),
      buffers_(runner->config(), options.max_batch_rows) {}

StepResult StepEngine::Execute(const StepPlan& plan) {
  const Stopwatch watch;
  StepResult result;
  result.step_id = plan.step_id;
  const ModelConfig& config = runner_->config();

  // Releases first, then setups (a re-admitted request is released and set up again).
  for (const TableRelease& r : plan.releases) requests_.erase(r.request_id);
  for (const RequestSetup& s : plan.setups) {
    RequestCache cache;
    cache.sampling = s.sampling;
    cache.prompt_len = s.prompt_len;
    if (s.parent_request_id != SequenceId()) {
      auto parent = requests_.find(s.parent_request_id);
      if (parent == requests_.end()) {
        result.status = absl::InvalidArgumentError(
            absl::StrCat("request ", s.request_id, " names unknown parent ", s.parent_request_id));
        return result;
      }
      cache.prompt_counts = parent->second.prompt_counts;
    } else {
      cache.prompt_counts = std::make_shared<std::unordered_map<int32_t, int32_t>>();
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
  StepKvPlan kv;
  kv.step_id = plan.step_id;
  kv.releases = plan.releases;
  kv.assignments = plan.assignments;
  std::vector<int32_t> tokens;
  std::vector<int32_t> last_rows;  // per chunk with samples
  std::vector<const SequenceChunk*> sampled_chunks;
  for (const SequenceChunk* c : chunks) {
    if (!requests_.count(c->request_id)) {
      result.status = absl::InvalidArgumentError(
          absl::StrCat("chunk of request ", c->request_id, " before its setup"));
      return result;
    }
    const int64_t end = static_cast<int64_t>(c->start_position) + c->tokens.size();
    if (end > options_.max_positions) {
      result.status = absl::InvalidArgumentError(
          absl::StrCat("request ", c->request_id, " reaches position ", end,
                       " beyond the context of ", options_.max_positions));
      return result;
    }
    for (size_t i = 0; i < c->tokens.size(); ++i) {
      int32_t t = c->tokens[i];
      if (t == kLastSampledToken) {
        const RequestCache& cache = requests_.at(c->request_id);
        if (c->tokens.size() != 1) {
          result.status = absl::InvalidArgumentError(
              absl::StrCat("request ", c->request_id,
                           ": the last sampled token stands only in a one-row chunk"));
          return result;
        }
        if (cache.last_sampled_position != c->start_position) {
          result.status = absl::FailedPreconditionError(
              absl::StrCat("request ", c->request_id, " asks for the token sampled for position ",
                           c->start_position, ", which this node has not sampled"));
          return result;
        }
        t = cache.last_sampled;
      }
      if (t < 0 || t >= config.vocab_size) {
        result.status = absl::InvalidArgumentError(
            absl::StrCat("request ", c->request_id, " has token ", t, " outside the vocabulary of ",
                         config.vocab_size));
        return result;
      }
      kv.rows.push_back({c->request_id, c->pool, c->start_position + static_cast<int32_t>(i), -1});
      tokens.push_back(t);
    }
    if (!c->samples.empty()) {
      last_rows.push_back(static_cast<int32_t>(tokens.size()) - 1);
      sampled_chunks.push_back(c);
    }
  }
  const int64_t m = static_cast<int64_t>(tokens.size());
  if (m > options_.max_batch_rows) {
    result.status = absl::InvalidArgumentError(
        absl::StrCat("step has ", m, " rows; this node takes at most ", options_.max_batch_rows));
    return result;
  }
  result.timing.rows = m;

  // Penalty counts from the rows (tokens as resolved), before sampling (a decode row feeds
  // back the previous output, which the next draw must see).
  size_t row = 0;
  for (const SequenceChunk* c : chunks) {
    RequestCache& cache = requests_[c->request_id];
    const size_t first = row;
    row += c->tokens.size();
    if (!cache.sampling.uses_penalties()) continue;
    for (size_t i = 0; i < c->tokens.size(); ++i) {
      if (c->start_position + static_cast<int32_t>(i) < cache.prompt_len) {
        ++(*cache.prompt_counts)[tokens[first + i]];
      } else {
        ++cache.output_counts[tokens[first + i]];
      }
    }
  }

  absl::Status status = m > 0 ? ForwardLayers(*runner_, *attention_, buffers_, kv, tokens.data())
                              // Nothing to compute, but releases and assignments must still
                              // reach the KV side.
                              : attention_->BeginStep(kv);
  AttentionStepOutcome outcome = attention_->EndStep();
  result.timing.attention_us = outcome.wait_us;
  result.timing.bytes_sent = outcome.bytes_sent;
  result.timing.bytes_received = outcome.bytes_received;
  result.dead_pools = outcome.dead_pools;
  result.failed = outcome.failed;
  if (!status.ok()) {
    result.status = std::move(status);
    return result;
  }
  std::unordered_set<SequenceId> failed;
  for (const auto& [id, why] : result.failed) failed.insert(id);
  const Stopwatch sample_watch;
  if (!last_rows.empty()) {
    const int64_t vocab = config.vocab_size;
    logits_.resize(RowsCapacity(last_rows.size()) * vocab);
    runner_->Logits(buffers_, last_rows, logits_.data());
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
        return result;
      }
    }
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
      SampleOutput out =
          Sample(logits_.data() + job.chunk * vocab, static_cast<int32_t>(vocab), input);
      result.tokens[j] = {job.target->request_id, out.token, out.logprob,
                          std::move(out.top_logprobs)};
    }
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
  result.timing.total_us = watch.ElapsedMicros();
  // The rest of the step: GEMMs, norms, RoPE, and local attention when co-located.
  const uint64_t other = result.timing.attention_us + result.timing.sample_us;
  result.timing.gemm_us = result.timing.total_us > other ? result.timing.total_us - other : 0;
  ++steps_executed_;
  return result;
}

}  // namespace strata
