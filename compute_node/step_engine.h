// Executes step plans on a compute node: the core behind the ComputeNode gRPC service and
// the in-process executor of tests.
//
// For each plan: apply request setups and releases (the per-request sampling cache is
// rebuilt from plans, never kept elsewhere), hand slot assignments and rows to the
// attention backend, run the forward pass, and sample every target from the logits of the
// last row of its chunk. Penalty counts come from the rows themselves: prompt rows count as
// prompt tokens, later rows as outputs, so a recomputed request rebuilds them exactly.
//
// A one-token chunk may name its token as kLastSampledToken (common/protocol/step.h): the
// engine substitutes the token it sampled last for that sequence, if that token belongs at
// the chunk's position, and refuses the plan otherwise.
//
// A plan that cannot run (unknown request, token outside the vocabulary, no last sampled
// token for the position, position beyond the context, too many rows, a backend error)
// produces a StepResult with `status` set; the engine stays usable.
//
// Thread-safety: Execute is called from one thread at a time.
#ifndef STRATA_COMPUTE_NODE_STEP_ENGINE_H_
#define STRATA_COMPUTE_NODE_STEP_ENGINE_H_

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "common/protocol/step.h"
#include "compute_node/attention_backend.h"
#include "compute_node/model_runner.h"
#include "compute_node/sampler.h"

namespace strata {

struct StepEngineOptions {
  int64_t max_batch_rows = 2048;  // rows (tokens) per step
  int64_t max_positions = 4096;   // context length (RoPE table)
};

class StepEngine {
 public:
  // `runner` and `attention` must outlive the engine.
  StepEngine(const ModelRunner* runner, AttentionBackend* attention, StepEngineOptions options);

  StepResult Execute(const StepPlan& plan);

  size_t num_cached_requests() const { return requests_.size(); }
  uint64_t steps_executed() const { return steps_executed_; }

 private:
  struct RequestCache {
    SamplingParams sampling;
    int32_t prompt_len = 0;
    // Counts for penalties; the prompt's map is shared with n > 1 children.
    std::shared_ptr<std::unordered_map<int32_t, int32_t>> prompt_counts;
    std::unordered_map<int32_t, int32_t> output_counts;
    // The token this node sampled last for the sequence, and the position it belongs at;
    // what a kLastSampledToken row stands for.
    int32_t last_sampled = -1;
    int64_t last_sampled_position = -1;
  };

  const ModelRunner* runner_;
  AttentionBackend* attention_;
  StepEngineOptions options_;
  BatchBuffers buffers_;
  std::vector<float> logits_;
  std::unordered_map<SequenceId, RequestCache> requests_;
  uint64_t steps_executed_ = 0;
};

}  // namespace strata

#endif  // STRATA_COMPUTE_NODE_STEP_ENGINE_H_
