// Evaluation of parsed templates: Python semantics for expressions, Jinja semantics for
// statements and scopes (a loop body and a macro call get their own scope; namespace
// objects are how state escapes a loop). The built-in filters, tests, functions and
// methods are pure functions in jinja_filters.cc, jinja_is_tests.cc and jinja_methods.cc.
#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/utf8.h"
#include "server/jinja/jinja.h"
#include "server/jinja/jinja_ast.h"
#include "server/jinja/jinja_builtins.h"

namespace strata::jinja {

absl::StatusOr<NodePtr> ParseTemplateSource(std::string_view source);

namespace {

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
        if (v.is_undefined() && KnownFunctions().count(e.name))
          return GlobalFunction(e.name, e.line);
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
      return CallMethod(obj, callee.name, args, kwargs, e.line);
    }
    ASSIGN_OR_RETURN(Value fn, Eval(callee));
    if (fn.kind() != Value::Kind::kCallable) return Fail(e.line, "object is not callable");
    return fn.fn()(args, kwargs);
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

  absl::StatusOr<Value> ApplyTest(const Expr& e) {
    ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
    ASSIGN_OR_RETURN(auto evaluated, EvalArgs(e, 1));
    ASSIGN_OR_RETURN(bool result, RunTest(e.name, v, evaluated.first, e.line));
    return Value::Bool(e.negated ? !result : result);
  }

  absl::StatusOr<Value> ApplyFilter(const Expr& e) {
    ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
    ASSIGN_OR_RETURN(auto evaluated, EvalArgs(e, 1));
    return CallFilter(e.name, v, evaluated.first, evaluated.second, e.line);
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
