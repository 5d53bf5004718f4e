// Token sampling on the compute node, row by row.
//
// Order of operations, as in vLLM: logit_bias and banned tokens; the grammar's mask
// (structured output); repetition penalty (over
// prompt and output tokens); frequency and presence penalties (over output tokens); then
// greedy argmax when temperature is 0, else temperature, top-k, top-p, min-p and a draw.
//
// The draw uses a counter-based generator keyed by (seed, sample index, output position),
// never by call order, so a seeded request samples the same tokens whatever batch it runs
// in, after preemption and on another replica. Logprobs are those of the raw model
// distribution (log-softmax of the unprocessed logits), as vLLM reports by default.
//
// Thread-safety: Sample is a pure function of its arguments.
#ifndef STRATA_COMPUTE_NODE_SAMPLER_H_
#define STRATA_COMPUTE_NODE_SAMPLER_H_

#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/protocol/sampling_params.h"

namespace strata {

// What a row's sampling may look at besides its logits.
struct SampleInput {
  const SamplingParams* params = nullptr;
  uint64_t sample_index = 0;    // which of the request's n samples
  int64_t output_position = 0;  // index of the token being drawn among the outputs
  // Token counts for penalties (may be null when no penalty is set).
  const std::unordered_map<int32_t, int32_t>* prompt_counts = nullptr;
  const std::unordered_map<int32_t, int32_t>* output_counts = nullptr;
  // Tokens that may not be drawn (e.g. EOS before min_tokens).
  const std::vector<int32_t>* banned = nullptr;
  // Structured output: a bitmask (bit t of word t / 64) of the tokens the grammar allows;
  // null for no grammar. It applies before everything else and wins over `banned`.
  const std::vector<uint64_t>* allowed = nullptr;
};

struct SampleOutput {
  int32_t token = -1;
  float logprob = 0.0f;                                 // raw logprob of `token`
  std::vector<std::pair<int32_t, float>> top_logprobs;  // best first, ties by lower id
};

SampleOutput Sample(const float* logits, int32_t vocab_size, const SampleInput& input);

// The uniform [0, 1) draw for (seed, sample index, output position).
double CounterUniform(uint64_t seed, uint64_t sample_index, uint64_t position);

}  // namespace strata

#endif  // STRATA_COMPUTE_NODE_SAMPLER_H_
