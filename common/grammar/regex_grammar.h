// Regular expressions as grammars (grammar.h): JSON Schema's `pattern` and vLLM's
// guided_regex.
//
// The subset: literals, escapes (\d \w \s and
// their negations, \n \t \uHHHH, escaped punctuation), classes with ranges and negation,
// '.', groups ((...) and (?:...)), '|', and the quantifiers * + ? {m} {m,} {m,n} (lazy
// forms too: laziness does not change what matches). ^ and $ are allowed at the ends. The
// output is a whole match of the expression, which is also what an unanchored JSON Schema
// `pattern` accepts. Lookaround and backreferences are errors.
#ifndef STRATA_COMMON_GRAMMAR_REGEX_GRAMMAR_H_
#define STRATA_COMMON_GRAMMAR_REGEX_GRAMMAR_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace strata::grammar {

// A GBNF expression matching a whole match of `regex`; with `json_string`, as the text
// inside a JSON string (the characters JSON escapes are written escaped).
absl::StatusOr<std::string> RegexExpression(std::string_view regex, bool json_string);
// A grammar of whole matches of `regex` (vLLM's guided_regex).
absl::StatusOr<std::string> RegexGrammar(std::string_view regex);

}  // namespace strata::grammar

#endif  // STRATA_COMMON_GRAMMAR_REGEX_GRAMMAR_H_
