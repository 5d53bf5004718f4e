#include "server/jinja/jinja_value.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace strata::jinja {
namespace {

// Python's repr of a float: the shortest digits that round-trip, in positional form for
// exponents in [-4, 16), scientific otherwise ("1e-05", "1e+16").
std::string PythonFloat(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  int precision = 1;
  for (; precision <= 17; ++precision) {
    snprintf(buf, sizeof(buf), "%.*e", precision - 1, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  // buf is "[-]d.ddde[+-]xx"; split digits and exponent.
  std::string s(buf);
  const size_t e = s.find('e');
  const int exponent = std::atoi(s.c_str() + e + 1);
  std::string digits;
  bool negative = false;
  for (size_t i = 0; i < e; ++i) {
    if (s[i] == '-') negative = true;
    if (s[i] >= '0' && s[i] <= '9') digits.push_back(s[i]);
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    if (exponent >= 0) {
      if (static_cast<int>(digits.size()) <= exponent + 1) {
        out += digits + std::string(exponent + 1 - digits.size(), '0') + ".0";
      } else {
        out += digits.substr(0, exponent + 1) + "." + digits.substr(exponent + 1);
      }
    } else {
      out += "0." + std::string(-exponent - 1, '0') + digits;
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp_buf[16];
    snprintf(exp_buf, sizeof(exp_buf), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += exp_buf;
  }
  return out;
}

std::string PythonRepr(const std::string& s) {
  const bool use_double = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char quote = use_double ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c == static_cast<unsigned char>(quote)) {
          out += '\\';
          out += static_cast<char>(c);
        } else if (c < 0x20 || c == 0x7f) {
          char buf[8];
          snprintf(buf, sizeof(buf), "\\x%02x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += quote;
  return out;
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

}  // namespace

const Value* ValueDict::Find(const std::string& key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

Value* ValueDict::Find(const std::string& key) {
  for (auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void ValueDict::Set(const std::string& key, Value value) {
  if (Value* existing = Find(key)) {
    *existing = std::move(value);
  } else {
    items.emplace_back(key, std::move(value));
  }
}

Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.b_ = b;
  return v;
}
Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  return v;
}
Value Value::Float(double d) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.d_ = d;
  return v;
}
Value Value::String(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.s_ = std::make_shared<std::string>(std::move(s));
  return v;
}
Value Value::List(ValueList items) {
  Value v;
  v.kind_ = Kind::kList;
  v.list_ = std::make_shared<ValueList>(std::move(items));
  return v;
}
Value Value::Dict(ValueDict dict) {
  Value v;
  v.kind_ = Kind::kDict;
  v.dict_ = std::make_shared<ValueDict>(std::move(dict));
  return v;
}
Value Value::Namespace(ValueDict dict) {
  Value v = Dict(std::move(dict));
  v.kind_ = Kind::kNamespace;
  return v;
}
Value Value::Function(Callable fn) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.fn_ = std::make_shared<Callable>(std::move(fn));
  return v;
}

Value Value::FromJson(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return None();
    case nlohmann::ordered_json::value_t::boolean:
      return Bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Int(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_float:
      return Float(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return String(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      ValueList items;
      for (const auto& e : j) items.push_back(FromJson(e));
      return List(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      ValueDict d;
      for (auto it = j.begin(); it != j.end(); ++it)
        d.items.emplace_back(it.key(), FromJson(it.value()));
      return Dict(std::move(d));
    }
    default:
      return None();
  }
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b_;
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return d_ != 0;
    case Kind::kString:
      return !s_->empty();
    case Kind::kList:
      return !list_->empty();
    case Kind::kDict:
      return !dict_->items.empty();
    case Kind::kNamespace:
    case Kind::kCallable:
      return true;
  }
  return false;
}

std::string Value::Str() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kString:
      return *s_;
    default:
      return Repr();
  }
}

std::string Value::Repr() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return b_ ? "True" : "False";
    case Kind::kInt:
      return std::to_string(i_);
    case Kind::kFloat:
      return PythonFloat(d_);
    case Kind::kString:
      return PythonRepr(*s_);
    case Kind::kList: {
      std::vector<std::string> parts;
      for (const Value& v : *list_) parts.push_back(v.Repr());
      return "[" + absl::StrJoin(parts, ", ") + "]";
    }
    case Kind::kDict:
    case Kind::kNamespace: {
      std::vector<std::string> parts;
      for (const auto& [k, v] : dict_->items) parts.push_back(PythonRepr(k) + ": " + v.Repr());
      const std::string body = "{" + absl::StrJoin(parts, ", ") + "}";
      return kind_ == Kind::kNamespace ? "<Namespace " + body + ">" : body;
    }
    case Kind::kCallable:
      return "<function>";
  }
  return "";
}

std::string Value::ToJson(int indent, int depth) const {
  const std::string pad = indent > 0 ? std::string(indent * (depth + 1), ' ') : "";
  const std::string close_pad = indent > 0 ? std::string(indent * depth, ' ') : "";
  const std::string item_sep = indent > 0 ? ",\n" : ", ";
  const std::string open_nl = indent > 0 ? "\n" : "";
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
    case Kind::kCallable:
      return "null";
    case Kind::kBool:
      return b_ ? "true" : "false";
    case Kind::kInt:
      return std::to_string(i_);
    case Kind::kFloat:
      return std::isfinite(d_) ? PythonFloat(d_)
                               : (std::isnan(d_) ? "NaN" : (d_ > 0 ? "Infinity" : "-Infinity"));
    case Kind::kString:
      return JsonString(*s_);
    case Kind::kList: {
      if (list_->empty()) return "[]";
      std::vector<std::string> parts;
      for (const Value& v : *list_) parts.push_back(pad + v.ToJson(indent, depth + 1));
      return "[" + open_nl + absl::StrJoin(parts, item_sep) + open_nl + close_pad + "]";
    }
    case Kind::kDict:
    case Kind::kNamespace: {
      if (dict_->items.empty()) return "{}";
      std::vector<std::string> parts;
      for (const auto& [k, v] : dict_->items) {
        parts.push_back(pad + JsonString(k) + ": " + v.ToJson(indent, depth + 1));
      }
      return "{" + open_nl + absl::StrJoin(parts, item_sep) + open_nl + close_pad + "}";
    }
  }
  return "null";
}

const char* Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "undefined";
    case Kind::kNone:
      return "none";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "string";
    case Kind::kList:
      return "list";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "namespace";
    case Kind::kCallable:
      return "function";
  }
  return "?";
}

bool Equal(const Value& a, const Value& b) {
  using K = Value::Kind;
  const bool a_num = a.is_number() || a.kind() == K::kBool;
  const bool b_num = b.is_number() || b.kind() == K::kBool;
  if (a_num && b_num) {
    const double x = a.kind() == K::kBool ? a.b() : a.AsDouble();
    const double y = b.kind() == K::kBool ? b.b() : b.AsDouble();
    return x == y;
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::kUndefined:
    case K::kNone:
      return true;
    case K::kString:
      return a.s() == b.s();
    case K::kList:
      if (a.list().size() != b.list().size()) return false;
      for (size_t i = 0; i < a.list().size(); ++i) {
        if (!Equal(a.list()[i], b.list()[i])) return false;
      }
      return true;
    case K::kDict:
    case K::kNamespace:
      if (a.dict().items.size() != b.dict().items.size()) return false;
      for (const auto& [k, v] : a.dict().items) {
        const Value* other = b.dict().Find(k);
        if (other == nullptr || !Equal(v, *other)) return false;
      }
      return true;
    default:
      return false;
  }
}

absl::StatusOr<int> Compare(const Value& a, const Value& b) {
  if ((a.is_number() || a.kind() == Value::Kind::kBool) &&
      (b.is_number() || b.kind() == Value::Kind::kBool)) {
    const double x = a.kind() == Value::Kind::kBool ? a.b() : a.AsDouble();
    const double y = b.kind() == Value::Kind::kBool ? b.b() : b.AsDouble();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.s().compare(b.s());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list()) {
    for (size_t i = 0; i < a.list().size() && i < b.list().size(); ++i) {
      auto c = Compare(a.list()[i], b.list()[i]);
      if (!c.ok() || *c != 0) return c;
    }
    return a.list().size() < b.list().size() ? -1 : (a.list().size() > b.list().size() ? 1 : 0);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("cannot compare ", a.TypeName(), " with ", b.TypeName()));
}

}  // namespace strata::jinja
