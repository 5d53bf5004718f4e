#include "common/grammar/regex_grammar.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/grammar/grammar.h"
#include "common/grammar/json_schema.h"
#include "common/tokenizer/utf8.h"

namespace strata::grammar {

namespace {

std::string CodePointEscape(uint32_t cp) { return absl::StrFormat("\\U%08X", cp); }

using Range = CodePointRange;

// Ranges minus [a, b].
std::vector<Range> Subtract(const std::vector<Range>& ranges, uint32_t a, uint32_t b) {
  std::vector<Range> out;
  for (auto [lo, hi] : ranges) {
    if (hi < a || lo > b) {
      out.emplace_back(lo, hi);
      continue;
    }
    if (lo < a) out.emplace_back(lo, a - 1);
    if (hi > b) out.emplace_back(b + 1, hi);
  }
  return out;
}

bool Contains(const std::vector<Range>& ranges, uint32_t cp) {
  for (auto [lo, hi] : ranges) {
    if (lo <= cp && cp <= hi) return true;
  }
  return false;
}

std::string ClassText(const std::vector<Range>& ranges) {
  std::string out = "[";
  for (auto [lo, hi] : ranges) {
    out += CodePointEscape(lo);
    if (hi != lo) out += "-" + CodePointEscape(hi);
  }
  return out + "]";
}

// How a code point is written inside a JSON string.
std::string JsonEscaped(uint32_t cp) {
  if (cp == '"') return "\\\"";
  if (cp == '\\') return "\\\\";
  if (cp == '\n') return "\\n";
  if (cp == '\r') return "\\r";
  if (cp == '\t') return "\\t";
  if (cp == '\b') return "\\b";
  if (cp == '\f') return "\\f";
  if (cp < 0x20) return absl::StrFormat("\\u%04x", cp);
  return utf8::Encode(cp);
}

// A set of code points as a GBNF expression; inside a JSON string, the ones JSON escapes
// are written escaped.
std::string ClassExpression(const std::vector<Range>& ranges, bool json_string) {
  if (!json_string) return ClassText(ranges);
  std::vector<Range> plain = Subtract(Subtract(Subtract(ranges, 0, 0x1F), '"', '"'), '\\', '\\');
  std::vector<std::string> alternatives;
  if (!plain.empty()) alternatives.push_back(ClassText(plain));
  for (uint32_t special = 0; special < 0x20; ++special) {
    if (Contains(ranges, special)) alternatives.push_back(Literal(JsonEscaped(special)));
  }
  for (uint32_t special : {uint32_t{'"'}, uint32_t{'\\'}}) {
    if (Contains(ranges, special)) alternatives.push_back(Literal(JsonEscaped(special)));
  }
  if (alternatives.size() == 1) return alternatives[0];
  return "( " + absl::StrJoin(alternatives, " | ") + " )";
}

// Regular expressions to GBNF expressions.
class RegexTranslator {
 public:
  RegexTranslator(std::string_view re, bool json_string) : re_(re), json_(json_string) {}

  absl::StatusOr<std::string> Run() {
    if (!re_.empty() && re_[0] == '^') ++pos_;
    auto out = Alternation(0);
    if (!out.ok()) return out.status();
    if (pos_ < re_.size() && re_[pos_] == '$' && pos_ + 1 == re_.size()) ++pos_;
    if (pos_ != re_.size()) return Error("unexpected '" + std::string(1, re_[pos_]) + "'");
    return *out;
  }

 private:
  absl::Status Error(const std::string& what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("regular expression '", std::string(re_), "' at ", pos_, ": ", what));
  }
  bool AtEnd() const { return pos_ >= re_.size(); }

  absl::StatusOr<std::string> Alternation(int depth) {
    if (depth > 50) return Error("groups nested too deeply");
    std::vector<std::string> alternatives;
    for (;;) {
      auto seq = Sequence(depth);
      if (!seq.ok()) return seq.status();
      alternatives.push_back(seq->empty() ? "\"\"" : *seq);
      if (!AtEnd() && re_[pos_] == '|') {
        ++pos_;
        continue;
      }
      break;
    }
    if (alternatives.size() == 1) return alternatives[0];
    return "( " + absl::StrJoin(alternatives, " | ") + " )";
  }

  absl::StatusOr<std::string> Sequence(int depth) {
    std::vector<std::string> items;
    while (!AtEnd() && re_[pos_] != '|' && re_[pos_] != ')') {
      if (re_[pos_] == '$' && pos_ + 1 == re_.size()) break;
      auto atom = Atom(depth);
      if (!atom.ok()) return atom.status();
      std::string item = *atom;
      if (!AtEnd() && (re_[pos_] == '*' || re_[pos_] == '+' || re_[pos_] == '?')) {
        item = "( " + item + " )" + re_[pos_++];
      } else if (!AtEnd() && re_[pos_] == '{') {
        const size_t close = re_.find('}', pos_);
        if (close == std::string_view::npos) return Error("unterminated {m,n}");
        item = "( " + item + " )" + std::string(re_.substr(pos_, close - pos_ + 1));
        pos_ = close + 1;
      }
      if (!AtEnd() && re_[pos_] == '?') ++pos_;  // lazy: the same strings match
      if (!AtEnd() && (re_[pos_] == '*' || re_[pos_] == '+' || re_[pos_] == '{')) {
        return Error("a quantifier after a quantifier");
      }
      items.push_back(std::move(item));
    }
    return absl::StrJoin(items, " ");
  }

  absl::StatusOr<uint32_t> Char() {
    const unsigned char c = re_[pos_];
    const int n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (pos_ + n > re_.size()) return Error("invalid UTF-8");
    uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
    for (int i = 1; i < n; ++i) cp = (cp << 6) | (static_cast<unsigned char>(re_[pos_ + i]) & 0x3F);
    pos_ += n;
    return cp;
  }

  // After a backslash: a class escape (ranges) or one code point.
  absl::StatusOr<std::vector<Range>> Escape() {
    if (AtEnd()) return Error("a trailing backslash");
    const char e = re_[pos_++];
    const std::vector<Range> digit = {{'0', '9'}};
    const std::vector<Range> word = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
    const std::vector<Range> space = {{'\t', '\r'}, {' ', ' '}};
    switch (e) {
      case 'd':
        return digit;
      case 'D':
        return Complement(digit);
      case 'w':
        return word;
      case 'W':
        return Complement(word);
      case 's':
        return space;
      case 'S':
        return Complement(space);
      case 'n':
        return std::vector<Range>{{'\n', '\n'}};
      case 'r':
        return std::vector<Range>{{'\r', '\r'}};
      case 't':
        return std::vector<Range>{{'\t', '\t'}};
      case 'f':
        return std::vector<Range>{{'\f', '\f'}};
      case 'v':
        return std::vector<Range>{{'\v', '\v'}};
      case 'u':
      case 'x': {
        const int digits = e == 'u' ? 4 : 2;
        if (pos_ + digits > re_.size()) return Error("a short hex escape");
        uint32_t v = 0;
        for (int i = 0; i < digits; ++i) {
          const char h = re_[pos_++];
          if (!std::isxdigit(static_cast<unsigned char>(h))) return Error("a bad hex escape");
          v = v * 16 +
              (std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (h | 0x20) - 'a' + 10);
        }
        return std::vector<Range>{{v, v}};
      }
      default:
        if (std::isalnum(static_cast<unsigned char>(e))) {
          return Error(absl::StrCat("unsupported escape \\", std::string(1, e),
                                    " (backreferences, \\b and the like)"));
        }
        return std::vector<Range>{{static_cast<uint32_t>(e), static_cast<uint32_t>(e)}};
    }
  }

  absl::StatusOr<std::string> Atom(int depth) {
    const char c = re_[pos_];
    if (c == '(') {
      ++pos_;
      if (!AtEnd() && re_[pos_] == '?') {
        if (pos_ + 1 < re_.size() && re_[pos_ + 1] == ':') {
          pos_ += 2;
        } else {
          return Error("lookaround and named groups are not supported");
        }
      }
      auto inner = Alternation(depth + 1);
      if (!inner.ok()) return inner.status();
      if (AtEnd() || re_[pos_] != ')') return Error("expected ')'");
      ++pos_;
      return "( " + *inner + " )";
    }
    if (c == '[') {
      ++pos_;
      bool negate = false;
      if (!AtEnd() && re_[pos_] == '^') {
        negate = true;
        ++pos_;
      }
      std::vector<Range> ranges;
      bool first = true;
      while (!AtEnd() && (re_[pos_] != ']' || first)) {
        first = false;
        std::vector<Range> item;
        if (re_[pos_] == '\\') {
          ++pos_;
          auto e = Escape();
          if (!e.ok()) return e.status();
          item = *e;
        } else {
          auto cp = Char();
          if (!cp.ok()) return cp.status();
          item = {{*cp, *cp}};
        }
        if (item.size() == 1 && item[0].first == item[0].second && pos_ + 1 < re_.size() &&
            re_[pos_] == '-' && re_[pos_ + 1] != ']') {
          ++pos_;
          uint32_t hi;
          if (re_[pos_] == '\\') {
            ++pos_;
            auto e = Escape();
            if (!e.ok()) return e.status();
            if (e->size() != 1 || (*e)[0].first != (*e)[0].second) return Error("a bad range");
            hi = (*e)[0].first;
          } else {
            auto cp = Char();
            if (!cp.ok()) return cp.status();
            hi = *cp;
          }
          if (hi < item[0].first) return Error("a range that runs backwards");
          item[0].second = hi;
        }
        ranges.insert(ranges.end(), item.begin(), item.end());
      }
      if (AtEnd()) return Error("an unterminated class");
      ++pos_;
      if (negate) ranges = Complement(ranges);
      if (ranges.empty()) return Error("a class that matches nothing");
      return ClassExpression(ranges, json_);
    }
    if (c == '.') {
      ++pos_;
      return ClassExpression(Complement({{'\n', '\n'}}), json_);
    }
    if (c == '\\') {
      ++pos_;
      auto e = Escape();
      if (!e.ok()) return e.status();
      return ClassExpression(*e, json_);
    }
    if (c == '*' || c == '+' || c == '?' || c == '{')
      return Error("a quantifier with nothing to repeat");
    if (c == '^' || c == '$') return Error("anchors are allowed only at the ends");
    auto cp = Char();
    if (!cp.ok()) return cp.status();
    return json_ ? Literal(JsonEscaped(*cp)) : ClassExpression({{*cp, *cp}}, false);
  }

  std::string_view re_;
  bool json_;
  size_t pos_ = 0;
};

}  // namespace

absl::StatusOr<std::string> RegexExpression(std::string_view regex, bool json_string) {
  return RegexTranslator(regex, json_string).Run();
}

absl::StatusOr<std::string> RegexGrammar(std::string_view regex) {
  auto body = RegexExpression(regex, /*json_string=*/false);
  if (!body.ok()) return body.status();
  return "root ::= " + *body + "\n";
}

}  // namespace strata::grammar
