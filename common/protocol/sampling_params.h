// Per-request sampling parameters, as the API accepts them and the compute node applies
// them (compute_node/sampler.h documents the order of operations).
#ifndef STRATA_COMMON_PROTOCOL_SAMPLING_PARAMS_H_
#define STRATA_COMMON_PROTOCOL_SAMPLING_PARAMS_H_

#include <cstdint>
#include <utility>
#include <vector>

namespace strata {

struct SamplingParams {
  float temperature = 1.0f;  // < 1e-5: greedy
  float top_p = 1.0f;        // (0, 1]
  int32_t top_k = 0;         // <= 0: all tokens
  float min_p = 0.0f;        // [0, 1]
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;                    // > 0; 1 = off
  std::vector<std::pair<int32_t, float>> logit_bias;  // sorted by token
  uint64_t seed = 0;
  int32_t num_logprobs = -1;  // -1: none; 0: the sampled token's; k: plus the top k

  bool greedy() const { return temperature < 1e-5f; }
  bool uses_penalties() const {
    return presence_penalty != 0.0f || frequency_penalty != 0.0f || repetition_penalty != 1.0f;
  }
};

}  // namespace strata

#endif  // STRATA_COMMON_PROTOCOL_SAMPLING_PARAMS_H_
