// A Jinja interpreter for chat templates: the subset that the chat templates of Llama 2,
// Llama 3, Mistral and Qwen (ChatML) use, implemented generically (no template is matched
// against known strings).
//
// Supported: text, {{ }}, {% %}, {# #}, whitespace control (-), and Hugging Face's
// environment settings trim_blocks and lstrip_blocks; statements set (names, namespace
// attributes, block set), if/elif/else, for (tuple targets, loop filters, else, loop.*,
// break/continue), macro and call of macros, generation (rendered as its body);
// expressions with Python semantics: literals, lists, dicts, attribute and item access,
// slices, calls, arithmetic, ~, comparisons, in, and/or/not, is-tests, inline if/else and
// filters. The allowed filters, tests, functions and methods are listed in
// jinja_filters.cc, jinja_is_tests.cc and jinja_methods.cc; a template that uses anything
// else fails to parse, naming the construct, so an unsupported template is an error at
// model load rather than at request time.
//
// Thread-safety: a parsed Template is immutable; Render may run concurrently.
#ifndef STRATA_SERVER_JINJA_JINJA_H_
#define STRATA_SERVER_JINJA_JINJA_H_

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "server/jinja/jinja_value.h"

namespace strata::jinja {

struct Node;

class Template {
 public:
  static absl::StatusOr<std::unique_ptr<Template>> Parse(std::string_view source);
  ~Template();

  // Renders with `context` (a dict of variables). raise_exception(msg) in the template
  // yields InvalidArgument with msg; other runtime errors are InvalidArgument too.
  absl::StatusOr<std::string> Render(const ValueDict& context) const;

 private:
  Template() = default;
  std::shared_ptr<Node> root_;
};

}  // namespace strata::jinja

#endif  // STRATA_SERVER_JINJA_JINJA_H_
