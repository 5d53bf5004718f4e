// Unicode regular expressions for pre-tokenizers, on ICU. std::regex has no Unicode
// categories; the Split patterns of GPT-2, Llama 3 and Qwen need \p{L}, \p{N}, lookahead and
// (?i:...). Patterns are written for Oniguruma (what Hugging Face tokenizers uses), whose \s
// is the Unicode White_Space property; ICU's \s omits U+000B and U+0085, so \s and \S are
// rewritten to \p{White_Space} and \P{White_Space} before compiling.
//
// Thread-safety: a compiled Regex is immutable; FindAll may run concurrently.
#ifndef STRATA_COMMON_TOKENIZER_REGEX_H_
#define STRATA_COMMON_TOKENIZER_REGEX_H_

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace strata {

class Regex {
 public:
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(std::string_view pattern);
  ~Regex();

  // Byte ranges [begin, end) of the non-overlapping matches in `text` (valid UTF-8), left to
  // right. Empty matches are skipped.
  std::vector<std::pair<size_t, size_t>> FindAll(std::string_view text) const;

  // The pattern as given to ICU, after the \s rewrite.
  const std::string& icu_pattern() const { return icu_pattern_; }

 private:
  Regex();
  struct Impl;  // holds the ICU pattern; keeps ICU headers out of this one
  std::unique_ptr<Impl> impl_;
  std::string icu_pattern_;
};

// Rewrites Oniguruma's \s / \S to ICU's \p{White_Space} / \P{White_Space}, leaving escaped
// backslashes alone. Exposed for tests.
std::string RewriteWhitespaceClasses(std::string_view pattern);

}  // namespace strata

#endif  // STRATA_COMMON_TOKENIZER_REGEX_H_
