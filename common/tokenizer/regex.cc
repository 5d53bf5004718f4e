#include "common/tokenizer/regex.h"

#include <unicode/regex.h>
#include <unicode/unistr.h>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/utf8.h"

namespace strata {

struct Regex::Impl {
  std::unique_ptr<icu::RegexPattern> pattern;
};

Regex::Regex() : impl_(std::make_unique<Impl>()) {}

std::string RewriteWhitespaceClasses(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 16);
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '\\' && i + 1 < pattern.size()) {
      const char next = pattern[i + 1];
      if (next == 's') {
        out += "\\p{White_Space}";
      } else if (next == 'S') {
        out += "\\P{White_Space}";
      } else {
        out.push_back('\\');
        out.push_back(next);
      }
      ++i;
      continue;
    }
    out.push_back(pattern[i]);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Regex>> Regex::Compile(std::string_view pattern) {
  auto regex = std::unique_ptr<Regex>(new Regex);
  regex->icu_pattern_ = RewriteWhitespaceClasses(pattern);
  UErrorCode status = U_ZERO_ERROR;
  UParseError parse_error;
  const icu::UnicodeString u = icu::UnicodeString::fromUTF8(
      icu::StringPiece(regex->icu_pattern_.data(), regex->icu_pattern_.size()));
  regex->impl_->pattern.reset(icu::RegexPattern::compile(u, 0, parse_error, status));
  if (U_FAILURE(status)) {
    return absl::InvalidArgumentError(absl::StrCat("invalid regex \"", std::string(pattern),
                                                   "\": ", u_errorName(status), " at offset ",
                                                   parse_error.offset));
  }
  return regex;
}

Regex::~Regex() = default;

std::vector<std::pair<size_t, size_t>> Regex::FindAll(std::string_view text) const {
  // UTF-8 -> UTF-16, remembering the byte offset of every UTF-16 unit.
  icu::UnicodeString u;
  std::vector<size_t> byte_at;  // [utf16 index] -> byte offset; one extra for the end
  byte_at.reserve(text.size() + 1);
  size_t i = 0;
  while (i < text.size()) {
    size_t n = utf8::SequenceLength(text, i);
    char32_t cp = utf8::kReplacement;
    if (n == 0) {
      n = 1;
    } else {
      cp = utf8::Decode(text.substr(i, n))[0];
    }
    const int32_t before = u.length();
    u.append(static_cast<UChar32>(cp));
    for (int32_t k = before; k < u.length(); ++k) byte_at.push_back(i);
    i += n;
  }
  byte_at.push_back(text.size());

  std::vector<std::pair<size_t, size_t>> matches;
  UErrorCode status = U_ZERO_ERROR;
  std::unique_ptr<icu::RegexMatcher> matcher(impl_->pattern->matcher(u, status));
  if (U_FAILURE(status)) return matches;
  while (matcher->find(status) && U_SUCCESS(status)) {
    const int32_t start = matcher->start(status);
    const int32_t end = matcher->end(status);
    if (end > start) matches.emplace_back(byte_at[start], byte_at[end]);
  }
  return matches;
}

}  // namespace strata
