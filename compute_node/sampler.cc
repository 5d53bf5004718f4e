#include "compute_node/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>

#include "kernels/cpu/elementwise.h"

#ifdef __SSE2__
#include <emmintrin.h>
#endif

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

// The `k` best tokens of `n` under ByLogitDesc, best first: one pass keeping the k best
// in a heap whose front is the worst of them. Tokens come in id order, so a later one with
// the worst's logit ranks below it, and only a larger logit takes its place.
void TopK(const float* logits, int32_t n, int32_t k, std::vector<int32_t>* out) {
  const ByLogitDesc order{logits};
  k = std::min(k, n);
  out->resize(k);
  std::iota(out->begin(), out->end(), 0);
  std::make_heap(out->begin(), out->end(), order);
  float worst = logits[out->front()];
  for (int32_t t = k; t < n; ++t) {
    if (!(logits[t] > worst)) continue;
    std::pop_heap(out->begin(), out->end(), order);
    out->back() = t;
    std::push_heap(out->begin(), out->end(), order);
    worst = logits[out->front()];
  }
  std::sort_heap(out->begin(), out->end(), order);
}

// Logits by their distance below the largest, in sixteenths of a nat after the temperature
// (`scale` = 1 / temperature), up to 2047 (weights below e^-128, and NaNs, share the last):
// a key that never decreases as the logit falls, so every token of a lower key has a larger
// logit than every token of a higher one. It is taken from the logit, not from the weight,
// whose exp may round two equal logits apart.
constexpr int kRankKeys = 2048;
int RankKey(float logit, float max_logit, float scale) {
  const float d = (max_logit - logit) * scale * 16.0f;
  return d < static_cast<float>(kRankKeys - 1) ? static_cast<int>(d) : kRankKeys - 1;
}

// keys[t] = RankKey(logits[t], max_logit, scale) for t in [0, n), 8 at a time where SSE2
// is there: the same arithmetic (min with 2047 takes NaNs and distances from 2047 up to it).
void RankKeys(const float* logits, int32_t n, float max_logit, float scale, int16_t* keys) {
  int32_t t = 0;
#ifdef __SSE2__
  const __m128 vmax = _mm_set1_ps(max_logit), vscale = _mm_set1_ps(scale);
  const __m128 sixteen = _mm_set1_ps(16.0f), last = _mm_set1_ps(kRankKeys - 1);
  auto four = [&](const float* p) {
    const __m128 d = _mm_mul_ps(_mm_mul_ps(_mm_sub_ps(vmax, _mm_loadu_ps(p)), vscale), sixteen);
    return _mm_cvttps_epi32(_mm_min_ps(d, last));  // min(NaN, last) is `last`
  };
  for (; t + 8 <= n; t += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(keys + t),
                     _mm_packs_epi32(four(logits + t), four(logits + t + 4)));
  }
#endif
  for (; t < n; ++t) keys[t] = static_cast<int16_t>(RankKey(logits[t], max_logit, scale));
}

// Of 16 keys: bit j of `before` says key[j] < b, bit j of `on` that key[j] == b.
void BlockMasks(const int16_t* key, int16_t b, uint32_t* before, uint32_t* on) {
#ifdef __SSE2__
  const __m128i vb = _mm_set1_epi16(b);
  const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(key));
  const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(key + 8));
  *before = static_cast<uint32_t>(
      _mm_movemask_epi8(_mm_packs_epi16(_mm_cmplt_epi16(lo, vb), _mm_cmplt_epi16(hi, vb))));
  *on = static_cast<uint32_t>(
      _mm_movemask_epi8(_mm_packs_epi16(_mm_cmpeq_epi16(lo, vb), _mm_cmpeq_epi16(hi, vb))));
#else
  *before = *on = 0;
  for (int j = 0; j < 16; ++j) {
    *before |= static_cast<uint32_t>(key[j] < b) << j;
    *on |= static_cast<uint32_t>(key[j] == b) << j;
  }
#endif
}

// The smallest best-first prefix (in ByLogitDesc order) of all `n` tokens whose weight
// reaches `target`, without sorting them: the mass of each rank key, from the best, finds
// the key where the prefix ends; the tokens before it are in, by id, and those of that key
// follow best first until the target is reached (at least one token in all).
void NucleusOfAll(const float* logits, const float* weight, int32_t n, float max_logit, float scale,
                  double target, std::vector<int32_t>* out) {
  // Keys come in blocks of 16 tokens; the last block's tail is padded with a key no token
  // has, which no list takes.
  constexpr int kBlock = 16;
  constexpr int16_t kPad = std::numeric_limits<int16_t>::max();
  thread_local std::vector<double> mass;
  thread_local std::vector<int16_t> keys;
  thread_local std::vector<int32_t> edge;
  const int32_t padded = (n + kBlock - 1) / kBlock * kBlock;
  keys.resize(padded);
  RankKeys(logits, n, max_logit, scale, keys.data());
  for (int32_t t = n; t < padded; ++t) keys[t] = kPad;
  mass.assign(2 * kRankKeys, 0.0);
  // Two tables, alternate tokens, halve the chains of adds to one key.
  for (int32_t t = 0; t < n; ++t) mass[(t & 1) * kRankKeys + keys[t]] += weight[t];
  int boundary = kRankKeys - 1;
  double above = 0.0;
  for (int key = 0; key < kRankKeys; ++key) {
    const double m = mass[key] + mass[kRankKeys + key];
    if (m > 0.0 && above + m >= target) {
      boundary = key;
      break;
    }
    above += m;
  }
  // The tokens before the boundary, by id, and those on it: each block's members as a bit
  // mask, then one write per member (most tokens are past the boundary).
  out->resize(n);
  edge.resize(n);
  int32_t* in = out->data();
  int32_t* at_edge = edge.data();
  const int16_t* key = keys.data();
  const auto b = static_cast<int16_t>(boundary);
  size_t kept = 0, on_edge = 0;
  for (int32_t base = 0; base < padded; base += kBlock) {
    uint32_t before = 0, on = 0;
    BlockMasks(key + base, b, &before, &on);
    for (; before != 0; before &= before - 1) in[kept++] = base + std::countr_zero(before);
    for (; on != 0; on &= on - 1) at_edge[on_edge++] = base + std::countr_zero(on);
  }
  out->resize(kept);
  edge.resize(on_edge);
  std::sort(edge.begin(), edge.end(), ByLogitDesc{logits});
  for (int32_t t : edge) {
    if (above >= target && !out->empty()) break;
    out->push_back(t);
    above += weight[t];
  }
}

// A token of `cand` (all tokens, by id, when null) drawn with probability proportional to
// its weight, for the uniform `u`: the first whose running sum exceeds u times their sum.
// Over all tokens the sums run by blocks, the block that holds the draw then by token.
int32_t DrawByWeight(const float* weight, int32_t n, const std::vector<int32_t>* cand, double u) {
  if (cand != nullptr) {
    double kept = 0.0;
    for (int32_t t : *cand) kept += weight[t];
    const double target = u * kept;
    double cumulative = 0.0;
    for (int32_t t : *cand) {
      cumulative += weight[t];
      if (cumulative > target) return t;
    }
    // Rounding kept the running sum at the target: the last candidate with weight.
    for (auto it = cand->rbegin(); it != cand->rend(); ++it) {
      if (weight[*it] > 0.0f) return *it;
    }
    return cand->back();
  }
  constexpr int32_t kBlock = 256;
  thread_local std::vector<double> blocks;
  blocks.clear();
  double kept = 0.0;
  for (int32_t b = 0; b < n; b += kBlock) {
    const int32_t end = std::min(n, b + kBlock);
    double s[4] = {0.0, 0.0, 0.0, 0.0};
    int32_t t = b;
    for (; t + 4 <= end; t += 4) {
      for (int j = 0; j < 4; ++j) s[j] += weight[t + j];
    }
    for (; t < end; ++t) s[0] += weight[t];
    blocks.push_back((s[0] + s[1]) + (s[2] + s[3]));
    kept += blocks.back();
  }
  const double target = u * kept;
  double cumulative = 0.0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const int32_t b = static_cast<int32_t>(i) * kBlock;
    const int32_t end = std::min(n, b + kBlock);
    if (cumulative + blocks[i] <= target && i + 1 < blocks.size()) {
      cumulative += blocks[i];
      continue;
    }
    for (int32_t t = b; t < end; ++t) {
      cumulative += weight[t];
      if (cumulative > target) return t;
    }
    // Rounding kept the running sum at the target: the last token with weight so far.
    for (int32_t t = end - 1; t >= 0; --t) {
      if (weight[t] > 0.0f) return t;
    }
    return end - 1;
  }
  return n - 1;
}

// Per-thread scratch of Sample: processed logits, softmax weights, candidate tokens.
thread_local std::vector<float> logits, weight;
thread_local std::vector<int32_t> cand;

// `out` with the raw logprob of its token and the top ones, where the request asks.
// `raw_argmax`: the index of the largest raw logit where the caller knows it, else -1.
SampleOutput WithLogprobs(const float* raw, int32_t vocab, const SamplingParams& p,
                          SampleOutput out, int32_t raw_argmax = -1) {
  if (p.num_logprobs >= 0) {
    // Raw log-softmax over the unprocessed logits.
    const float max_raw = raw[raw_argmax >= 0 ? raw_argmax : Argmax(raw, vocab)];
    weight.resize(vocab);
    const double log_z =
        max_raw + std::log(kernels::ExpShifted(vocab, raw, max_raw, 1.0f, weight.data()));
    out.logprob = static_cast<float>(raw[out.token] - log_z);
    const int32_t k = std::min(p.num_logprobs, vocab);
    if (k > 0) {
      TopK(raw, vocab, k, &cand);
      for (int32_t i = 0; i < k; ++i) {
        out.top_logprobs.emplace_back(cand[i], static_cast<float>(raw[cand[i]] - log_z));
      }
    }
  }
  return out;
}

// A draw from processed `logits` at the request's temperature, top-k, top-p and min-p.
int32_t Draw(const float* logits, int32_t vocab, const SamplingParams& p, const SampleInput& in) {
  const float max_logit = logits[Argmax(logits, vocab)];
  weight.resize(vocab);
  double total = kernels::ExpShifted(vocab, logits, max_logit, 1.0f / p.temperature, weight.data());
  // Every weight is at most exp(0) = 1, so a larger or NaN sum means NaN logits (a broken
  // model), whose exp is NaN or huge: they get no weight, and are never drawn, as greedy
  // never picks one.
  if (!(total <= static_cast<double>(vocab))) {
    total = 0.0;
    for (int32_t t = 0; t < vocab; ++t) {
      if (std::isnan(logits[t]) || !(weight[t] <= 1.0f)) weight[t] = 0.0f;
      total += weight[t];
    }
  }
  bool all = true;  // the candidates are every token, by id (`cand` unused)
  if (p.top_k > 0 && p.top_k < vocab) {
    TopK(logits, vocab, p.top_k, &cand);  // best first
    all = false;
    total = 0.0;
    for (int32_t t : cand) total += weight[t];
  }
  if (p.top_p < 1.0f) {
    const double target = p.top_p * total;
    if (all) {
      NucleusOfAll(logits, weight.data(), vocab, max_logit, 1.0f / p.temperature, target, &cand);
      all = false;
    } else {
      double mass = 0.0;
      size_t n = 0;
      while (n < cand.size() && (n == 0 || mass < target)) mass += weight[cand[n++]];
      cand.resize(n);
    }
  }
  if (p.min_p > 0.0f) {
    // The best token has weight exp(0) = 1, so weights are probabilities relative to it.
    if (all) {
      cand.clear();
      for (int32_t t = 0; t < vocab; ++t) {
        if (!(weight[t] < p.min_p)) cand.push_back(t);
      }
      all = false;
    } else {
      cand.erase(
          std::remove_if(cand.begin(), cand.end(), [&](int32_t t) { return weight[t] < p.min_p; }),
          cand.end());
    }
  }
  return DrawByWeight(weight.data(), vocab, all ? nullptr : &cand,
                      CounterUniform(p.seed, in.sample_index, in.output_position));
}

}  // namespace

SampleOutput Sample(const float* raw, int32_t vocab, const SampleInput& in) {
  const SamplingParams& p = *in.params;
  SampleOutput out;

  // Untouched logits are used where they are, without a copy.
  if (!ProcessesLogits(p, in)) {
    if (p.greedy()) {
      const int32_t best = Argmax(raw, vocab);
      out.token = best;
      return WithLogprobs(raw, vocab, p, std::move(out), best);
    }
    out.token = Draw(raw, vocab, p, in);
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
    out.token = Draw(logits.data(), vocab, p, in);
  }

  return WithLogprobs(raw, vocab, p, std::move(out));
}

}  // namespace strata
