// Patterns and split behaviours shared by normalizers, pre-tokenizers and decoders of
// tokenizer.json: a pattern is {"String": "..."} (a literal) or {"Regex": "..."}.
#ifndef STRATA_COMMON_TOKENIZER_PATTERN_H_
#define STRATA_COMMON_TOKENIZER_PATTERN_H_

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/regex.h"
#include "nlohmann/json.hpp"

namespace strata {

class Pattern {
 public:
  static absl::StatusOr<Pattern> FromJson(const nlohmann::json& j);
  static absl::StatusOr<Pattern> FromRegex(std::string_view regex);
  static Pattern Literal(std::string literal);

  // Non-overlapping matches, left to right, as byte ranges.
  std::vector<std::pair<size_t, size_t>> FindAll(std::string_view text) const;
  std::string ReplaceAll(std::string_view text, std::string_view content) const;

 private:
  std::string literal_;
  std::shared_ptr<const Regex> regex_;
};

// How a split treats the matched delimiters (Hugging Face SplitDelimiterBehavior).
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

absl::StatusOr<SplitBehavior> ParseSplitBehavior(const nlohmann::json& j);

// Cuts [0, text_size) at `matches` (sorted, non-overlapping) according to `behavior`; with
// `invert`, the matches are the kept pieces and the gaps the delimiters. Returns the
// resulting non-empty byte ranges in order.
std::vector<std::pair<size_t, size_t>> SplitRanges(
    size_t text_size, const std::vector<std::pair<size_t, size_t>>& matches, SplitBehavior behavior,
    bool invert);

}  // namespace strata

#endif  // STRATA_COMMON_TOKENIZER_PATTERN_H_
