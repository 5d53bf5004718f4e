// The built-in tests (`x is name(args)`, and the tests that select and reject apply).

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/utf8.h"
#include "server/jinja/jinja_ast.h"
#include "server/jinja/jinja_builtins.h"

namespace strata::jinja {

const std::set<std::string>& KnownTests() {
  static const std::set<std::string>* names = new std::set<std::string>{
      "boolean", "callable", "defined",  "divisibleby", "eq",   "equalto",   "even",
      "false",   "float",    "ge",       "gt",          "in",   "integer",   "iterable",
      "le",      "lower",    "lt",       "mapping",     "ne",   "none",      "number",
      "odd",     "sameas",   "sequence", "string",      "true", "undefined", "upper"};
  return *names;
}

absl::StatusOr<bool> RunTest(const std::string& name, const Value& v, const ValueList& args,
                             int line) {
  using K = Value::Kind;
  const Value* a = args.empty() ? nullptr : &args[0];
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.kind() == K::kInt;
  if (name == "float") return v.kind() == K::kFloat;
  if (name == "boolean") return v.kind() == K::kBool;
  if (name == "true") return v.kind() == K::kBool && v.b();
  if (name == "false") return v.kind() == K::kBool && !v.b();
  if (name == "mapping") return v.is_mapping();
  if (name == "iterable") return v.is_list() || v.is_mapping() || v.is_string();
  if (name == "sequence") return v.is_list() || v.is_string() || v.is_mapping();
  if (name == "callable") return v.kind() == K::kCallable;
  if (name == "lower") return v.is_string() && CaseMap(v.s(), 0) == v.s();
  if (name == "upper") return v.is_string() && CaseMap(v.s(), 1) == v.s();
  if (name == "odd" || name == "even") {
    if (v.kind() != K::kInt) return Fail(line, "'" + name + "' needs an integer");
    return (v.i() % 2 != 0) == (name == "odd");
  }
  if (!a) return Fail(line, "test '" + name + "' needs an argument");
  if (name == "divisibleby") {
    if (v.kind() != K::kInt || a->kind() != K::kInt || a->i() == 0)
      return Fail(line, "bad divisibleby");
    return v.i() % a->i() == 0;
  }
  if (name == "eq" || name == "equalto" || name == "sameas") return Equal(v, *a);
  if (name == "ne") return !Equal(v, *a);
  if (name == "in") return Contains(v, *a, line);
  auto c = Compare(v, *a);
  if (!c.ok()) return Fail(line, std::string(c.status().message()));
  if (name == "lt") return *c < 0;
  if (name == "le") return *c <= 0;
  if (name == "gt") return *c > 0;
  if (name == "ge") return *c >= 0;
  return Fail(line, "unknown test " + name);
}

}  // namespace strata::jinja
