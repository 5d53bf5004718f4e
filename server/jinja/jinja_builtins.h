// Internal to the Jinja interpreter. The operations on values that the evaluator and the
// built-ins share (jinja_ops.cc), and the built-ins themselves: filters
// (jinja_filters.cc), tests (jinja_is_tests.cc), global functions and methods
// (jinja_methods.cc). Each built-in is a pure function of its arguments; none sees the
// evaluator's scopes. Errors are InvalidArgument and name the template line.
#ifndef STRATA_SERVER_JINJA_JINJA_BUILTINS_H_
#define STRATA_SERVER_JINJA_JINJA_BUILTINS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/jinja/jinja_value.h"

namespace strata::jinja {

using Kwargs = std::vector<std::pair<std::string, Value>>;

// A template's raise_exception(): Template::Render strips this prefix and passes the
// message to the client as is.
inline constexpr char kRaisedPrefix[] = "\x01raised:";

// InvalidArgument "chat template line <line>: <message>".
absl::Status Fail(int line, const std::string& message);

// Python's str.isspace() for one code point.
bool IsPythonSpace(char32_t c);
// The code points of UTF-8 `s`.
std::vector<char32_t> Chars(const std::string& s);
// str.strip/lstrip/rstrip; `chars` null or none strips whitespace.
std::string Strip(const std::string& s, const Value* chars, bool left, bool right);
// mode 0 lower, 1 upper, 2 title (ICU full case mapping).
std::string CaseMap(const std::string& s, int mode);
std::string Capitalize(const std::string& s);
// str.split / str.rsplit; maxsplit < 0 is unlimited.
Value SplitString(const std::string& s, const Value* sep, int64_t maxsplit, bool from_right);
// The code-point index of a byte offset; npos maps to -1 (str.find's "not found").
int64_t CodePointIndex(const std::string& s, size_t byte_pos);
// Python len().
absl::StatusOr<int64_t> Length(const Value& v);
// The items a for loop or a filter iterates over.
absl::StatusOr<ValueList> Iterate(const Value& v);
// A keyword argument, or null.
const Value* Kw(const Kwargs& kwargs, const std::string& name);
// A positional argument, else the keyword argument `name`, or null.
const Value* Arg(const ValueList& args, size_t index, const Kwargs& kwargs,
                 const std::string& name);
// obj.name and obj[key]; undefined when absent.
Value Attribute(const Value& obj, const std::string& name);
Value Item(const Value& obj, const Value& key);
// `item in container`.
absl::StatusOr<bool> Contains(const Value& item, const Value& container, int line);

// `v | name(args, kwargs)`.
absl::StatusOr<Value> CallFilter(const std::string& name, const Value& v, const ValueList& args,
                                 const Kwargs& kwargs, int line);
// `v is name(args)`.
absl::StatusOr<bool> RunTest(const std::string& name, const Value& v, const ValueList& args,
                             int line);
// obj.name(args, kwargs) for the methods of strings and dicts.
absl::StatusOr<Value> CallMethod(const Value& obj, const std::string& name, const ValueList& args,
                                 const Kwargs& kwargs, int line);
// The global function `name` as a callable value.
absl::StatusOr<Value> GlobalFunction(const std::string& name, int line);

}  // namespace strata::jinja

#endif  // STRATA_SERVER_JINJA_JINJA_BUILTINS_H_
