#include "common/grammar/json_schema.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/grammar/grammar.h"
#include "common/grammar/regex_grammar.h"
#include "nlohmann/json.hpp"

namespace strata::grammar {

namespace {

using Json = nlohmann::ordered_json;  // properties in the order written

// Bounded whitespace: at most one space.
constexpr char kSpace[] = "\" \"?";

constexpr char kJsonRules[] =
    R"(value ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ( member ( "," " "? member )* )? "}"
member ::= string ":" " "? value
array ::= "[" ( value ( "," " "? value )* )? "]"
string ::= "\"" char* "\""
char ::= [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} )
number ::= "-"? integer ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
integer ::= "0" | [1-9] [0-9]*
)";

// Decimal integers in [lo, hi], 0 <= lo <= hi, all of `width` digits (leading zeros
// allowed), as GBNF alternatives.
void PaddedRange(uint64_t lo, uint64_t hi, int width, std::vector<std::string>* out) {
  if (width == 1) {
    out->push_back(lo == hi ? absl::StrCat("\"", lo, "\"") : absl::StrCat("[", lo, "-", hi, "]"));
    return;
  }
  uint64_t unit = 1;
  for (int i = 1; i < width; ++i) unit *= 10;
  const uint64_t a = lo / unit, b = hi / unit;
  const uint64_t la = lo % unit, lb = hi % unit;
  const auto prefixed = [&](uint64_t digit, uint64_t l, uint64_t h) {
    std::vector<std::string> rest;
    PaddedRange(l, h, width - 1, &rest);
    const std::string tail = rest.size() == 1 ? rest[0] : "( " + absl::StrJoin(rest, " | ") + " )";
    out->push_back(absl::StrCat("\"", digit, "\" ", tail));
  };
  if (a == b) {
    prefixed(a, la, lb);
    return;
  }
  uint64_t first = a, last = b;
  if (la != 0) {
    prefixed(a, la, unit - 1);
    ++first;
  }
  const bool full_last = lb == unit - 1;
  if (!full_last) --last;
  if (first <= last && (last != b || full_last)) {
    out->push_back(absl::StrCat(
        first == last ? absl::StrCat("\"", first, "\"") : absl::StrCat("[", first, "-", last, "]"),
        " [0-9]{", width - 1, "}"));
  }
  if (!full_last) prefixed(b, 0, lb);
}

int Digits(uint64_t v) {
  int d = 1;
  while (v >= 10) {
    v /= 10;
    ++d;
  }
  return d;
}

// Canonical decimal integers in [lo, hi] with 0 <= lo <= hi (hi may be UINT64_MAX:
// unbounded).
std::string NonNegativeRange(uint64_t lo, uint64_t hi) {
  std::vector<std::string> alternatives;
  const bool unbounded = hi == UINT64_MAX;
  const int top = unbounded ? Digits(lo) : Digits(hi);
  for (int d = Digits(lo); d <= top; ++d) {
    uint64_t low = 1, high = 9;
    for (int i = 1; i < d; ++i) {
      low *= 10;
      high = high * 10 + 9;
    }
    if (d == 1) low = 0;
    const uint64_t l = std::max(lo, low);
    const uint64_t h = unbounded ? high : std::min(hi, high);
    if (l <= h) PaddedRange(l, h, d, &alternatives);
  }
  if (unbounded) alternatives.push_back(absl::StrCat("[1-9] [0-9]{", Digits(lo), ",}"));
  return alternatives.size() == 1 ? alternatives[0]
                                  : "( " + absl::StrJoin(alternatives, " | ") + " )";
}

// The generic JSON rules with their names prefixed.
std::string JsonRules(const std::string& prefix) {
  if (prefix.empty()) return kJsonRules;
  std::string out;
  // Rule names are whole words outside literals; the rules' literals hold none of them.
  const std::vector<std::string> names = {"value",  "object", "member", "array",
                                          "string", "char",   "number", "integer"};
  std::string_view text = kJsonRules;
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] == '"') {  // copy a literal as it is
      size_t j = i + 1;
      while (j < text.size() && text[j] != '"') j += text[j] == '\\' ? 2 : 1;
      out.append(text.substr(i, j + 1 - i));
      i = j + 1;
      continue;
    }
    if (text[i] == '[') {  // and a class
      size_t j = i + 1;
      while (j < text.size() && text[j] != ']') j += text[j] == '\\' ? 2 : 1;
      out.append(text.substr(i, j + 1 - i));
      i = j + 1;
      continue;
    }
    bool renamed = false;
    for (const std::string& n : names) {
      const bool word_start = i == 0 || !(std::isalnum(static_cast<unsigned char>(text[i - 1])) ||
                                          text[i - 1] == '_' || text[i - 1] == '-');
      const size_t end = i + n.size();
      const bool word_end =
          end >= text.size() || !(std::isalnum(static_cast<unsigned char>(text[end])) ||
                                  text[end] == '_' || text[end] == '-');
      if (word_start && word_end && text.substr(i, n.size()) == n) {
        out += prefix + n;
        i = end;
        renamed = true;
        break;
      }
    }
    if (!renamed) out.push_back(text[i++]);
  }
  return out;
}

class SchemaCompiler {
 public:
  SchemaCompiler(const Json& root, std::string prefix) : root_(root), prefix_(std::move(prefix)) {}

  // The rules (prefixed), and the name of the one matching a value of the schema.
  absl::StatusOr<std::string> Rules(std::string* start) {
    auto rule = RuleFor(root_, "#");
    if (!rule.ok()) return rule.status();
    *start = *rule;
    std::string out;
    for (const auto& [name, body] : rules_) absl::StrAppend(&out, name, " ::= ", body, "\n");
    return out + JsonRules(prefix_);
  }

 private:
  absl::Status Error(const std::string& where, const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat("schema at ", where, ": ", what));
  }

  // The rule name for a subschema (compiled once per location; $ref targets are locations).
  absl::StatusOr<std::string> RuleFor(const Json& schema, const std::string& where) {
    auto it = names_.find(where);
    if (it != names_.end()) return it->second;
    if (depth_ > 64) return Error(where, "the schema is nested more than 64 deep");
    ++depth_;
    absl::Cleanup up = [this] { --depth_; };
    const std::string name = absl::StrCat(prefix_, "s", names_.size());
    names_[where] = name;
    if (names_.size() > 5000) return Error(where, "the schema is too large");
    auto body = Compile(schema, where);
    if (!body.ok()) return body.status();
    rules_.emplace_back(name, *body);
    return name;
  }

  absl::StatusOr<const Json*> Resolve(const std::string& ref, const std::string& where) {
    if (ref == "#") return &root_;
    for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
      const std::string p = prefix;
      if (ref.rfind(p, 0) == 0) {
        const std::string key = p.substr(2, p.size() - 3);
        const std::string name = ref.substr(p.size());
        if (root_.is_object() && root_.contains(key) && root_[key].is_object() &&
            root_[key].contains(name)) {
          return &root_[key][name];
        }
        return Error(where, "$ref '" + ref + "' names nothing");
      }
    }
    return Error(where,
                 "$ref '" + ref + "' is not supported (only #, #/$defs/... and #/definitions/...)");
  }

  absl::StatusOr<std::string> Compile(const Json& s, const std::string& where) {
    if (s.is_boolean()) {
      if (s.get<bool>()) return Base("value");
      return Error(where, "the schema 'false' admits no value");
    }
    if (!s.is_object()) return Error(where, "a schema must be an object or a boolean");
    static const std::set<std::string> kAnnotations = {
        "title",      "description", "default",   "examples", "$schema",     "$id",   "$comment",
        "deprecated", "readOnly",    "writeOnly", "$defs",    "definitions", "strict"};
    static const std::set<std::string> kKeywords = {"type",
                                                    "properties",
                                                    "required",
                                                    "additionalProperties",
                                                    "enum",
                                                    "const",
                                                    "anyOf",
                                                    "oneOf",
                                                    "allOf",
                                                    "$ref",
                                                    "items",
                                                    "minItems",
                                                    "maxItems",
                                                    "minLength",
                                                    "maxLength",
                                                    "pattern",
                                                    "format",
                                                    "minimum",
                                                    "maximum",
                                                    "exclusiveMinimum",
                                                    "exclusiveMaximum",
                                                    "nullable"};
    for (const auto& [key, value] : s.items()) {
      if (!kAnnotations.count(key) && !kKeywords.count(key)) {
        return Error(where, "the keyword '" + key + "' is not supported");
      }
    }
    std::string body;
    if (s.contains("$ref")) {
      if (!s["$ref"].is_string()) return Error(where, "$ref must be a string");
      auto target = Resolve(s["$ref"].get<std::string>(), where);
      if (!target.ok()) return target.status();
      auto rule = RuleFor(**target, s["$ref"].get<std::string>());
      if (!rule.ok()) return rule.status();
      body = *rule;
    } else if (s.contains("const")) {
      body = Literal(s["const"].dump());
    } else if (s.contains("enum")) {
      if (!s["enum"].is_array() || s["enum"].empty())
        return Error(where, "enum must be a non-empty array");
      if (s["enum"].size() > 10000) return Error(where, "enum has more than 10000 values");
      std::vector<std::string> alternatives;
      for (const Json& v : s["enum"]) alternatives.push_back(Literal(v.dump()));
      body = "( " + absl::StrJoin(alternatives, " | ") + " )";
    } else if (s.contains("anyOf") || s.contains("oneOf") || s.contains("allOf")) {
      const char* key = s.contains("anyOf") ? "anyOf" : s.contains("oneOf") ? "oneOf" : "allOf";
      const Json& list = s[key];
      if (!list.is_array() || list.empty())
        return Error(where, std::string(key) + " must be a non-empty array");
      if (std::string(key) == "allOf" && list.size() != 1) {
        return Error(where, "allOf with more than one schema is not supported");
      }
      std::vector<std::string> alternatives;
      for (size_t i = 0; i < list.size(); ++i) {
        auto rule = RuleFor(list[i], absl::StrCat(where, "/", key, "/", i));
        if (!rule.ok()) return rule.status();
        alternatives.push_back(*rule);
      }
      body = "( " + absl::StrJoin(alternatives, " | ") + " )";
    } else {
      std::vector<std::string> types;
      if (!s.contains("type")) {
        types = {"any"};
      } else if (s["type"].is_string()) {
        types = {s["type"].get<std::string>()};
      } else if (s["type"].is_array()) {
        for (const Json& t : s["type"]) {
          if (!t.is_string()) return Error(where, "type must name types");
          types.push_back(t.get<std::string>());
        }
      } else {
        return Error(where, "type must be a string or an array");
      }
      std::vector<std::string> alternatives;
      for (const std::string& t : types) {
        auto alt = Typed(s, t, where);
        if (!alt.ok()) return alt.status();
        alternatives.push_back(*alt);
      }
      body = alternatives.size() == 1 ? alternatives[0]
                                      : "( " + absl::StrJoin(alternatives, " | ") + " )";
    }
    if (s.contains("nullable") && s["nullable"].is_boolean() && s["nullable"].get<bool>()) {
      body = "( " + body + " | \"null\" )";
    }
    return body;
  }

  absl::StatusOr<int64_t> Count(const Json& s, const char* key, const std::string& where) {
    if (!s.contains(key)) return -1;
    if (!s[key].is_number_integer() || s[key].get<int64_t>() < 0) {
      return Error(where, std::string(key) + " must be a non-negative integer");
    }
    if (s[key].get<int64_t>() > 10000)
      return Error(where, std::string(key) + " above 10000 is not supported");
    return s[key].get<int64_t>();
  }

  absl::StatusOr<std::string> Typed(const Json& s, const std::string& type,
                                    const std::string& where) {
    if (type == "any") {
      if (s.contains("properties") || s.contains("required")) return Typed(s, "object", where);
      if (s.contains("items")) return Typed(s, "array", where);
      return Base("value");
    }
    if (type == "null") return std::string("\"null\"");
    if (type == "boolean") return std::string("( \"true\" | \"false\" )");
    if (type == "string") return String(s, where);
    if (type == "integer") return Integer(s, where);
    if (type == "number") return Number(s, where);
    if (type == "array") return Array(s, where);
    if (type == "object") return Object(s, where);
    return Error(where, "unknown type '" + type + "'");
  }

  absl::StatusOr<std::string> String(const Json& s, const std::string& where) {
    auto min = Count(s, "minLength", where);
    auto max = Count(s, "maxLength", where);
    if (!min.ok()) return min.status();
    if (!max.ok()) return max.status();
    if (s.contains("format")) {
      if (!s["format"].is_string()) return Error(where, "format must be a string");
      const std::string f = s["format"].get<std::string>();
      const std::string date =
          "[0-9]{4} \"-\" ( \"0\" [1-9] | \"1\" [0-2] ) \"-\" ( \"0\" [1-9] | \"1\" [0-9] | \"2\" "
          "[0-8] )";
      const std::string time =
          "( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] \"Z\"";
      std::string inner;
      if (f == "date") {
        inner = date;
      } else if (f == "time") {
        inner = time;
      } else if (f == "date-time") {
        inner = date + " \"T\" " + time;
      } else if (f == "uuid") {
        inner =
            "[0-9a-f]{8} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{12}";
      } else if (f == "email") {
        inner = "[a-z0-9]{1,32} \"@\" [a-z0-9]{1,32} ( \".\" [a-z]{2,8} ){1,2}";
      } else {
        return Error(where, "the format '" + f + "' is not supported");
      }
      if (*min >= 0 || *max >= 0 || s.contains("pattern")) {
        return Error(where,
                     "format together with minLength, maxLength or pattern is not supported");
      }
      return "\"\\\"\" " + inner + " \"\\\"\"";
    }
    if (s.contains("pattern")) {
      if (!s["pattern"].is_string()) return Error(where, "pattern must be a string");
      if (*min >= 0 || *max >= 0) {
        return Error(where, "pattern together with minLength or maxLength is not supported");
      }
      auto re = RegexExpression(s["pattern"].get<std::string>(), /*json_string=*/true);
      if (!re.ok()) return Error(where, std::string(re.status().message()));
      return "\"\\\"\" " + *re + " \"\\\"\"";
    }
    const int64_t lo = std::max<int64_t>(*min, 0);
    if (*max >= 0 && *max < lo) return Error(where, "maxLength is below minLength");
    const std::string count =
        *max >= 0 ? absl::StrCat("{", lo, ",", *max, "}") : absl::StrCat("{", lo, ",}");
    return "\"\\\"\" " + Base("char") + count + " \"\\\"\"";
  }

  absl::StatusOr<std::string> Integer(const Json& s, const std::string& where) {
    // Bounds as integers: inclusive [lo, hi].
    std::optional<int64_t> lo, hi;
    for (const char* key : {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"}) {
      if (!s.contains(key)) continue;
      if (!s[key].is_number()) return Error(where, std::string(key) + " must be a number");
      const double v = s[key].get<double>();
      if (std::abs(v) > 1e15)
        return Error(where, std::string(key) + " beyond 1e15 is not supported");
      const std::string k = key;
      if (k == "minimum") lo = std::max(lo.value_or(INT64_MIN), static_cast<int64_t>(std::ceil(v)));
      if (k == "exclusiveMinimum") {
        lo = std::max(lo.value_or(INT64_MIN), static_cast<int64_t>(std::floor(v)) + 1);
      }
      if (k == "maximum")
        hi = std::min(hi.value_or(INT64_MAX), static_cast<int64_t>(std::floor(v)));
      if (k == "exclusiveMaximum") {
        hi = std::min(hi.value_or(INT64_MAX), static_cast<int64_t>(std::ceil(v)) - 1);
      }
    }
    if (lo && hi && *lo > *hi) return Error(where, "the integer bounds admit no value");
    if (!lo && !hi) return "( \"-\"? " + Base("integer") + " )";
    std::vector<std::string> parts;
    // Negative part: -m for m in [max(1, -hi), -lo].
    if (!lo || *lo < 0) {
      const uint64_t m_lo = hi && *hi < 0 ? static_cast<uint64_t>(-*hi) : 1;
      const uint64_t m_hi = lo ? static_cast<uint64_t>(-*lo) : UINT64_MAX;
      if (m_lo <= m_hi) parts.push_back("\"-\" " + NonNegativeRange(m_lo, m_hi));
    }
    if (!hi || *hi >= 0) {
      const uint64_t p_lo = lo && *lo > 0 ? static_cast<uint64_t>(*lo) : 0;
      const uint64_t p_hi = hi ? static_cast<uint64_t>(*hi) : UINT64_MAX;
      if (p_lo <= p_hi) parts.push_back(NonNegativeRange(p_lo, p_hi));
    }
    return parts.size() == 1 ? parts[0] : "( " + absl::StrJoin(parts, " | ") + " )";
  }

  absl::StatusOr<std::string> Number(const Json& s, const std::string& where) {
    const std::string frac = "( \".\" [0-9]{1,16} )?";
    if (s.contains("exclusiveMinimum") || s.contains("exclusiveMaximum")) {
      return Error(where, "exclusive bounds on a number are not supported (use an integer)");
    }
    std::optional<double> lo, hi;
    if (s.contains("minimum")) {
      if (!s["minimum"].is_number()) return Error(where, "minimum must be a number");
      lo = s["minimum"].get<double>();
    }
    if (s.contains("maximum")) {
      if (!s["maximum"].is_number()) return Error(where, "maximum must be a number");
      hi = s["maximum"].get<double>();
    }
    if (!lo && !hi) return Base("number");
    // Expressible: integer bounds with a non-negative minimum.
    const auto whole = [](double v) { return std::floor(v) == v && std::abs(v) < 1e15; };
    if (!lo || *lo < 0 || !whole(*lo) || (hi && (!whole(*hi) || *hi < *lo))) {
      return Error(where,
                   "number bounds are supported when both are whole, the minimum is at least 0 "
                   "and the maximum is not below it");
    }
    const uint64_t l = static_cast<uint64_t>(*lo);
    if (!hi) return "( " + NonNegativeRange(l, UINT64_MAX) + " " + frac + " )";
    const uint64_t h = static_cast<uint64_t>(*hi);
    std::string out = "( ";
    if (h > l) out += NonNegativeRange(l, h - 1) + " " + frac + " | ";
    return out + absl::StrCat("\"", h, "\" ( \".\" \"0\"{1,16} )? )");
  }

  absl::StatusOr<std::string> Array(const Json& s, const std::string& where) {
    auto min = Count(s, "minItems", where);
    auto max = Count(s, "maxItems", where);
    if (!min.ok()) return min.status();
    if (!max.ok()) return max.status();
    std::string item = Base("value");
    if (s.contains("items")) {
      auto rule = RuleFor(s["items"], where + "/items");
      if (!rule.ok()) return rule.status();
      item = *rule;
    }
    const int64_t lo = std::max<int64_t>(*min, 0);
    if (*max >= 0 && *max < lo) return Error(where, "maxItems is below minItems");
    if (*max == 0) return std::string("\"[]\"");
    const std::string more = absl::StrCat("( \",\" ", kSpace, " ", item, " )");
    const std::string tail =
        *max >= 0 ? absl::StrCat(more, "{", std::max<int64_t>(lo - 1, 0), ",", *max - 1, "}")
                  : absl::StrCat(more, "{", std::max<int64_t>(lo - 1, 0), ",}");
    const std::string items = item + " " + tail;
    return lo == 0 ? "\"[\" ( " + items + " )? \"]\"" : "\"[\" " + items + " \"]\"";
  }

  absl::StatusOr<std::string> Object(const Json& s, const std::string& where) {
    if (s.contains("additionalProperties") && !s["additionalProperties"].is_boolean() &&
        !s["additionalProperties"].is_object()) {
      return Error(where, "additionalProperties must be a boolean or a schema");
    }
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) return Error(where, "required must be an array");
      for (const Json& r : s["required"]) {
        if (!r.is_string()) return Error(where, "required must list names");
        required.insert(r.get<std::string>());
      }
    }
    if (!s.contains("properties")) {
      if (!required.empty()) return Error(where, "required names properties that are not declared");
      if (s.contains("additionalProperties") && s["additionalProperties"].is_object()) {
        auto value = RuleFor(s["additionalProperties"], where + "/additionalProperties");
        if (!value.ok()) return value.status();
        const std::string member = absl::StrCat(Base("string"), " \":\" ", kSpace, " ", *value);
        return absl::StrCat("\"{\" ( ", member, " ( \",\" ", kSpace, " ", member, " )* )? \"}\"");
      }
      if (s.contains("additionalProperties") && !s["additionalProperties"].get<bool>()) {
        return std::string("\"{}\"");
      }
      return Base("object");
    }
    if (!s["properties"].is_object()) return Error(where, "properties must be an object");
    struct Member {
      std::string text;
      bool required;
    };
    std::vector<Member> members;
    for (const auto& [name, sub] : s["properties"].items()) {
      auto rule = RuleFor(sub, where + "/properties/" + name);
      if (!rule.ok()) return rule.status();
      members.push_back({absl::StrCat(Literal(Json(name).dump()), " \":\" ", kSpace, " ", *rule),
                         required.count(name) > 0});
      required.erase(name);
    }
    if (!required.empty()) {
      return Error(where,
                   "required names '" + *required.begin() + "', which properties does not declare");
    }
    // rest(i, after): members i.. given whether one was written before (then a comma).
    std::string next[2] = {"\"\"", "\"\""};
    for (size_t i = members.size(); i-- > 0;) {
      std::string cur[2];
      for (int after = 0; after < 2; ++after) {
        const std::string sep = after ? absl::StrCat("\",\" ", kSpace, " ") : "";
        const std::string take = absl::StrCat(sep, members[i].text, " ", next[1]);
        const std::string body =
            members[i].required ? take : absl::StrCat("( ", take, " ) | ", next[after]);
        const std::string name = absl::StrCat(prefix_, "s", names_.size(), "m");
        names_[absl::StrCat(where, "#member", i, "_", after)] = name;
        rules_.emplace_back(name, body);
        cur[after] = name;
      }
      next[0] = cur[0];
      next[1] = cur[1];
    }
    return absl::StrCat("\"{\" ", next[0], " \"}\"");
  }

  std::string Base(const char* name) const { return prefix_ + name; }

  const Json& root_;
  std::string prefix_;
  int depth_ = 0;
  std::map<std::string, std::string> names_;  // location -> rule
  std::vector<std::pair<std::string, std::string>> rules_;
};

}  // namespace

std::string Literal(std::string_view bytes) {
  std::string out = "\"";
  for (unsigned char c : bytes) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c < 0x20 || c == 0x7F) {
      absl::StrAppendFormat(&out, "\\x%02X", c);
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out + "\"";
}

std::string JsonObjectGrammar() {
  return absl::StrCat("root ::= ", kSpace, " object\n", kJsonRules);
}

absl::StatusOr<std::string> JsonSchemaRules(std::string_view schema_json, const std::string& prefix,
                                            std::string* start) {
  if (schema_json.size() > (4 << 20)) {
    return absl::InvalidArgumentError("the schema is larger than 4 MiB");
  }
  Json schema = Json::parse(schema_json, nullptr, /*allow_exceptions=*/false);
  if (schema.is_discarded()) return absl::InvalidArgumentError("the schema is not valid JSON");
  return SchemaCompiler(schema, prefix).Rules(start);
}

absl::StatusOr<std::string> JsonSchemaGrammar(std::string_view schema_json) {
  std::string start;
  auto rules = JsonSchemaRules(schema_json, "", &start);
  if (!rules.ok()) return rules.status();
  return absl::StrCat("root ::= ", kSpace, " ", start, "\n", *rules);
}

std::string ChoiceGrammar(const std::vector<std::string>& choices) {
  std::vector<std::string> alternatives;
  for (const std::string& c : choices) alternatives.push_back(Literal(c));
  return "root ::= " + absl::StrJoin(alternatives, " | ") + "\n";
}

}  // namespace strata::grammar
