// Pre-tokenizers of tokenizer.json ("pre_tokenizer"): Sequence, Split, ByteLevel, Metaspace,
// Digits, Punctuation, Whitespace, WhitespaceSplit. Any other type is an error at load.
// A pre-tokenizer cuts pieces of text into smaller pieces ("words") that the model
// tokenizes independently.
#ifndef STRATA_COMMON_TOKENIZER_PRE_TOKENIZER_H_
#define STRATA_COMMON_TOKENIZER_PRE_TOKENIZER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace strata {

struct Piece {
  std::string text;
  // The piece begins at offset 0 of the whole input (Metaspace's prepend_scheme "first").
  bool at_start = false;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void PreTokenize(std::vector<Piece>& pieces) const = 0;
};

// Returns nullptr for a JSON null (the whole text is one word).
absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizerFromJson(const nlohmann::json& j);

// GPT-2's split pattern, used by ByteLevel with use_regex.
extern const char kGpt2SplitPattern[];

}  // namespace strata

#endif  // STRATA_COMMON_TOKENIZER_PRE_TOKENIZER_H_
