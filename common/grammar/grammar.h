// Grammars for constrained decoding: a context-free grammar over bytes, written in GBNF (the
// notation llama.cpp popularised; the subset is below), and a matcher that says which bytes,
// and so which tokens, may come next.
//
// The notation:
//   rule-name ::= alternative | alternative ...     one rule per line, `root` is the start
//   "literal"  with \" \\ \n \r \t \xHH \uHHHH \UHHHHHHHH escapes (UTF-8 in, UTF-8 out)
//   [a-z0-9_] [^"\\]  character classes over code points (ranges, negation, escapes)
//   .          any code point
//   ( ... )    groups;  x*  x+  x?  x{m}  x{m,}  x{m,n}  repetition;  # comments
// Code points are matched as their UTF-8 bytes, so a token that holds half a character, or
// ends in the middle of a literal, or spans two grammar elements, is judged byte by byte.
//
// Limits (a bad grammar is an error, never a hang): at most kMaxRules rules and
// kMaxElements elements after expansion of repetitions; left recursion is refused.
#ifndef STRATA_COMMON_GRAMMAR_GRAMMAR_H_
#define STRATA_COMMON_GRAMMAR_GRAMMAR_H_

#include <bitset>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::grammar {

inline constexpr int kMaxRules = 20000;

// Inclusive ranges of code points, and their complement within [0, 0x10FFFF].
using CodePointRange = std::pair<uint32_t, uint32_t>;
std::vector<CodePointRange> Complement(std::vector<CodePointRange> ranges);
inline constexpr int kMaxElements = 400000;

// One element of an alternative: a set of bytes to match, a rule to expand, or the end of
// the alternative.
struct Element {
  enum class Kind : uint8_t { kBytes, kRule, kEnd };
  Kind kind = Kind::kEnd;
  int32_t value = 0;  // kBytes: index into byte_sets; kRule: rule index
};

class Grammar {
 public:
  static absl::StatusOr<std::shared_ptr<const Grammar>> Parse(std::string_view gbnf);

  // Alternatives of rule r: offsets into elements(), each running to a kEnd.
  const std::vector<int32_t>& alternatives(int rule) const { return rules_[rule]; }
  const std::vector<Element>& elements() const { return elements_; }
  const std::bitset<256>& byte_set(int i) const { return byte_sets_[i]; }
  int root() const { return root_; }
  size_t num_rules() const { return rules_.size(); }

 private:
  friend class Builder;
  std::vector<std::vector<int32_t>> rules_;
  std::vector<Element> elements_;
  std::vector<std::bitset<256>> byte_sets_;
  int root_ = 0;
};

// Where a parse may stand: a set of stacks of positions in the grammar's elements (each
// stack's top is a byte set to match next; an empty stack has matched the whole grammar).
// Cheap to copy; advancing makes a new state.
class State {
 public:
  State() = default;
  static State Start(const Grammar& g);
  // The state after `bytes`, or an empty (dead) state if they cannot come next.
  State Advance(const Grammar& g, std::string_view bytes) const;
  bool dead() const { return stacks_.empty(); }
  // The grammar may end here.
  bool accepting() const;
  // The grammar can go on here (some stack still wants bytes).
  bool can_continue() const;
  // Bytes that may come next.
  std::bitset<256> NextBytes(const Grammar& g) const;
  // Equal for equal states (a key for caching what follows from a state).
  std::string Key() const;

 private:
  friend class MaskBuilder;
  using Stack = std::vector<int32_t>;  // element offsets, bottom first
  std::vector<Stack> stacks_;          // sorted, unique; every top is a kBytes element
};

// Token byte strings of a vocabulary, in a trie, for masks.
class Vocabulary {
 public:
  // tokens[id]: the bytes token id adds to a text; empty for tokens that can never be
  // generated under a grammar (special tokens).
  explicit Vocabulary(std::vector<std::string> tokens);
  size_t size() const { return tokens_.size(); }
  const std::string& token(int32_t id) const { return tokens_[id]; }

 private:
  friend class MaskBuilder;
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;  // byte, node
    std::vector<int32_t> ends;                          // tokens ending here
  };
  std::vector<std::string> tokens_;
  std::vector<Node> nodes_;
};

// Allowed tokens from a state: bit t is set when token t's bytes can come next. End tokens
// (EOS) are allowed exactly when the state is accepting. Walks the vocabulary's trie once,
// remembering transitions, so tokens that share a prefix share its work.
std::vector<uint64_t> AllowedTokens(const Grammar& g, const Vocabulary& vocab, const State& state,
                                    const std::vector<int32_t>& end_tokens);
inline bool MaskHas(const std::vector<uint64_t>& mask, int32_t token) {
  return token >= 0 && static_cast<size_t>(token >> 6) < mask.size() &&
         ((mask[token >> 6] >> (token & 63)) & 1) != 0;
}

}  // namespace strata::grammar

#endif  // STRATA_COMMON_GRAMMAR_GRAMMAR_H_
