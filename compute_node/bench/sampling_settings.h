// The sampling settings clients use, for the benchmarks that time a draw (sampler_bench,
// step_profile): greedy; temperature 1 (the OpenAI API's default); temperature 0.8 with
// top_p 0.95; llama.cpp's server defaults (top_k 40, top_p 0.95, min_p 0.05); greedy with
// 5 logprobs.
#ifndef STRATA_COMPUTE_NODE_BENCH_SAMPLING_SETTINGS_H_
#define STRATA_COMPUTE_NODE_BENCH_SAMPLING_SETTINGS_H_

#include <vector>

#include "common/protocol/sampling_params.h"

namespace strata {

struct SamplingSetting {
  const char* name;
  SamplingParams params;
};

inline std::vector<SamplingSetting> ClientSamplingSettings() {
  std::vector<SamplingSetting> s;
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  s.push_back({"greedy", greedy});
  SamplingParams plain;  // the OpenAI API's defaults
  plain.temperature = 1.0f;
  s.push_back({"temperature 1", plain});
  SamplingParams nucleus = plain;
  nucleus.temperature = 0.8f;
  nucleus.top_p = 0.95f;
  s.push_back({"temp 0.8, top_p 0.95", nucleus});
  SamplingParams llama = nucleus;  // llama.cpp's server defaults
  llama.top_k = 40;
  llama.min_p = 0.05f;
  s.push_back({"top_k 40, top_p 0.95, min_p 0.05", llama});
  SamplingParams logprobs = greedy;
  logprobs.num_logprobs = 5;
  s.push_back({"greedy, 5 logprobs", logprobs});
  return s;
}

}  // namespace strata

#endif  // STRATA_COMPUTE_NODE_BENCH_SAMPLING_SETTINGS_H_
