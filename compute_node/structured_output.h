// Structured output where sampling runs: compiled grammars cached by their text, and each
// sequence's matcher state, fed every token of the sequence past its prompt.
//
// The state is a cache, rebuilt from tokens: a setup (a new request, a preempted one set up
// again, or one moved from another compute node with its history) starts it over from the
// grammar's start and feeds it the history's outputs; rows then feed it in order, and a
// sampled token is fed when drawn (so that a kLastSampledToken row needs nothing more). The
// state before the last token is kept too, so that a step whose result was lost can draw
// the same position again.
#ifndef STRATA_COMPUTE_NODE_STRUCTURED_OUTPUT_H_
#define STRATA_COMPUTE_NODE_STRUCTURED_OUTPUT_H_

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/grammar/grammar.h"
#include "common/tokenizer/tokenizer.h"

namespace strata {

using TokenMask = std::shared_ptr<const std::vector<uint64_t>>;

// Masks by matcher state, for one grammar. States repeat: every character inside a JSON
// string leaves the matcher where it was, and sequences under one schema pass through the
// same states. Thread-safe (draws run in parallel).
class MaskCache {
 public:
  // Bytes of masks and keys kept per grammar (a 32k vocabulary's mask is 4 KiB), and the
  // largest key worth keeping (a state's stacks; deep nesting makes long keys).
  static constexpr size_t kMaxBytes = 16 << 20;
  static constexpr size_t kMaxKeyBytes = 4096;
  TokenMask Find(const std::string& key);
  void Put(const std::string& key, TokenMask mask);
  int64_t hits() const { return hits_.load(); }
  int64_t misses() const { return misses_.load(); }

 private:
  absl::Mutex mu_;
  std::unordered_map<std::string, TokenMask> masks_ ABSL_GUARDED_BY(mu_);
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<int64_t> hits_{0}, misses_{0};
};

struct CompiledGrammar {
  std::shared_ptr<const grammar::Grammar> grammar;
  std::shared_ptr<MaskCache> masks;  // null: no caching
};

// Compiled grammars by text, each with its mask cache; the most recently used kCapacity
// are kept (so masks take at most kCapacity x MaskCache::kMaxBytes).
class GrammarCache {
 public:
  static constexpr size_t kCapacity = 32;
  absl::StatusOr<CompiledGrammar> Get(const std::string& gbnf);

 private:
  absl::Mutex mu_;
  std::list<std::string> order_ ABSL_GUARDED_BY(mu_);  // most recent first
  std::unordered_map<std::string, std::pair<CompiledGrammar, std::list<std::string>::iterator>>
      entries_ ABSL_GUARDED_BY(mu_);
};

// The vocabulary as the matcher sees it, and the tokens that end a sequence.
struct GrammarVocabulary {
  grammar::Vocabulary vocabulary;
  std::vector<int32_t> end_tokens;
};

// Each token's bytes in the middle of a text (special tokens: none, so never allowed).
std::unique_ptr<GrammarVocabulary> MakeGrammarVocabulary(const Tokenizer& tokenizer,
                                                         std::vector<int32_t> end_tokens);

class SequenceGrammar {
 public:
  SequenceGrammar(CompiledGrammar g, const GrammarVocabulary* vocab, int64_t first_output_position);
  // The token at `position`. Positions already fed are skipped; a gap, or a token the
  // grammar does not allow, is an error (the sequence cannot go on under its grammar).
  absl::Status Feed(int32_t token, int64_t position);
  // The tokens allowed at `position` (the next one, or the last one again).
  absl::StatusOr<TokenMask> Allowed(int64_t position) const;

 private:
  bool IsEnd(int32_t token) const;

  std::shared_ptr<const grammar::Grammar> grammar_;
  std::shared_ptr<MaskCache> masks_;
  const GrammarVocabulary* vocab_;
  grammar::State state_, previous_;
  int64_t next_;        // the position state_ is for
  bool ended_ = false;  // an end token was fed
  // The last token fed, and whether the end had come before it: a position drawn again
  // with another token goes back one state.
  int32_t last_token_ = -1;
  bool previous_ended_ = false;
};

}  // namespace strata

#endif  // STRATA_COMPUTE_NODE_STRUCTURED_OUTPUT_H_
