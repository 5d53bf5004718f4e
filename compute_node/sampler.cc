#include "compute_node/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "kernels/cpu/elementwise.h"

namespace strata {
namespace {

uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Strict order: higher logit first, then lower token id.
struct ByLogitDesc {
  const float* logits;
  bool operator()(int32_t a, int32_t b) const {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  }
};

// The first of the largest logits (a NaN never wins).
int32_t Argmax(const float* logits, int32_t n) {
  return static_cast<int32_t>(kernels::Argmax(n, logits));
}

// Whether anything before the draw changes the logits (bias, bans, a grammar, penalties).
bool ProcessesLogits(const SamplingParams& p, const SampleInput& in) {
  return !p.logit_bias.empty() || (in.banned != nullptr && !in.banned->empty()) ||
         in.allowed != nullptr || p.repetition_penalty != 1.0f ||
         ((p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f) &&
          in.output_counts != nullptr);
}

}  // namespace

double CounterUniform(uint64_t seed, uint64_t sample_index, uint64_t position) {
  const uint64_t bits = Mix64(Mix64(seed ^ 0x5354524154415f53ull) ^ Mix64(sample_index) ^
                              Mix64(position * 0xd6e8feb86659fd93ull + 1));
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

namespace {

// The smallest best-first prefix (in ByLogitDesc order) of `cand` whose weight reaches
// `target`: a quickselect that partitions by the order and keeps whole partitions while
// their weight falls short. Expected O(n); the result's order is that of the partitions.
std::vector<int32_t> Nucleus(std::vector<int32_t>& cand, const float* weight, ByLogitDesc order,
                             double target) {
  std::vector<int32_t> kept;
  size_t lo = 0, hi = cand.size();
  while (hi - lo > 64) {
    // Median of three under the order as pivot.
    int32_t a = cand[lo], b = cand[lo + (hi - lo) / 2], c = cand[hi - 1];
    if (order(b, a)) std::swap(a, b);
    if (order(c, b)) std::swap(b, c);
    if (order(b, a)) std::swap(a, b);
    const int32_t pivot = b;
    const auto split_it = std::partition(cand.begin() + lo, cand.begin() + hi,
                                         [&](int32_t t) { return order(t, pivot); });
    const size_t split = split_it - cand.begin();
    double mass = 0.0;
    for (size_t i = lo; i < split; ++i) mass += weight[cand[i]];
    if (split > lo && mass >= target) {
      hi = split;  // the nucleus ends among the better ones
      continue;
    }
    kept.insert(kept.end(), cand.begin() + lo, cand.begin() + split);
    target -= mass;
    lo = split;
    // The pivot is now the best of [lo, hi): move it to the front and keep it.
    auto pivot_it = std::find(cand.begin() + lo, cand.begin() + hi, pivot);
    std::iter_swap(cand.begin() + lo, pivot_it);
    kept.push_back(pivot);
    target -= weight[pivot];
    ++lo;
    if (target <= 0.0) return kept;
  }
  std::sort(cand.begin() + lo, cand.begin() + hi, order);
  for (size_t i = lo; i < hi && target > 0.0; ++i) {
    kept.push_back(cand[i]);
    target -= weight[cand[i]];
  }
  if (kept.empty() && !cand.empty()) kept.push_back(cand[lo]);
  return kept;
}

// Per-thread scratch of Sample: processed logits, softmax weights, candidate tokens.
thread_local std::vector<float> logits, weight;
thread_local std::vector<int32_t> cand;

// `out` with the raw logprob of its token and the top ones, where the request asks.
SampleOutput WithLogprobs(const float* raw, int32_t vocab, const SamplingParams& p,
                          SampleOutput out) {
  if (p.num_logprobs >= 0) {
    // Raw log-softmax over the unprocessed logits.
    const float max_raw = raw[Argmax(raw, vocab)];
    weight.resize(vocab);
    const double log_z =
        max_raw + std::log(kernels::ExpShifted(vocab, raw, max_raw, 1.0f, weight.data()));
    out.logprob = static_cast<float>(raw[out.token] - log_z);
    const int32_t k = std::min(p.num_logprobs, vocab);
    if (k > 0) {
      cand.resize(vocab);
      std::iota(cand.begin(), cand.end(), 0);
      const ByLogitDesc order{raw};
      std::nth_element(cand.begin(), cand.begin() + (k - 1), cand.end(), order);
      std::sort(cand.begin(), cand.begin() + k, order);
      for (int32_t i = 0; i < k; ++i) {
        out.top_logprobs.emplace_back(cand[i], static_cast<float>(raw[cand[i]] - log_z));
      }
    }
  }
  return out;
}

}  // namespace

SampleOutput Sample(const float* raw, int32_t vocab, const SampleInput& in) {
  const SamplingParams& p = *in.params;
  SampleOutput out;

  // Greedy on untouched logits: the raw ones' argmax, without a copy.
  if (p.greedy() && !ProcessesLogits(p, in)) {
    out.token = Argmax(raw, vocab);
    return WithLogprobs(raw, vocab, p, std::move(out));
  }

  // Processed logits.
  logits.assign(raw, raw + vocab);
  for (const auto& [token, bias] : p.logit_bias) {
    if (token >= 0 && token < vocab) logits[token] += bias;
  }
  if (in.banned != nullptr) {
    for (int32_t token : *in.banned) {
      if (token >= 0 && token < vocab) logits[token] = kNegInf;
    }
  }
  if (in.allowed != nullptr) {
    // Structured output: tokens the grammar forbids are out. The grammar wins over banned
    // tokens (min_tokens' EOS): where banning left no allowed token, the allowed ones come
    // back.
    const auto allowed = [&](int32_t t) {
      const size_t word = static_cast<size_t>(t) >> 6;
      return word < in.allowed->size() && (((*in.allowed)[word] >> (t & 63)) & 1) != 0;
    };
    bool any = false;
    for (int32_t t = 0; t < vocab; ++t) {
      if (!allowed(t)) {
        logits[t] = kNegInf;
      } else {
        any = any || logits[t] != kNegInf;
      }
    }
    if (!any) {
      for (int32_t t = 0; t < vocab; ++t) {
        if (allowed(t)) logits[t] = raw[t];
      }
    }
  }
  if (p.repetition_penalty != 1.0f) {
    // A token seen in the prompt, the output or both is penalised once.
    auto penalise = [&](int32_t token) {
      if (token < 0 || token >= vocab) return;
      float& l = logits[token];
      l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
    };
    if (in.prompt_counts) {
      for (const auto& [t, c] : *in.prompt_counts) {
        if (c > 0) penalise(t);
      }
    }
    if (in.output_counts) {
      for (const auto& [t, c] : *in.output_counts) {
        const bool in_prompt =
            in.prompt_counts && in.prompt_counts->count(t) && in.prompt_counts->at(t) > 0;
        if (c > 0 && !in_prompt) penalise(t);
      }
    }
  }
  if ((p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f) && in.output_counts) {
    for (const auto& [token, count] : *in.output_counts) {
      if (token < 0 || token >= vocab || count <= 0) continue;
      logits[token] -= p.frequency_penalty * count + p.presence_penalty;
    }
  }

  if (p.greedy()) {
    out.token = Argmax(logits.data(), vocab);
  } else {
    const ByLogitDesc order{logits.data()};
    const float max_logit = logits[Argmax(logits.data(), vocab)];
    weight.resize(vocab);
    double total =
        kernels::ExpShifted(vocab, logits.data(), max_logit, 1.0f / p.temperature, weight.data());
    cand.resize(vocab);
    std::iota(cand.begin(), cand.end(), 0);
    if (p.top_k > 0 && p.top_k < vocab) {
      std::nth_element(cand.begin(), cand.begin() + p.top_k, cand.end(), order);
      cand.resize(p.top_k);
      total = 0.0;
      for (int32_t t : cand) total += weight[t];
    }
    if (p.top_p < 1.0f) {
      std::vector<int32_t> nucleus = Nucleus(cand, weight.data(), order, p.top_p * total);
      cand.swap(nucleus);
    }
    if (p.min_p > 0.0f) {
      // The best token has weight exp(0) = 1, so weights are probabilities relative to it.
      cand.erase(
          std::remove_if(cand.begin(), cand.end(), [&](int32_t t) { return weight[t] < p.min_p; }),
          cand.end());
    }
    double kept = 0.0;
    for (int32_t t : cand) kept += weight[t];
    const double target = CounterUniform(p.seed, in.sample_index, in.output_position) * kept;
    double cumulative = 0.0;
    out.token = cand.back();
    for (int32_t t : cand) {
      cumulative += weight[t];
      if (cumulative > target) {
        out.token = t;
        break;
      }
    }
  }

  return WithLogprobs(raw, vocab, p, std::move(out));
}

}  // namespace strata
