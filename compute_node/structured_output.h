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

// Compiled grammars by text; the most recently used kCapacity are kept.
class GrammarCache {
 public:
  static constexpr size_t kCapacity = 256;
  absl::StatusOr<std::shared_ptr<const grammar::Grammar>> Get(const std::string& gbnf);

 private:
  absl::Mutex mu_;
  std::list<std::string> order_ ABSL_GUARDED_BY(mu_);  // most recent first
  std::unordered_map<std::string, std::pair<std::shared_ptr<const grammar::Grammar>,
                                            std::list<std::string>::iterator>>
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
  SequenceGrammar(std::shared_ptr<const grammar::Grammar> g, const GrammarVocabulary* vocab,
                  int64_t first_output_position);
  // The token at `position`. Positions already fed are skipped; a gap, or a token the
  // grammar does not allow, is an error (the sequence cannot go on under its grammar).
  absl::Status Feed(int32_t token, int64_t position);
  // The tokens allowed at `position` (the next one, or the last one again).
  absl::StatusOr<std::vector<uint64_t>> Allowed(int64_t position) const;

 private:
  bool IsEnd(int32_t token) const;

  std::shared_ptr<const grammar::Grammar> grammar_;
  const GrammarVocabulary* vocab_;
  grammar::State state_, previous_;
  int64_t next_;        // the position state_ is for
  bool ended_ = false;  // an end token was fed
};

}  // namespace strata

#endif  // STRATA_COMPUTE_NODE_STRUCTURED_OUTPUT_H_
