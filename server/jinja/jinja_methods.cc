// The global functions (namespace, dict, range, raise_exception, strftime_now) and the
// methods of strings and dicts, with Python's semantics.
#include <unicode/uchar.h>

#include <algorithm>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/utf8.h"
#include "server/jinja/jinja_ast.h"
#include "server/jinja/jinja_builtins.h"

namespace strata::jinja {

const std::set<std::string>& KnownFunctions() {
  static const std::set<std::string>* names =
      new std::set<std::string>{"namespace", "range", "raise_exception", "dict", "strftime_now"};
  return *names;
}

const std::set<std::string>& KnownMethods() {
  static const std::set<std::string>* names = new std::set<std::string>{
      // str
      "capitalize", "count", "endswith", "find", "isalnum", "isalpha", "isdigit", "islower",
      "isspace", "isupper", "join", "lower", "lstrip", "replace", "rfind", "rsplit", "rstrip",
      "split", "splitlines", "startswith", "strip", "title", "upper",
      // dict
      "get", "items", "keys", "values"};
  return *names;
}

absl::StatusOr<Value> GlobalFunction(const std::string& name, int line) {
  if (name == "namespace" || name == "dict") {
    const bool ns = name == "namespace";
    return Value::Function(
        [ns](const ValueList& args, const Kwargs& kwargs) -> absl::StatusOr<Value> {
          ValueDict d;
          for (const Value& a : args) {
            if (a.is_mapping()) {
              for (const auto& [k, v] : a.dict().items) d.Set(k, v);
            }
          }
          for (const auto& [k, v] : kwargs) d.Set(k, v);
          return ns ? Value::Namespace(std::move(d)) : Value::Dict(std::move(d));
        });
  }
  if (name == "range") {
    return Value::Function([](const ValueList& args, const Kwargs&) -> absl::StatusOr<Value> {
      int64_t start = 0, stop = 0, step = 1;
      for (const Value& a : args) {
        if (a.kind() != Value::Kind::kInt)
          return absl::InvalidArgumentError("range() needs integers");
      }
      if (args.size() == 1) stop = args[0].i();
      if (args.size() >= 2) {
        start = args[0].i();
        stop = args[1].i();
      }
      if (args.size() == 3) step = args[2].i();
      if (step == 0 || args.empty() || args.size() > 3)
        return absl::InvalidArgumentError("bad range()");
      ValueList out;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (out.size() > 100000) return absl::InvalidArgumentError("range() too long");
        out.push_back(Value::Int(i));
      }
      return Value::List(std::move(out));
    });
  }
  if (name == "raise_exception") {
    return Value::Function([](const ValueList& args, const Kwargs&) -> absl::StatusOr<Value> {
      return absl::InvalidArgumentError(std::string(kRaisedPrefix) +
                                        (args.empty() ? "" : args[0].Str()));
    });
  }
  if (name == "strftime_now") {
    return Value::Function([](const ValueList& args, const Kwargs&) -> absl::StatusOr<Value> {
      const std::time_t now = std::time(nullptr);
      std::tm local;
      localtime_r(&now, &local);
      char buf[256];
      const std::string fmt = args.empty() ? "%Y-%m-%d" : args[0].Str();
      const size_t n = std::strftime(buf, sizeof(buf), fmt.c_str(), &local);
      return Value::String(std::string(buf, n));
    });
  }
  return Fail(line, "unknown function " + name);
}

absl::StatusOr<Value> CallMethod(const Value& obj, const std::string& name, const ValueList& args,
                                 const Kwargs& kwargs, int line) {
  if (obj.is_string()) {
    const std::string& s = obj.s();
    const Value* a0 = Arg(args, 0, kwargs, "");
    if (name == "strip") return Value::String(Strip(s, a0, true, true));
    if (name == "lstrip") return Value::String(Strip(s, a0, true, false));
    if (name == "rstrip") return Value::String(Strip(s, a0, false, true));
    if (name == "lower") return Value::String(CaseMap(s, 0));
    if (name == "upper") return Value::String(CaseMap(s, 1));
    if (name == "title") return Value::String(CaseMap(s, 2));
    if (name == "capitalize") return Value::String(Capitalize(s));
    if (name == "split" || name == "rsplit") {
      const Value* sep = Arg(args, 0, kwargs, "sep");
      const Value* max = Arg(args, 1, kwargs, "maxsplit");
      return SplitString(s, sep, max && max->kind() == Value::Kind::kInt ? max->i() : -1,
                         name == "rsplit");
    }
    if (name == "splitlines") {
      ValueList lines;
      size_t pos = 0;
      while (pos < s.size()) {
        size_t end = s.find_first_of("\r\n", pos);
        if (end == std::string::npos) end = s.size();
        lines.push_back(Value::String(s.substr(pos, end - pos)));
        pos = end + (s.compare(end, 2, "\r\n") == 0 ? 2 : 1);
      }
      return Value::List(std::move(lines));
    }
    if (name == "startswith" || name == "endswith") {
      if (!a0) return Fail(line, name + "() needs an argument");
      ValueList options = a0->is_list() ? a0->list() : ValueList{*a0};
      for (const Value& o : options) {
        const std::string p = o.Str();
        const bool hit =
            name == "startswith"
                ? s.compare(0, p.size(), p) == 0
                : s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
        if (hit) return Value::Bool(true);
      }
      return Value::Bool(false);
    }
    if (name == "replace") {
      if (args.size() < 2) return Fail(line, "replace() needs two arguments");
      const std::string from = args[0].Str(), to = args[1].Str();
      int64_t count = args.size() > 2 && args[2].kind() == Value::Kind::kInt ? args[2].i() : -1;
      std::string out;
      size_t pos = 0;
      if (from.empty()) return Value::String(s);
      while (count != 0) {
        const size_t at = s.find(from, pos);
        if (at == std::string::npos) break;
        out += s.substr(pos, at - pos) + to;
        pos = at + from.size();
        --count;
      }
      return Value::String(out + s.substr(pos));
    }
    if (name == "find" || name == "rfind") {
      if (!a0) return Fail(line, name + "() needs an argument");
      return Value::Int(CodePointIndex(s, name == "find" ? s.find(a0->Str()) : s.rfind(a0->Str())));
    }
    if (name == "count") {
      if (!a0 || a0->Str().empty()) return Fail(line, "count() needs a non-empty argument");
      int64_t n = 0;
      for (size_t pos = s.find(a0->Str()); pos != std::string::npos;
           pos = s.find(a0->Str(), pos + a0->Str().size()))
        ++n;
      return Value::Int(n);
    }
    if (name == "join") {
      if (!a0) return Fail(line, "join() needs an argument");
      ASSIGN_OR_RETURN(ValueList items, Iterate(*a0));
      std::vector<std::string> parts;
      for (const Value& v : items) parts.push_back(v.Str());
      return Value::String(absl::StrJoin(parts, s));
    }
    auto all_chars = [&](auto pred) {
      const std::vector<char32_t> cps = Chars(s);
      return !cps.empty() && std::all_of(cps.begin(), cps.end(), pred);
    };
    if (name == "isdigit")
      return Value::Bool(all_chars([](char32_t c) { return u_isdigit(c) != 0; }));
    if (name == "isalpha")
      return Value::Bool(all_chars([](char32_t c) { return u_isalpha(c) != 0; }));
    if (name == "isalnum")
      return Value::Bool(all_chars([](char32_t c) { return u_isalnum(c) != 0; }));
    if (name == "isspace") return Value::Bool(all_chars(IsPythonSpace));
    if (name == "islower") return Value::Bool(CaseMap(s, 0) == s && CaseMap(s, 1) != s);
    if (name == "isupper") return Value::Bool(CaseMap(s, 1) == s && CaseMap(s, 0) != s);
  }
  if (obj.is_mapping()) {
    if (name == "get") {
      const Value* key = Arg(args, 0, kwargs, "key");
      if (!key) return Fail(line, "get() needs a key");
      if (const Value* v = obj.dict().Find(key->Str())) return *v;
      const Value* def = Arg(args, 1, kwargs, "default");
      return def ? *def : Value::None();
    }
    if (name == "items" || name == "keys" || name == "values") {
      ValueList out;
      for (const auto& [k, v] : obj.dict().items) {
        if (name == "items") out.push_back(Value::List({Value::String(k), v}));
        if (name == "keys") out.push_back(Value::String(k));
        if (name == "values") out.push_back(v);
      }
      return Value::List(std::move(out));
    }
  }
  if (obj.is_undefined()) return Fail(line, "cannot call ." + name + "() on an undefined value");
  return Fail(line, std::string("'") + obj.TypeName() + "' has no method '" + name + "'");
}

}  // namespace strata::jinja
