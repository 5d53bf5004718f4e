// JSON Schema and JSON mode as grammars (grammar.h): what `response_format` and vLLM's
// `guided_json` ask for, compiled to GBNF text that the compute node matches against the
// model's vocabulary.
//
// The output is compact JSON with bounded whitespace: at most one space after ',' and ':'
// and one before the value (SentencePiece vocabularies start words with a space), never a
// newline. Object members come in the order of `properties`; required ones always, optional
// ones may be left out; no member outside `properties` is written (valid whatever
// `additionalProperties` says). A schema with bounded strings and arrays therefore has
// outputs of bounded length. The output follows the schema whether `strict` is set or not.
//
// The subset (any other keyword is an error naming it, never ignored):
//   type (one or a list), properties, required, additionalProperties, enum, const, anyOf,
//   oneOf (as anyOf: the grammar cannot forbid matching two branches), allOf of one schema,
//   $ref to "#", "#/$defs/..." or "#/definitions/..." (recursion included; a schema with no
//   finite value is an error), items, minItems, maxItems, minLength, maxLength, pattern
//   (regex_grammar.h's subset), format (date, time, date-time, uuid, email), minimum,
//   maximum, exclusiveMinimum and exclusiveMaximum on integers, minimum >= 0 on numbers,
//   nullable; annotations (title, description, default, examples, $schema, $id, $comment,
//   deprecated, readOnly, writeOnly) are accepted and have no effect.

#ifndef STRATA_COMMON_GRAMMAR_JSON_SCHEMA_H_
#define STRATA_COMMON_GRAMMAR_JSON_SCHEMA_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/grammar/regex_grammar.h"

namespace strata::grammar {

// Any JSON object (JSON mode: {"type": "json_object"}).
std::string JsonObjectGrammar();
// A schema, as JSON text. Errors are InvalidArgument with the keyword and where it is.
absl::StatusOr<std::string> JsonSchemaGrammar(std::string_view schema_json);
// The rules of a schema with every rule name prefixed by `prefix`, to be embedded in a
// larger grammar; `start` gets the rule that matches one value of the schema.
absl::StatusOr<std::string> JsonSchemaRules(std::string_view schema_json, const std::string& prefix,
                                            std::string* start);
// One of the given strings, exactly (vLLM's guided_choice).
std::string ChoiceGrammar(const std::vector<std::string>& choices);
// A GBNF literal for `bytes`.
std::string Literal(std::string_view bytes);

}  // namespace strata::grammar

#endif  // STRATA_COMMON_GRAMMAR_JSON_SCHEMA_H_
