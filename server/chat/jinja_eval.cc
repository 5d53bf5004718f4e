// Evaluation of parsed templates: Python semantics for values, Jinja semantics for scopes
// (a loop body and a macro call get their own scope; namespace objects are how state
// escapes a loop), and the built-in filters, tests, functions and methods.
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ctime>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/utf8.h"
#include "server/chat/jinja.h"
#include "server/chat/jinja_ast.h"

namespace strata::jinja {

absl::StatusOr<NodePtr> ParseTemplateSource(std::string_view source);

const std::set<std::string>& KnownFilters() {
  static const std::set<std::string>* names = new std::set<std::string>{
      "abs",    "capitalize", "count",  "d",          "default", "e",          "escape",  "first",
      "float",  "indent",     "int",    "items",      "join",    "last",       "length",  "list",
      "lower",  "map",        "max",    "min",        "reject",  "rejectattr", "replace", "reverse",
      "round",  "safe",       "select", "selectattr", "sort",    "string",     "sum",     "title",
      "tojson", "trim",       "unique", "upper"};
  return *names;
}

const std::set<std::string>& KnownTests() {
  static const std::set<std::string>* names = new std::set<std::string>{
      "boolean", "callable", "defined",  "divisibleby", "eq",   "equalto",   "even",
      "false",   "float",    "ge",       "gt",          "in",   "integer",   "iterable",
      "le",      "lower",    "lt",       "mapping",     "ne",   "none",      "number",
      "odd",     "sameas",   "sequence", "string",      "true", "undefined", "upper"};
  return *names;
}

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

namespace {

using Kwargs = std::vector<std::pair<std::string, Value>>;

absl::Status Fail(int line, const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat("chat template line ", line, ": ", message));
}

// A template's raise_exception(): its message goes to the client as is.
constexpr char kRaisedPrefix[] = "\x01raised:";

bool IsPythonSpace(char32_t c) { return u_isUWhiteSpace(c) || (c >= 0x1c && c <= 0x1f); }

std::vector<char32_t> Chars(const std::string& s) { return utf8::Decode(s); }
std::string FromChars(const std::vector<char32_t>& cps, size_t begin, size_t end) {
  std::string out;
  for (size_t i = begin; i < end; ++i) utf8::Append(cps[i], out);
  return out;
}

std::string Strip(const std::string& s, const Value* chars, bool left, bool right) {
  const std::vector<char32_t> cps = Chars(s);
  std::vector<char32_t> set;
  if (chars && chars->is_string()) set = Chars(chars->s());
  auto strip_this = [&](char32_t c) {
    return set.empty() && !(chars && chars->is_string())
               ? IsPythonSpace(c)
               : std::find(set.begin(), set.end(), c) != set.end();
  };
  size_t b = 0, e = cps.size();
  if (left) {
    while (b < e && strip_this(cps[b])) ++b;
  }
  if (right) {
    while (e > b && strip_this(cps[e - 1])) --e;
  }
  return FromChars(cps, b, e);
}

std::string CaseMap(const std::string& s, int mode) {  // 0 lower, 1 upper, 2 title
  icu::UnicodeString u = icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), s.size()));
  if (mode == 0) u.toLower();
  if (mode == 1) u.toUpper();
  if (mode == 2) u.toTitle(nullptr);
  std::string out;
  u.toUTF8String(out);
  return out;
}

std::string Capitalize(const std::string& s) {
  const std::vector<char32_t> cps = Chars(s);
  if (cps.empty()) return s;
  return CaseMap(FromChars(cps, 0, 1), 1) + CaseMap(FromChars(cps, 1, cps.size()), 0);
}

Value SplitString(const std::string& s, const Value* sep, int64_t maxsplit, bool from_right) {
  ValueList parts;
  if (sep == nullptr || sep->is_none() || sep->is_undefined()) {
    // Runs of whitespace, no empty parts.
    const std::vector<char32_t> cps = Chars(s);
    std::vector<std::pair<size_t, size_t>> words;
    size_t i = 0;
    while (i < cps.size()) {
      while (i < cps.size() && IsPythonSpace(cps[i])) ++i;
      if (i >= cps.size()) break;
      size_t j = i;
      while (j < cps.size() && !IsPythonSpace(cps[j])) ++j;
      words.emplace_back(i, j);
      i = j;
    }
    if (maxsplit >= 0 && static_cast<int64_t>(words.size()) > maxsplit + 1) {
      if (from_right) {
        const size_t keep = words.size() - maxsplit;
        parts.push_back(Value::String(FromChars(cps, words.front().first, words[keep - 1].second)));
        for (size_t w = keep; w < words.size(); ++w) {
          parts.push_back(Value::String(FromChars(cps, words[w].first, words[w].second)));
        }
        return Value::List(std::move(parts));
      }
      for (int64_t w = 0; w < maxsplit; ++w) {
        parts.push_back(Value::String(FromChars(cps, words[w].first, words[w].second)));
      }
      size_t rest = words[maxsplit].first;
      size_t end = cps.size();
      while (end > rest && IsPythonSpace(cps[end - 1])) --end;
      parts.push_back(Value::String(FromChars(cps, rest, end)));
      return Value::List(std::move(parts));
    }
    for (auto [b, e] : words) parts.push_back(Value::String(FromChars(cps, b, e)));
    return Value::List(std::move(parts));
  }
  const std::string& d = sep->s();
  std::vector<std::string> pieces;
  if (d.empty()) return Value::List({Value::String(s)});
  size_t pos = 0;
  while (true) {
    const size_t at = s.find(d, pos);
    if (at == std::string::npos) {
      pieces.push_back(s.substr(pos));
      break;
    }
    pieces.push_back(s.substr(pos, at - pos));
    pos = at + d.size();
  }
  if (maxsplit >= 0 && static_cast<int64_t>(pieces.size()) > maxsplit + 1) {
    std::vector<std::string> merged;
    if (from_right) {
      const size_t keep = pieces.size() - maxsplit;
      std::vector<std::string> head(pieces.begin(), pieces.begin() + keep);
      merged.push_back(absl::StrJoin(head, d));
      merged.insert(merged.end(), pieces.begin() + keep, pieces.end());
    } else {
      merged.assign(pieces.begin(), pieces.begin() + maxsplit);
      std::vector<std::string> tail(pieces.begin() + maxsplit, pieces.end());
      merged.push_back(absl::StrJoin(tail, d));
    }
    pieces = std::move(merged);
  }
  for (auto& p : pieces) parts.push_back(Value::String(p));
  return Value::List(std::move(parts));
}

int64_t CodePointIndex(const std::string& s, size_t byte_pos) {
  if (byte_pos == std::string::npos) return -1;
  return static_cast<int64_t>(Chars(s.substr(0, byte_pos)).size());
}

// Python len().
absl::StatusOr<int64_t> Length(const Value& v) {
  if (v.is_string()) return static_cast<int64_t>(Chars(v.s()).size());
  if (v.is_list()) return static_cast<int64_t>(v.list().size());
  if (v.is_mapping()) return static_cast<int64_t>(v.dict().items.size());
  if (v.is_undefined()) return 0;
  return absl::InvalidArgumentError(
      absl::StrCat("object of type ", v.TypeName(), " has no length"));
}

// Items iteration yields for a value (for loops, filters).
absl::StatusOr<ValueList> Iterate(const Value& v) {
  if (v.is_list()) return v.list();
  if (v.is_mapping()) {
    ValueList keys;
    for (const auto& [k, val] : v.dict().items) keys.push_back(Value::String(k));
    return keys;
  }
  if (v.is_string()) {
    ValueList chars;
    for (char32_t c : Chars(v.s())) chars.push_back(Value::String(utf8::Encode(c)));
    return chars;
  }
  if (v.is_undefined() || v.is_none()) return ValueList{};
  return absl::InvalidArgumentError(absl::StrCat("'", v.TypeName(), "' is not iterable"));
}

const Value* Kw(const Kwargs& kwargs, const std::string& name) {
  for (const auto& [k, v] : kwargs) {
    if (k == name) return &v;
  }
  return nullptr;
}

// Positional or keyword argument.
const Value* Arg(const ValueList& args, size_t index, const Kwargs& kwargs,
                 const std::string& name) {
  if (index < args.size()) return &args[index];
  return Kw(kwargs, name);
}

Value Attribute(const Value& obj, const std::string& name) {
  if (obj.is_mapping()) {
    if (const Value* v = obj.dict().Find(name)) return *v;
  }
  return Value();
}

Value Item(const Value& obj, const Value& key) {
  if (obj.is_mapping()) {
    if (const Value* v = obj.dict().Find(key.Str())) return *v;
    return Value();
  }
  if ((obj.is_list() || obj.is_string()) && key.kind() == Value::Kind::kInt) {
    if (obj.is_list()) {
      int64_t i = key.i();
      const int64_t n = static_cast<int64_t>(obj.list().size());
      if (i < 0) i += n;
      return i >= 0 && i < n ? obj.list()[i] : Value();
    }
    const std::vector<char32_t> cps = Chars(obj.s());
    int64_t i = key.i();
    const int64_t n = static_cast<int64_t>(cps.size());
    if (i < 0) i += n;
    return i >= 0 && i < n ? Value::String(utf8::Encode(cps[i])) : Value();
  }
  return Value();
}

class Evaluator {
 public:
  explicit Evaluator(const ValueDict& context) { scopes_.push_back(context); }

  absl::Status Render(const Node& node, std::string* out) {
    switch (node.kind) {
      case Node::Kind::kSequence:
        for (const NodePtr& child : node.children) {
          RETURN_IF_ERROR(Render(*child, out));
          if (flow_ != Flow::kNormal) break;
        }
        return absl::OkStatus();
      case Node::Kind::kText:
        out->append(node.text);
        return absl::OkStatus();
      case Node::Kind::kOutput: {
        ASSIGN_OR_RETURN(Value v, Eval(*node.expr));
        out->append(v.Str());
        return absl::OkStatus();
      }
      case Node::Kind::kIf:
        for (size_t i = 0; i < node.branches.size(); ++i) {
          if (i < node.conditions.size()) {
            ASSIGN_OR_RETURN(Value c, Eval(*node.conditions[i]));
            if (!c.Truthy()) continue;
          }
          return Render(*node.branches[i], out);
        }
        return absl::OkStatus();
      case Node::Kind::kFor:
        return RenderFor(node, out);
      case Node::Kind::kSet: {
        ASSIGN_OR_RETURN(Value v, Eval(*node.expr));
        return Assign(node, std::move(v));
      }
      case Node::Kind::kSetBlock: {
        std::string body;
        RETURN_IF_ERROR(Render(*node.body, &body));
        return Assign(node, Value::String(std::move(body)));
      }
      case Node::Kind::kMacro:
        DefineMacro(node);
        return absl::OkStatus();
      case Node::Kind::kBreak:
        flow_ = Flow::kBreak;
        return absl::OkStatus();
      case Node::Kind::kContinue:
        flow_ = Flow::kContinue;
        return absl::OkStatus();
    }
    return absl::OkStatus();
  }

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  Value Lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      if (const Value* v = it->Find(name)) return *v;
    }
    return Value();
  }

  absl::Status Assign(const Node& node, Value v) {
    if (node.targets.size() == 1) {
      const std::string& t = node.targets[0];
      const size_t dot = t.find('.');
      if (dot == std::string::npos) {
        scopes_.back().Set(t, std::move(v));
        return absl::OkStatus();
      }
      Value ns = Lookup(t.substr(0, dot));
      if (ns.kind() != Value::Kind::kNamespace) {
        return Fail(node.line,
                    "cannot set an attribute of '" + t.substr(0, dot) + "': not a namespace");
      }
      ns.mutable_dict().Set(t.substr(dot + 1), std::move(v));
      return absl::OkStatus();
    }
    if (!v.is_list() || v.list().size() != node.targets.size()) {
      return Fail(node.line,
                  "cannot unpack into " + std::to_string(node.targets.size()) + " names");
    }
    for (size_t i = 0; i < node.targets.size(); ++i)
      scopes_.back().Set(node.targets[i], v.list()[i]);
    return absl::OkStatus();
  }

  absl::Status RenderFor(const Node& node, std::string* out) {
    ASSIGN_OR_RETURN(Value iterable, Eval(*node.expr));
    auto items_or = Iterate(iterable);
    if (!items_or.ok()) return Fail(node.line, std::string(items_or.status().message()));
    ValueList items = std::move(*items_or);
    auto bind = [&](const Value& item) -> absl::Status {
      if (node.targets.size() == 1) {
        scopes_.back().Set(node.targets[0], item);
        return absl::OkStatus();
      }
      if (!item.is_list() || item.list().size() != node.targets.size()) {
        return Fail(node.line, "cannot unpack a loop item into " +
                                   std::to_string(node.targets.size()) + " names");
      }
      for (size_t i = 0; i < node.targets.size(); ++i)
        scopes_.back().Set(node.targets[i], item.list()[i]);
      return absl::OkStatus();
    };
    if (node.loop_filter) {
      ValueList kept;
      for (const Value& item : items) {
        scopes_.emplace_back();
        absl::Status s = bind(item);
        auto keep = s.ok() ? Eval(*node.loop_filter) : absl::StatusOr<Value>(s);
        scopes_.pop_back();
        if (!keep.ok()) return keep.status();
        if (keep->Truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      if (node.else_body) return Render(*node.else_body, out);
      return absl::OkStatus();
    }
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      scopes_.emplace_back();
      RETURN_IF_ERROR(bind(items[i]));
      ValueDict loop;
      loop.Set("index", Value::Int(i + 1));
      loop.Set("index0", Value::Int(i));
      loop.Set("revindex", Value::Int(n - i));
      loop.Set("revindex0", Value::Int(n - i - 1));
      loop.Set("first", Value::Bool(i == 0));
      loop.Set("last", Value::Bool(i == n - 1));
      loop.Set("length", Value::Int(n));
      loop.Set("previtem", i > 0 ? items[i - 1] : Value());
      loop.Set("nextitem", i + 1 < n ? items[i + 1] : Value());
      scopes_.back().Set("loop", Value::Dict(std::move(loop)));
      absl::Status s = Render(*node.body, out);
      scopes_.pop_back();
      RETURN_IF_ERROR(s);
      if (flow_ == Flow::kBreak) {
        flow_ = Flow::kNormal;
        break;
      }
      flow_ = Flow::kNormal;
    }
    return absl::OkStatus();
  }

  void DefineMacro(const Node& node) {
    const Node* macro = &node;
    scopes_.back().Set(
        node.macro_name,
        Value::Function(
            [this, macro](const ValueList& args, const Kwargs& kwargs) -> absl::StatusOr<Value> {
              scopes_.emplace_back();
              for (size_t i = 0; i < macro->params.size(); ++i) {
                const auto& [name, def] = macro->params[i];
                Value v;
                if (i < args.size()) {
                  v = args[i];
                } else if (const Value* kw = Kw(kwargs, name)) {
                  v = *kw;
                } else if (def) {
                  auto d = Eval(*def);
                  if (!d.ok()) {
                    scopes_.pop_back();
                    return d.status();
                  }
                  v = *d;
                }
                scopes_.back().Set(name, v);
              }
              std::string out;
              absl::Status s = Render(*macro->body, &out);
              flow_ = Flow::kNormal;
              scopes_.pop_back();
              if (!s.ok()) return s;
              return Value::String(std::move(out));
            }));
  }

  absl::StatusOr<Value> Eval(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.literal;
      case Expr::Kind::kName: {
        Value v = Lookup(e.name);
        if (v.is_undefined() && KnownFunctions().count(e.name)) return Global(e.name, e.line);
        return v;
      }
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        ValueList items;
        for (const ExprPtr& a : e.args) {
          ASSIGN_OR_RETURN(Value v, Eval(*a));
          items.push_back(std::move(v));
        }
        return Value::List(std::move(items));
      }
      case Expr::Kind::kDict: {
        ValueDict d;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          ASSIGN_OR_RETURN(Value k, Eval(*e.args[i]));
          ASSIGN_OR_RETURN(Value v, Eval(*e.args[i + 1]));
          d.Set(k.Str(), std::move(v));
        }
        return Value::Dict(std::move(d));
      }
      case Expr::Kind::kGetAttr: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
        return Attribute(obj, e.name);
      }
      case Expr::Kind::kGetItem: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
        if (!e.args[1]) return Fail(e.line, "empty subscript");
        ASSIGN_OR_RETURN(Value key, Eval(*e.args[1]));
        return Item(obj, key);
      }
      case Expr::Kind::kSlice:
        return Slice(e);
      case Expr::Kind::kCall:
        return Call(e);
      case Expr::Kind::kFilter:
        return ApplyFilter(e);
      case Expr::Kind::kTest:
        return ApplyTest(e);
      case Expr::Kind::kNeg:
      case Expr::Kind::kPos: {
        ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        if (v.kind() == Value::Kind::kInt)
          return Value::Int(e.kind == Expr::Kind::kNeg ? -v.i() : v.i());
        if (v.kind() == Value::Kind::kFloat)
          return Value::Float(e.kind == Expr::Kind::kNeg ? -v.AsDouble() : v.AsDouble());
        return Fail(e.line, std::string("bad operand for unary minus: ") + v.TypeName());
      }
      case Expr::Kind::kNot: {
        ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        return Value::Bool(!v.Truthy());
      }
      case Expr::Kind::kAnd: {
        ASSIGN_OR_RETURN(Value l, Eval(*e.args[0]));
        if (!l.Truthy()) return l;
        return Eval(*e.args[1]);
      }
      case Expr::Kind::kOr: {
        ASSIGN_OR_RETURN(Value l, Eval(*e.args[0]));
        if (l.Truthy()) return l;
        return Eval(*e.args[1]);
      }
      case Expr::Kind::kTernary: {
        ASSIGN_OR_RETURN(Value c, Eval(*e.args[0]));
        return Eval(*e.args[c.Truthy() ? 1 : 2]);
      }
      case Expr::Kind::kBinary:
        return Binary(e);
      case Expr::Kind::kCompare:
        return CompareChain(e);
    }
    return Fail(e.line, "bad expression");
  }

  absl::StatusOr<Value> Slice(const Expr& e) {
    ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
    int64_t bounds[3] = {0, 0, 1};
    bool given[3] = {false, false, false};
    for (int k = 0; k < 3; ++k) {
      if (!e.args[k + 1]) continue;
      ASSIGN_OR_RETURN(Value v, Eval(*e.args[k + 1]));
      if (v.is_none()) continue;
      if (v.kind() != Value::Kind::kInt) return Fail(e.line, "slice indices must be integers");
      bounds[k] = v.i();
      given[k] = true;
    }
    const int64_t step = bounds[2];
    if (step == 0) return Fail(e.line, "slice step cannot be zero");
    std::vector<char32_t> cps;
    int64_t n;
    if (obj.is_string()) {
      cps = Chars(obj.s());
      n = static_cast<int64_t>(cps.size());
    } else if (obj.is_list()) {
      n = static_cast<int64_t>(obj.list().size());
    } else {
      return Fail(e.line, std::string("cannot slice ") + obj.TypeName());
    }
    auto clamp = [&](int64_t v, bool is_given, int64_t def) {
      if (!is_given) return def;
      if (v < 0) v += n;
      if (step > 0) return std::clamp<int64_t>(v, 0, n);
      return std::clamp<int64_t>(v, -1, n - 1);
    };
    const int64_t start = clamp(bounds[0], given[0], step > 0 ? 0 : n - 1);
    const int64_t stop = clamp(bounds[1], given[1], step > 0 ? n : -1);
    std::vector<int64_t> idx;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) idx.push_back(i);
    if (obj.is_string()) {
      std::string out;
      for (int64_t i : idx) utf8::Append(cps[i], out);
      return Value::String(out);
    }
    ValueList out;
    for (int64_t i : idx) out.push_back(obj.list()[i]);
    return Value::List(std::move(out));
  }

  absl::StatusOr<std::pair<ValueList, Kwargs>> EvalArgs(const Expr& e, size_t skip) {
    ValueList args;
    Kwargs kwargs;
    for (size_t i = skip; i < e.args.size(); ++i) {
      ASSIGN_OR_RETURN(Value v, Eval(*e.args[i]));
      args.push_back(std::move(v));
    }
    for (const auto& [k, x] : e.kwargs) {
      ASSIGN_OR_RETURN(Value v, Eval(*x));
      kwargs.emplace_back(k, std::move(v));
    }
    return std::make_pair(std::move(args), std::move(kwargs));
  }

  absl::StatusOr<Value> Call(const Expr& e) {
    const Expr& callee = *e.args[0];
    ASSIGN_OR_RETURN(auto evaluated, EvalArgs(e, 1));
    auto& [args, kwargs] = evaluated;
    if (callee.kind == Expr::Kind::kGetAttr) {
      ASSIGN_OR_RETURN(Value obj, Eval(*callee.args[0]));
      Value attr = Attribute(obj, callee.name);
      if (attr.kind() == Value::Kind::kCallable) return attr.fn()(args, kwargs);
      return Method(obj, callee.name, args, kwargs, e.line);
    }
    ASSIGN_OR_RETURN(Value fn, Eval(callee));
    if (fn.kind() != Value::Kind::kCallable) return Fail(e.line, "object is not callable");
    return fn.fn()(args, kwargs);
  }

  absl::StatusOr<Value> Global(const std::string& name, int line) {
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

  absl::StatusOr<Value> Method(const Value& obj, const std::string& name, const ValueList& args,
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
        return Value::Int(
            CodePointIndex(s, name == "find" ? s.find(a0->Str()) : s.rfind(a0->Str())));
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

  absl::StatusOr<Value> Binary(const Expr& e) {
    ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
    ASSIGN_OR_RETURN(Value b, Eval(*e.args[1]));
    const std::string& op = e.name;
    if (op == "~") return Value::String(a.Str() + b.Str());
    using K = Value::Kind;
    const bool nums =
        (a.is_number() || a.kind() == K::kBool) && (b.is_number() || b.kind() == K::kBool);
    auto as_int = [](const Value& v) { return v.kind() == K::kBool ? (v.b() ? 1 : 0) : v.i(); };
    const bool ints = nums && a.kind() != K::kFloat && b.kind() != K::kFloat;
    if (op == "+") {
      if (a.is_string() && b.is_string()) return Value::String(a.s() + b.s());
      if (a.is_list() && b.is_list()) {
        ValueList out = a.list();
        out.insert(out.end(), b.list().begin(), b.list().end());
        return Value::List(std::move(out));
      }
      if (ints) return Value::Int(as_int(a) + as_int(b));
      if (nums) return Value::Float(a.AsDouble() + b.AsDouble());
    } else if (op == "-") {
      if (ints) return Value::Int(as_int(a) - as_int(b));
      if (nums) return Value::Float(a.AsDouble() - b.AsDouble());
    } else if (op == "*") {
      if (ints) return Value::Int(as_int(a) * as_int(b));
      if (nums) return Value::Float(a.AsDouble() * b.AsDouble());
      if (a.is_string() && b.kind() == K::kInt) {
        std::string out;
        for (int64_t i = 0; i < b.i() && out.size() < (1 << 20); ++i) out += a.s();
        return Value::String(out);
      }
    } else if (op == "/") {
      if (nums) {
        if (b.AsDouble() == 0) return Fail(e.line, "division by zero");
        return Value::Float(a.AsDouble() / b.AsDouble());
      }
    } else if (op == "//" || op == "%") {
      if (ints) {
        const int64_t x = as_int(a), y = as_int(b);
        if (y == 0) return Fail(e.line, "division by zero");
        int64_t q = x / y, r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) {
          --q;
          r += y;
        }
        return Value::Int(op == "//" ? q : r);
      }
      if (nums) {
        const double x = a.AsDouble(), y = b.AsDouble();
        if (y == 0) return Fail(e.line, "division by zero");
        const double q = std::floor(x / y);
        return Value::Float(op == "//" ? q : x - q * y);
      }
    } else if (op == "**") {
      if (ints && as_int(b) >= 0) {
        int64_t r = 1;
        for (int64_t i = 0; i < as_int(b) && i < 64; ++i) r *= as_int(a);
        return Value::Int(r);
      }
      if (nums) return Value::Float(std::pow(a.AsDouble(), b.AsDouble()));
    }
    if (a.is_undefined() || b.is_undefined()) {
      return Fail(e.line, "operator '" + op + "' on an undefined value");
    }
    return Fail(e.line, std::string("unsupported operand types for ") + op + ": " + a.TypeName() +
                            " and " + b.TypeName());
  }

  absl::StatusOr<bool> Contains(const Value& item, const Value& container, int line) {
    if (container.is_string()) {
      if (!item.is_string()) return Fail(line, "'in <string>' needs a string");
      return container.s().find(item.s()) != std::string::npos;
    }
    if (container.is_list()) {
      for (const Value& v : container.list()) {
        if (Equal(v, item)) return true;
      }
      return false;
    }
    if (container.is_mapping()) return container.dict().Find(item.Str()) != nullptr;
    if (container.is_undefined() || container.is_none()) return false;
    return Fail(line, std::string("argument of type ") + container.TypeName() + " is not iterable");
  }

  absl::StatusOr<Value> CompareChain(const Expr& e) {
    ASSIGN_OR_RETURN(Value left, Eval(*e.args[0]));
    for (size_t i = 0; i < e.ops.size(); ++i) {
      ASSIGN_OR_RETURN(Value right, Eval(*e.args[i + 1]));
      const std::string& op = e.ops[i];
      bool ok;
      if (op == "==") {
        ok = Equal(left, right);
      } else if (op == "!=") {
        ok = !Equal(left, right);
      } else if (op == "in" || op == "not in") {
        ASSIGN_OR_RETURN(bool in, Contains(left, right, e.line));
        ok = op == "in" ? in : !in;
      } else {
        auto c = Compare(left, right);
        if (!c.ok()) return Fail(e.line, std::string(c.status().message()));
        ok = op == "<" ? *c < 0 : op == ">" ? *c > 0 : op == "<=" ? *c <= 0 : *c >= 0;
      }
      if (!ok) return Value::Bool(false);
      left = std::move(right);
    }
    return Value::Bool(true);
  }

  // Runs test `name` on `v` (for "is" and select/reject).
  absl::StatusOr<bool> Test(const std::string& name, const Value& v, const ValueList& args,
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

  absl::StatusOr<Value> ApplyTest(const Expr& e) {
    ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
    ASSIGN_OR_RETURN(auto evaluated, EvalArgs(e, 1));
    ASSIGN_OR_RETURN(bool result, Test(e.name, v, evaluated.first, e.line));
    return Value::Bool(e.negated ? !result : result);
  }

  absl::StatusOr<Value> ApplyFilter(const Expr& e) {
    ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
    ASSIGN_OR_RETURN(auto evaluated, EvalArgs(e, 1));
    return Filter(e.name, v, evaluated.first, evaluated.second, e.line);
  }

  absl::StatusOr<Value> Filter(const std::string& name, const Value& v, const ValueList& args,
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
      for (const auto& [k, val] : v.dict().items)
        out.push_back(Value::List({Value::String(k), val}));
      return Value::List(std::move(out));
    }
    if (name == "replace") {
      if (args.size() < 2) return Fail(line, "replace needs two arguments");
      return Method(Value::String(v.Str()), "replace", args, kwargs, line);
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
        ASSIGN_OR_RETURN(Value x, Filter(filter, item, rest, {}, line));
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
          ASSIGN_OR_RETURN(result, Test(test, x, test_args, line));
        }
        if (result == keep_when) out.push_back(item);
      }
      return Value::List(std::move(out));
    }
    return Fail(line, "unsupported filter '" + name + "'");
  }

  std::vector<ValueDict> scopes_;
  Flow flow_ = Flow::kNormal;
};

void DefineMacrosFirst(const Node& root, std::vector<const Node*>* macros) {
  for (const NodePtr& child : root.children) {
    if (child->kind == Node::Kind::kMacro) macros->push_back(child.get());
  }
}

}  // namespace

Template::~Template() = default;

absl::StatusOr<std::unique_ptr<Template>> Template::Parse(std::string_view source) {
  auto t = std::unique_ptr<Template>(new Template);
  ASSIGN_OR_RETURN(t->root_, ParseTemplateSource(source));
  return t;
}

absl::StatusOr<std::string> Template::Render(const ValueDict& context) const {
  Evaluator evaluator(context);
  std::vector<const Node*> macros;
  DefineMacrosFirst(*root_, &macros);
  std::string scratch;
  for (const Node* m : macros) {
    absl::Status s = evaluator.Render(*m, &scratch);
    if (!s.ok()) return s;
  }
  std::string out;
  absl::Status status = evaluator.Render(*root_, &out);
  if (!status.ok()) {
    std::string message(status.message());
    const size_t raised = message.find(kRaisedPrefix);
    if (raised != std::string::npos) message = message.substr(raised + std::strlen(kRaisedPrefix));
    return absl::InvalidArgumentError(message);
  }
  return out;
}

}  // namespace strata::jinja
