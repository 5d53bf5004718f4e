// The built-in filters (`x | name(args)`), with the semantics Jinja documents.
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/utf8.h"
#include "server/jinja/jinja_ast.h"
#include "server/jinja/jinja_builtins.h"

namespace strata::jinja {

const std::set<std::string>& KnownFilters() {
  static const std::set<std::string>* names = new std::set<std::string>{
      "abs",    "capitalize", "count",  "d",          "default", "e",          "escape",  "first",
      "float",  "indent",     "int",    "items",      "join",    "last",       "length",  "list",
      "lower",  "map",        "max",    "min",        "reject",  "rejectattr", "replace", "reverse",
      "round",  "safe",       "select", "selectattr", "sort",    "string",     "sum",     "title",
      "tojson", "trim",       "unique", "upper"};
  return *names;
}

absl::StatusOr<Value> CallFilter(const std::string& name, const Value& v, const ValueList& args,
                                 const Kwargs& kwargs, int line) {
  using K = Value::Kind;
  if (name == "safe") return v;
  if (name == "default" || name == "d") {
    const Value* def = Arg(args, 0, kwargs, "default_value");
    const Value* boolean = Arg(args, 1, kwargs, "boolean");
    const bool use_default = v.is_undefined() || (boolean && boolean->Truthy() && !v.Truthy());
    return use_default ? (def ? *def : Value::String("")) : v;
  }
  if (name == "trim")
    return Value::String(Strip(v.Str(), Arg(args, 0, kwargs, "chars"), true, true));
  if (name == "length" || name == "count") {
    auto n = Length(v);
    if (!n.ok()) return Fail(line, std::string(n.status().message()));
    return Value::Int(*n);
  }
  if (name == "tojson") {
    const Value* indent = Arg(args, 0, kwargs, "indent");
    return Value::String(
        v.ToJson(indent && indent->kind() == K::kInt ? static_cast<int>(indent->i()) : 0));
  }
  if (name == "upper") return Value::String(CaseMap(v.Str(), 1));
  if (name == "lower") return Value::String(CaseMap(v.Str(), 0));
  if (name == "title") return Value::String(CaseMap(v.Str(), 2));
  if (name == "capitalize") return Value::String(Capitalize(v.Str()));
  if (name == "string") return Value::String(v.Str());
  if (name == "escape" || name == "e") {
    std::string out;
    for (char c : v.Str()) {
      switch (c) {
        case '&':
          out += "&amp;";
          break;
        case '<':
          out += "&lt;";
          break;
        case '>':
          out += "&gt;";
          break;
        case '"':
          out += "&#34;";
          break;
        case '\'':
          out += "&#39;";
          break;
        default:
          out += c;
      }
    }
    return Value::String(out);
  }
  if (name == "int") {
    if (v.kind() == K::kInt) return v;
    if (v.kind() == K::kFloat) return Value::Int(static_cast<int64_t>(v.AsDouble()));
    if (v.kind() == K::kBool) return Value::Int(v.b());
    char* end = nullptr;
    const std::string s = Strip(v.Str(), nullptr, true, true);
    const long long parsed = std::strtoll(s.c_str(), &end, 10);
    if (!s.empty() && end && *end == '\0') return Value::Int(parsed);
    const Value* def = Arg(args, 0, kwargs, "default");
    return def ? *def : Value::Int(0);
  }
  if (name == "float") {
    if (v.is_number()) return Value::Float(v.AsDouble());
    char* end = nullptr;
    const std::string s = Strip(v.Str(), nullptr, true, true);
    const double parsed = std::strtod(s.c_str(), &end);
    if (!s.empty() && end && *end == '\0') return Value::Float(parsed);
    const Value* def = Arg(args, 0, kwargs, "default");
    return def ? *def : Value::Float(0.0);
  }
  if (name == "abs") {
    if (v.kind() == K::kInt) return Value::Int(v.i() < 0 ? -v.i() : v.i());
    if (v.kind() == K::kFloat) return Value::Float(std::fabs(v.AsDouble()));
    return Fail(line, "abs needs a number");
  }
  if (name == "round") {
    const Value* precision = Arg(args, 0, kwargs, "precision");
    const double scale =
        std::pow(10.0, precision && precision->kind() == K::kInt ? precision->i() : 0);
    return Value::Float(std::round(v.AsDouble() * scale) / scale);
  }
  if (name == "items") {
    if (!v.is_mapping()) return Fail(line, "items needs a mapping");
    ValueList out;
    for (const auto& [k, val] : v.dict().items) out.push_back(Value::List({Value::String(k), val}));
    return Value::List(std::move(out));
  }
  if (name == "replace") {
    if (args.size() < 2) return Fail(line, "replace needs two arguments");
    return CallMethod(Value::String(v.Str()), "replace", args, kwargs, line);
  }
  if (name == "indent") {
    const Value* width_v = Arg(args, 0, kwargs, "width");
    const Value* first_v = Arg(args, 1, kwargs, "first");
    const Value* blank_v = Arg(args, 2, kwargs, "blank");
    const std::string pad =
        width_v && width_v->is_string()
            ? width_v->s()
            : std::string(width_v && width_v->kind() == K::kInt ? width_v->i() : 4, ' ');
    const std::string s = v.Str();
    std::string out;
    size_t pos = 0;
    bool first = true;
    while (pos <= s.size()) {
      size_t end = s.find('\n', pos);
      const std::string line_text =
          s.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
      const bool indent_this = first ? (first_v && first_v->Truthy())
                                     : (!line_text.empty() || (blank_v && blank_v->Truthy()));
      if (!first) out += "\n";
      if (indent_this) out += pad;
      out += line_text;
      first = false;
      if (end == std::string::npos) break;
      pos = end + 1;
    }
    return Value::String(out);
  }
  // Filters over sequences.
  auto items_or = Iterate(v);
  if (!items_or.ok()) return Fail(line, std::string(items_or.status().message()));
  ValueList items = std::move(*items_or);
  if (name == "list") return Value::List(items);
  if (name == "first") {
    if (v.is_string()) return items.empty() ? Value() : items.front();
    return items.empty() ? Value() : items.front();
  }
  if (name == "last") return items.empty() ? Value() : items.back();
  if (name == "reverse") {
    std::reverse(items.begin(), items.end());
    if (v.is_string()) {
      std::string out;
      for (const Value& c : items) out += c.s();
      return Value::String(out);
    }
    return Value::List(std::move(items));
  }
  if (name == "join") {
    const Value* sep = Arg(args, 0, kwargs, "d");
    const Value* attr = Kw(kwargs, "attribute");
    std::vector<std::string> parts;
    for (const Value& item : items)
      parts.push_back(attr ? Attribute(item, attr->Str()).Str() : item.Str());
    return Value::String(absl::StrJoin(parts, sep ? sep->Str() : ""));
  }
  if (name == "unique") {
    ValueList out;
    for (const Value& item : items) {
      if (std::none_of(out.begin(), out.end(), [&](const Value& o) { return Equal(o, item); }))
        out.push_back(item);
    }
    return Value::List(std::move(out));
  }
  if (name == "sort" || name == "min" || name == "max") {
    const Value* attr = Kw(kwargs, "attribute");
    const Value* reverse = name == "sort" ? Arg(args, 0, kwargs, "reverse") : nullptr;
    absl::Status error;
    auto key = [&](const Value& x) { return attr ? Attribute(x, attr->Str()) : x; };
    std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
      auto c = Compare(key(a), key(b));
      if (!c.ok()) {
        error = c.status();
        return false;
      }
      return *c < 0;
    });
    if (!error.ok()) return Fail(line, std::string(error.message()));
    if (name == "min") return items.empty() ? Value() : items.front();
    if (name == "max") return items.empty() ? Value() : items.back();
    if (reverse && reverse->Truthy()) std::reverse(items.begin(), items.end());
    return Value::List(std::move(items));
  }
  if (name == "sum") {
    const Value* attr = Kw(kwargs, "attribute");
    bool all_int = true;
    int64_t isum = 0;
    double fsum = 0;
    for (const Value& item : items) {
      const Value x = attr ? Attribute(item, attr->Str()) : item;
      if (!x.is_number()) return Fail(line, "sum needs numbers");
      all_int = all_int && x.kind() == K::kInt;
      isum += x.kind() == K::kInt ? x.i() : 0;
      fsum += x.AsDouble();
    }
    return all_int ? Value::Int(isum) : Value::Float(fsum);
  }
  if (name == "map") {
    ValueList out;
    if (const Value* attr = Kw(kwargs, "attribute")) {
      const Value* def = Kw(kwargs, "default");
      for (const Value& item : items) {
        Value x = Attribute(item, attr->Str());
        out.push_back(x.is_undefined() && def ? *def : x);
      }
      return Value::List(std::move(out));
    }
    if (args.empty()) return Fail(line, "map needs a filter name or attribute=");
    const std::string filter = args[0].Str();
    if (!KnownFilters().count(filter))
      return Fail(line, "unsupported filter '" + filter + "' in map");
    const ValueList rest(args.begin() + 1, args.end());
    for (const Value& item : items) {
      ASSIGN_OR_RETURN(Value x, CallFilter(filter, item, rest, {}, line));
      out.push_back(std::move(x));
    }
    return Value::List(std::move(out));
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    const bool by_attr = name == "selectattr" || name == "rejectattr";
    const bool keep_when = name == "select" || name == "selectattr";
    size_t next = 0;
    std::string attr;
    if (by_attr) {
      if (args.empty()) return Fail(line, name + " needs an attribute name");
      attr = args[next++].Str();
    }
    std::string test;
    if (next < args.size()) test = args[next++].Str();
    if (!test.empty() && !KnownTests().count(test))
      return Fail(line, "unsupported test '" + test + "'");
    const ValueList test_args(args.begin() + next, args.end());
    ValueList out;
    for (const Value& item : items) {
      const Value x = by_attr ? Attribute(item, attr) : item;
      bool result;
      if (test.empty()) {
        result = x.Truthy();
      } else {
        ASSIGN_OR_RETURN(result, RunTest(test, x, test_args, line));
      }
      if (result == keep_when) out.push_back(item);
    }
    return Value::List(std::move(out));
  }
  return Fail(line, "unsupported filter '" + name + "'");
}

}  // namespace strata::jinja
