#include "compute_node/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>

#include "gtest/gtest.h"
#include "kernels/cpu/elementwise.h"

namespace strata {
namespace {

std::vector<float> RandomLogits(int n, uint32_t seed, float scale = 2.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = normal(rng);
  return v;
}

// Draws many tokens (one per output position) and returns empirical frequencies.
std::map<int32_t, double> Frequencies(const std::vector<float>& logits, const SamplingParams& p,
                                      int draws) {
  std::map<int32_t, double> freq;
  SampleInput in;
  in.params = &p;
  for (int i = 0; i < draws; ++i) {
    in.output_position = i;
    freq[Sample(logits.data(), logits.size(), in).token] += 1.0 / draws;
  }
  return freq;
}

// Independent target distribution: softmax(logits / t) restricted to `keep`, renormalised.
std::vector<double> Target(const std::vector<float>& logits, float t,
                           const std::vector<bool>& keep) {
  std::vector<double> p(logits.size(), 0.0);
  double z = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (keep[i]) z += (p[i] = std::exp(logits[i] / static_cast<double>(t)));
  }
  for (double& x : p) x /= z;
  return p;
}

void ExpectMatches(const std::map<int32_t, double>& freq, const std::vector<double>& target,
                   int draws) {
  for (size_t i = 0; i < target.size(); ++i) {
    const double got = freq.count(i) ? freq.at(i) : 0.0;
    const double sigma = std::sqrt(target[i] * (1 - target[i]) / draws);
    EXPECT_NEAR(got, target[i], 5 * sigma + 1e-9) << "token " << i;
  }
}

TEST(Sampler, GreedyTakesArgmaxAndLowestIdOnTies) {
  std::vector<float> logits = {0.5f, 3.0f, 3.0f, -1.0f};
  SamplingParams p;
  p.temperature = 0.0f;
  SampleInput in;
  in.params = &p;
  EXPECT_EQ(Sample(logits.data(), 4, in).token, 1);
}

// Greedy draws on untouched logits take a path of their own (no copy, no processing): it
// must give the token and logprobs that the processed path gives when processing changes
// nothing (a zero bias), and both the first of the largest logits, at a vocabulary's size.
TEST(Sampler, GreedyOnUntouchedLogitsAgreesWithTheProcessedPath) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    std::vector<float> logits = RandomLogits(32000, seed);
    for (float& l : logits) l = std::round(l * 4.0f) / 4.0f;  // ties among the largest
    SamplingParams plain;
    plain.temperature = 0.0f;
    plain.num_logprobs = 3;
    SamplingParams biased = plain;
    biased.logit_bias.emplace_back(static_cast<int32_t>(seed), 0.0f);
    SampleInput in;
    in.params = &plain;
    const SampleOutput fast = Sample(logits.data(), logits.size(), in);
    in.params = &biased;
    const SampleOutput processed = Sample(logits.data(), logits.size(), in);
    const int32_t first_largest =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    EXPECT_EQ(fast.token, first_largest) << "seed " << seed;
    EXPECT_EQ(processed.token, first_largest) << "seed " << seed;
    EXPECT_EQ(fast.logprob, processed.logprob);
    EXPECT_EQ(fast.top_logprobs, processed.top_logprobs);
  }
}

TEST(Sampler, TemperatureSamplingFollowsSoftmax) {
  const std::vector<float> logits = RandomLogits(12, 1);
  SamplingParams p;
  p.temperature = 0.7f;
  p.seed = 99;
  const int draws = 40000;
  ExpectMatches(Frequencies(logits, p, draws), Target(logits, 0.7f, std::vector<bool>(12, true)),
                draws);
}

TEST(Sampler, TopKAndTopPAndMinPRestrictTheSupport) {
  const std::vector<float> logits = RandomLogits(40, 2);
  std::vector<int32_t> order(40);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  const int draws = 30000;
  {
    SamplingParams p;
    p.top_k = 5;
    std::vector<bool> keep(40, false);
    for (int i = 0; i < 5; ++i) keep[order[i]] = true;
    ExpectMatches(Frequencies(logits, p, draws), Target(logits, 1.0f, keep), draws);
  }
  {
    SamplingParams p;
    p.top_p = 0.6f;
    // Nucleus: the smallest best-first prefix whose probability reaches 0.6.
    const std::vector<double> full = Target(logits, 1.0f, std::vector<bool>(40, true));
    std::vector<bool> keep(40, false);
    double mass = 0;
    for (int32_t t : order) {
      keep[t] = true;
      mass += full[t];
      if (mass >= 0.6) break;
    }
    ExpectMatches(Frequencies(logits, p, draws), Target(logits, 1.0f, keep), draws);
  }
  {
    SamplingParams p;
    p.min_p = 0.2f;
    const std::vector<double> full = Target(logits, 1.0f, std::vector<bool>(40, true));
    const double best = *std::max_element(full.begin(), full.end());
    std::vector<bool> keep(40);
    for (int i = 0; i < 40; ++i) keep[i] = full[i] >= 0.2 * best;
    ExpectMatches(Frequencies(logits, p, draws), Target(logits, 1.0f, keep), draws);
  }
}

TEST(Sampler, TopPOnALargeVocabularyUsesTheSameNucleus) {
  // 50k tokens: the partial-sort shortcut must give what a full sort gives.
  const std::vector<float> logits = RandomLogits(50000, 3, 1.0f);
  SamplingParams p;
  p.top_p = 0.9f;
  p.seed = 5;
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  const std::vector<double> full = Target(logits, 1.0f, std::vector<bool>(logits.size(), true));
  std::vector<bool> keep(logits.size(), false);
  double mass = 0;
  for (int32_t t : order) {
    keep[t] = true;
    mass += full[t];
    if (mass >= 0.9) break;
  }
  SampleInput in;
  in.params = &p;
  for (int i = 0; i < 200; ++i) {
    in.output_position = i;
    const int32_t t = Sample(logits.data(), logits.size(), in).token;
    ASSERT_TRUE(keep[t]) << "token " << t << " is outside the nucleus";
  }
}

// The draw for a temperature and top_p alone, written out plainly: the weights and the
// largest logit from the same kernels the sampler uses, then the nucleus as the sampler
// defines it, one token at a time: rank keys (sixteenths of a nat below the largest logit
// after the temperature, NaN and everything from 2047 on in key 2047), each key's mass, the
// tokens of the keys before the one where the mass reaches top_p by id, then that key's
// tokens best first until it does; and the draw over that list in its order.
int32_t TopPDrawByTheDefinition(const std::vector<float>& logits, const SamplingParams& p,
                                int64_t position) {
  const auto n = static_cast<int32_t>(logits.size());
  const float max_logit = logits[kernels::Argmax(n, logits.data())];
  const float scale = 1.0f / p.temperature;
  std::vector<float> weight(n);
  double total = kernels::ExpShifted(n, logits.data(), max_logit, scale, weight.data());
  if (!(total <= static_cast<double>(n))) {
    total = 0.0;
    for (int32_t t = 0; t < n; ++t) {
      if (std::isnan(logits[t]) || !(weight[t] <= 1.0f)) weight[t] = 0.0f;
      total += weight[t];
    }
  }
  const double target = p.top_p * total;
  constexpr int kKeys = 2048;
  std::vector<int> key(n);
  std::vector<double> mass(2 * kKeys, 0.0);
  for (int32_t t = 0; t < n; ++t) {
    const float d = (max_logit - logits[t]) * scale * 16.0f;
    key[t] = d < static_cast<float>(kKeys - 1) ? static_cast<int>(d) : kKeys - 1;
    mass[(t & 1) * kKeys + key[t]] += weight[t];
  }
  int boundary = kKeys - 1;
  double above = 0.0;
  for (int k = 0; k < kKeys; ++k) {
    const double m = mass[k] + mass[kKeys + k];
    if (m > 0.0 && above + m >= target) {
      boundary = k;
      break;
    }
    above += m;
  }
  std::vector<int32_t> cand, edge;
  for (int32_t t = 0; t < n; ++t) {
    if (key[t] < boundary) cand.push_back(t);
    if (key[t] == boundary) edge.push_back(t);
  }
  std::sort(edge.begin(), edge.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  for (int32_t t : edge) {
    if (above >= target && !cand.empty()) break;
    cand.push_back(t);
    above += weight[t];
  }
  double kept = 0.0;
  for (int32_t t : cand) kept += weight[t];
  const double goal = CounterUniform(p.seed, 0, position) * kept;
  double cumulative = 0.0;
  for (int32_t t : cand) {
    cumulative += weight[t];
    if (cumulative > goal) return t;
  }
  for (auto it = cand.rbegin(); it != cand.rend(); ++it) {
    if (weight[*it] > 0.0f) return *it;
  }
  return cand.back();
}

// The nucleus over a whole vocabulary computes its keys several tokens at a time and
// collects each block's members from bit masks; every draw must be the definition's, on
// vocabularies shorter than a block, not a multiple of one, with NaN, infinite and tied
// logits, and a nucleus of one token or of nearly all.
TEST(Sampler, TopPDrawsAreThoseOfTheNucleusDefinition) {
  std::vector<std::vector<float>> cases;
  for (int n : {1, 2, 7, 8, 9, 15, 16, 17, 33, 100, 1001, 32003}) {
    cases.push_back(RandomLogits(n, 100 + n, 1.5f));
  }
  std::vector<float> special = RandomLogits(45, 7, 1.0f);
  special[3] = std::numeric_limits<float>::quiet_NaN();
  special[20] = -std::numeric_limits<float>::infinity();
  special[41] = std::numeric_limits<float>::quiet_NaN();  // in the last, partial block
  special[44] = -std::numeric_limits<float>::infinity();
  special[10] = special[11] = special[30] = 2.5f;  // ties
  cases.push_back(special);
  std::vector<float> flat(70, 0.25f);  // one key: the edge is every token
  flat[69] = std::numeric_limits<float>::quiet_NaN();
  cases.push_back(flat);
  std::vector<float> far = RandomLogits(300, 9, 1.0f);
  far[5] = 400.0f;  // every other token past key 2047
  cases.push_back(far);
  for (size_t c = 0; c < cases.size(); ++c) {
    for (float temperature : {0.3f, 1.0f}) {
      for (float top_p : {0.05f, 0.5f, 0.9f, 0.999f}) {
        SamplingParams p;
        p.temperature = temperature;
        p.top_p = top_p;
        p.seed = 17 + c;
        SampleInput in;
        in.params = &p;
        for (int64_t position = 0; position < 40; ++position) {
          in.output_position = position;
          ASSERT_EQ(Sample(cases[c].data(), static_cast<int32_t>(cases[c].size()), in).token,
                    TopPDrawByTheDefinition(cases[c], p, position))
              << "case " << c << " (" << cases[c].size() << " tokens), temperature " << temperature
              << ", top_p " << top_p << ", position " << position;
        }
      }
    }
  }
}

// At a vocabulary's size the draw takes its fast paths: a heap for top-k, weight keys for
// the nucleus, block sums for the draw over every token. Each must follow the softmax over
// the same support as the small-vocabulary rules: the strong tokens one by one (ties among
// them), the weak rest together.
TEST(Sampler, LargeVocabularyDrawsFollowTheRestrictedSoftmax) {
  // Not a multiple of the vector width: a tied pair straddles the vector body and the tail.
  constexpr int kVocab = 32003;
  std::vector<float> logits = RandomLogits(kVocab, 11, 1.0f);
  const std::vector<std::pair<int32_t, float>> strong = {{5, 9.0f},     {7, 8.5f}, {32001, 8.5f},
                                                         {20000, 8.0f}, {3, 7.5f}, {25000, 7.5f}};
  for (const auto& [t, l] : strong) logits[t] = l;
  std::vector<int32_t> order(kVocab);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  // The best-first prefix of `size` tokens, or the smallest whose mass reaches `top_p`.
  auto prefix = [&](size_t size, double top_p) {
    const std::vector<double> full = Target(logits, 1.0f, std::vector<bool>(kVocab, true));
    std::vector<bool> keep(kVocab, false);
    double mass = 0;
    for (size_t i = 0; i < order.size() && i < size; ++i) {
      keep[order[i]] = true;
      mass += full[order[i]];
      if (mass >= top_p) break;
    }
    return keep;
  };
  auto check = [&](const SamplingParams& p, const std::vector<bool>& keep, const char* what) {
    const int draws = 8000;
    const std::map<int32_t, double> freq = Frequencies(logits, p, draws);
    const std::vector<double> target = Target(logits, 1.0f, keep);
    double rest_got = 0, rest_want = 0;
    for (size_t t = 0; t < target.size(); ++t) {
      const double got = freq.count(t) ? freq.at(t) : 0.0;
      if (!keep[t]) ASSERT_EQ(got, 0.0) << what << ": token " << t << " is outside the support";
      if (target[t] < 0.02) {
        rest_got += got;
        rest_want += target[t];
        continue;
      }
      const double sigma = std::sqrt(target[t] * (1 - target[t]) / draws);
      EXPECT_NEAR(got, target[t], 5 * sigma) << what << ": token " << t;
    }
    const double sigma = std::sqrt(rest_want * (1 - rest_want) / draws);
    EXPECT_NEAR(rest_got, rest_want, 5 * sigma + 1e-9) << what << ": the weak tokens together";
  };
  SamplingParams all;
  all.seed = 21;
  check(all, std::vector<bool>(kVocab, true), "temperature 1");
  SamplingParams top_k = all;
  top_k.top_k = 3;  // the tie at 8.5 is inside; the next token, 8.0, is out
  check(top_k, prefix(3, 2.0), "top_k 3");
  SamplingParams top_k_tie = all;
  top_k_tie.top_k = 5;  // of the tie at 7.5, the lower id (3) is in
  check(top_k_tie, prefix(5, 2.0), "top_k 5");
  for (float top_p : {0.5f, 0.8f, 0.97f}) {
    SamplingParams nucleus = all;
    nucleus.top_p = top_p;
    check(nucleus, prefix(kVocab, top_p), "top_p");
  }
}

// NaN logits (a broken model) are never drawn, whatever the sampling settings, and the
// other tokens keep their softmax.
TEST(Sampler, NanLogitsAreNeverDrawn) {
  std::vector<float> logits = RandomLogits(40, 4);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<bool> keep(40, true);
  for (int t : {0, 17, 39}) {
    logits[t] = nan;
    keep[t] = false;
  }
  const int draws = 20000;
  SamplingParams plain;
  plain.seed = 3;
  ExpectMatches(Frequencies(logits, plain, draws), Target(logits, 1.0f, keep), draws);
  SamplingParams restricted = plain;
  restricted.top_p = 0.9f;
  restricted.min_p = 0.01f;
  for (const auto& [t, f] : Frequencies(logits, restricted, draws)) {
    EXPECT_TRUE(keep[t]) << "drew the NaN logit of token " << t;
  }
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  SampleInput in;
  in.params = &greedy;
  EXPECT_TRUE(keep[Sample(logits.data(), logits.size(), in).token]);
}

TEST(Sampler, SeededDrawsDependOnlyOnSeedSampleAndPosition) {
  const std::vector<float> logits = RandomLogits(1000, 4, 0.5f);
  SamplingParams p;
  p.seed = 1234;
  SampleInput in;
  in.params = &p;
  in.sample_index = 2;
  in.output_position = 17;
  const int32_t first = Sample(logits.data(), 1000, in).token;
  for (int i = 0; i < 5; ++i) EXPECT_EQ(Sample(logits.data(), 1000, in).token, first);
  EXPECT_EQ(CounterUniform(1, 2, 3), CounterUniform(1, 2, 3));
  EXPECT_NE(CounterUniform(1, 2, 3), CounterUniform(1, 2, 4));
  EXPECT_NE(CounterUniform(1, 2, 3), CounterUniform(1, 3, 3));
  EXPECT_NE(CounterUniform(1, 2, 3), CounterUniform(2, 2, 3));
  // Uniformity of the draws.
  double sum = 0;
  for (int i = 0; i < 100000; ++i) sum += CounterUniform(7, 0, i);
  EXPECT_NEAR(sum / 100000, 0.5, 0.005);
}

TEST(Sampler, PenaltiesBiasAndBans) {
  std::vector<float> logits = {2.0f, 1.9f, -0.5f, 0.0f};
  SamplingParams p;
  p.temperature = 0.0f;
  SampleInput in;
  in.params = &p;
  std::unordered_map<int32_t, int32_t> outputs = {{0, 3}};
  in.output_counts = &outputs;
  // Repetition penalty divides positive logits of seen tokens: 2.0 / 1.5 < 1.9.
  p.repetition_penalty = 1.5f;
  EXPECT_EQ(Sample(logits.data(), 4, in).token, 1);
  p.repetition_penalty = 1.0f;
  // Frequency penalty: 2.0 - 3 * 0.1 = 1.7 < 1.9.
  p.frequency_penalty = 0.1f;
  EXPECT_EQ(Sample(logits.data(), 4, in).token, 1);
  p.frequency_penalty = 0.0f;
  p.presence_penalty = 0.05f;  // 1.95 > 1.9: still token 0
  EXPECT_EQ(Sample(logits.data(), 4, in).token, 0);
  p.presence_penalty = 0.0f;
  p.logit_bias = {{3, 5.0f}};
  EXPECT_EQ(Sample(logits.data(), 4, in).token, 3);
  p.logit_bias.clear();
  std::vector<int32_t> banned = {0, 1};
  in.banned = &banned;
  EXPECT_EQ(Sample(logits.data(), 4, in).token, 3);
}

TEST(Sampler, LogprobsAreRawLogSoftmax) {
  const std::vector<float> logits = RandomLogits(100, 5);
  SamplingParams p;
  p.temperature = 0.0f;
  p.num_logprobs = 3;
  p.logit_bias = {{7, 100.0f}};  // changes the choice, not the reported distribution
  SampleInput in;
  in.params = &p;
  SampleOutput out = Sample(logits.data(), 100, in);
  EXPECT_EQ(out.token, 7);
  double z = 0;
  for (float l : logits) z += std::exp(static_cast<double>(l));
  EXPECT_NEAR(out.logprob, logits[7] - std::log(z), 1e-5);
  ASSERT_EQ(out.top_logprobs.size(), 3u);
  const int32_t best = std::max_element(logits.begin(), logits.end()) - logits.begin();
  EXPECT_EQ(out.top_logprobs[0].first, best);
  EXPECT_NEAR(out.top_logprobs[0].second, logits[best] - std::log(z), 1e-5);
  EXPECT_GE(out.top_logprobs[0].second, out.top_logprobs[1].second);
  EXPECT_GE(out.top_logprobs[1].second, out.top_logprobs[2].second);
}

}  // namespace
}  // namespace strata
