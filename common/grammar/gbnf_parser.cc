// GBNF text to a Grammar (grammar.h): the parser of the notation, and the builder that
// turns its items into byte-level rules (repetitions as helper rules, classes as UTF-8
// byte sequences) and checks the result (size, finite strings, left recursion).
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/grammar/grammar.h"
#include "common/tokenizer/utf8.h"

namespace strata::grammar {

namespace {

constexpr int kMaxNullableRun = 10000;  // items in a row that may match nothing

using Range = CodePointRange;

int Utf8Length(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

// Byte-range sequences whose UTF-8 strings are exactly the code points [lo, hi] (no
// surrogates), as the usual splitting: first by encoded length, then until every
// continuation byte spans its full range or the leading bytes agree.
void Utf8Sequences(uint32_t lo, uint32_t hi,
                   std::vector<std::vector<std::pair<uint8_t, uint8_t>>>* out) {
  if (lo > hi) return;
  if (lo <= 0xDFFF && hi >= 0xD800) {  // surrogates are not characters
    if (lo < 0xD800) Utf8Sequences(lo, 0xD7FF, out);
    if (hi > 0xDFFF) Utf8Sequences(0xE000, hi, out);
    return;
  }
  for (uint32_t limit : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= limit && hi > limit) {
      Utf8Sequences(lo, limit, out);
      Utf8Sequences(limit + 1, hi, out);
      return;
    }
  }
  const int n = Utf8Length(lo);
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        Utf8Sequences(lo, lo | m, out);
        Utf8Sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        Utf8Sequences(lo, (hi & ~m) - 1, out);
        Utf8Sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  std::string a, b;
  utf8::Append(lo, a);
  utf8::Append(hi, b);
  std::vector<std::pair<uint8_t, uint8_t>> seq;
  for (size_t k = 0; k < a.size(); ++k) {
    seq.emplace_back(static_cast<uint8_t>(a[k]), static_cast<uint8_t>(b[k]));
  }
  out->push_back(std::move(seq));
}

}  // namespace

// Builds a Grammar from parsed rules: each item becomes elements, repetitions become
// helper rules, and character classes with non-ASCII members become helper rules of
// UTF-8 byte sequences.
class Builder {
 public:
  struct Item {  // one element before flattening
    bool is_rule = false;
    int32_t value = 0;  // byte-set index or rule index
  };
  using Alternative = std::vector<Item>;

  int NewRule(std::string name) {
    rules_.emplace_back();
    names_.push_back(std::move(name));
    return static_cast<int>(rules_.size()) - 1;
  }
  int ByteSet(const std::bitset<256>& set) {
    auto [it, inserted] = set_index_.try_emplace(set.to_string(), static_cast<int>(sets_.size()));
    if (inserted) sets_.push_back(set);
    return it->second;
  }
  Item Bytes(uint8_t lo, uint8_t hi) {
    std::bitset<256> s;
    for (int b = lo; b <= hi; ++b) s.set(b);
    return {false, ByteSet(s)};
  }
  // A set of code-point ranges as one item.
  Item Class(std::vector<Range> ranges) {
    std::bitset<256> ascii;
    std::vector<std::vector<std::pair<uint8_t, uint8_t>>> sequences;
    for (auto [lo, hi] : ranges) {
      for (uint32_t c = lo; c <= std::min<uint32_t>(hi, 0x7F); ++c) ascii.set(c);
      if (hi >= 0x80) Utf8Sequences(std::max<uint32_t>(lo, 0x80), hi, &sequences);
    }
    if (sequences.empty()) return {false, ByteSet(ascii)};
    const int rule = NewRule("<class>");
    if (ascii.any()) rules_[rule].push_back({{false, ByteSet(ascii)}});
    for (const auto& seq : sequences) {
      Alternative alt;
      for (auto [lo, hi] : seq) alt.push_back(Bytes(lo, hi));
      rules_[rule].push_back(std::move(alt));
    }
    return {true, rule};
  }
  Item Group(std::vector<Alternative> alternatives) {
    if (alternatives.size() == 1 && alternatives[0].size() == 1) return alternatives[0][0];
    const int rule = NewRule("<group>");
    rules_[rule] = std::move(alternatives);
    return {true, rule};
  }
  // x{min,max}; max < 0: unbounded.
  absl::StatusOr<Alternative> Repeat(Item x, int min, int max) {
    Alternative out(min, x);
    if (max < 0) {
      const int star = NewRule("<star>");
      rules_[star] = {{x, {true, star}}, {}};
      out.push_back({true, star});
    } else if (max > min) {
      // opt_k ::= x opt_{k-1} | empty, nested so that at most max - min more follow.
      int inner = -1;
      for (int k = 0; k < max - min; ++k) {
        const int opt = NewRule("<opt>");
        Alternative more = {x};
        if (inner >= 0) more.push_back({true, inner});
        rules_[opt] = {std::move(more), {}};
        inner = opt;
        if (static_cast<int>(rules_.size()) > kMaxRules) break;
      }
      out.push_back({true, inner});
    }
    if (static_cast<int>(rules_.size()) > kMaxRules || out.size() > kMaxElements) {
      return absl::InvalidArgumentError("the grammar is too large (repetition counts)");
    }
    return out;
  }

  std::vector<std::vector<Alternative>>& rules() { return rules_; }
  const std::vector<std::string>& names() const { return names_; }

  absl::StatusOr<std::shared_ptr<const Grammar>> Finish(int root) {
    auto g = std::make_shared<Grammar>();
    g->byte_sets_ = sets_;
    g->root_ = root;
    size_t elements = 0;
    for (const auto& rule : rules_) {
      for (const auto& alt : rule) elements += alt.size() + 1;
    }
    if (static_cast<int>(rules_.size()) > kMaxRules || elements > kMaxElements) {
      return absl::InvalidArgumentError(absl::StrCat("the grammar is too large: ", rules_.size(),
                                                     " rules, ", elements, " elements"));
    }
    // Alternatives that can never finish (they use a rule with no finite string) are
    // dropped, so that the matcher never walks into them; a root with none left is an error.
    const std::vector<bool> productive = Closure(/*bytes_count=*/true);
    if (!productive[root]) {
      return absl::InvalidArgumentError("the grammar admits no finite string");
    }
    // Long runs of items that may match nothing are expanded item by item on every byte
    // that reaches them: refused past a bound (the matcher's own budget catches the rest).
    const std::vector<bool> nullable = Closure(/*bytes_count=*/false);
    for (const auto& rule : rules_) {
      for (const Alternative& alt : rule) {
        int run = 0;
        for (const Item& i : alt) {
          run = i.is_rule && nullable[i.value] ? run + 1 : 0;
          if (run > kMaxNullableRun) {
            return absl::InvalidArgumentError(absl::StrCat(
                "the grammar has more than ", kMaxNullableRun,
                " items in a row that may match nothing, beyond the matcher's limits"));
          }
        }
      }
    }
    for (auto& rule : rules_) {
      rule.erase(std::remove_if(rule.begin(), rule.end(),
                                [&](const Alternative& alt) {
                                  for (const Item& i : alt) {
                                    if (i.is_rule && !productive[i.value]) return true;
                                  }
                                  return false;
                                }),
                 rule.end());
    }
    g->rules_.resize(rules_.size());
    for (size_t r = 0; r < rules_.size(); ++r) {
      for (const auto& alt : rules_[r]) {
        g->rules_[r].push_back(static_cast<int32_t>(g->elements_.size()));
        for (const Item& item : alt) {
          g->elements_.push_back(
              {item.is_rule ? Element::Kind::kRule : Element::Kind::kBytes, item.value});
        }
        g->elements_.push_back({Element::Kind::kEnd, 0});
      }
    }
    if (absl::Status s = CheckLeftRecursion(); !s.ok()) return s;
    return std::shared_ptr<const Grammar>(std::move(g));
  }

 private:
  // Rules with an alternative whose items all qualify: a byte set qualifies when
  // `bytes_count` (productive: has a finite string) or never (nullable: matches nothing),
  // a rule when it is marked. A worklist over the rules' uses: linear in the grammar.
  std::vector<bool> Closure(bool bytes_count) const {
    const size_t n = rules_.size();
    std::vector<bool> marked(n, false);
    std::vector<std::pair<int, int>> alts;  // (rule, items still missing)
    std::vector<std::vector<int>> uses(n);  // rule -> alternatives using it, once per use
    std::vector<int> ready;
    for (size_t r = 0; r < n; ++r) {
      for (const Alternative& alt : rules_[r]) {
        int missing = 0;
        bool possible = true;
        for (const Item& i : alt) {
          if (i.is_rule) {
            ++missing;
          } else {
            possible = possible && bytes_count;
          }
        }
        if (!possible) continue;
        const int id = static_cast<int>(alts.size());
        alts.push_back({static_cast<int>(r), missing});
        for (const Item& i : alt) {
          if (i.is_rule) uses[i.value].push_back(id);
        }
        if (missing == 0) ready.push_back(static_cast<int>(r));
      }
    }
    while (!ready.empty()) {
      const int r = ready.back();
      ready.pop_back();
      if (marked[r]) continue;
      marked[r] = true;
      for (int id : uses[r]) {
        if (--alts[id].second == 0) ready.push_back(alts[id].first);
      }
    }
    return marked;
  }

  // Expansion without consuming a byte must end: a rule may reach itself through leftmost
  // positions only by tail calls (which do not grow the stack).
  absl::Status CheckLeftRecursion() {
    const size_t n = rules_.size();
    const std::vector<bool> nullable = Closure(/*bytes_count=*/false);
    struct Edge {
      int to;
      bool tail;
    };
    std::vector<std::vector<Edge>> edges(n);
    for (size_t r = 0; r < n; ++r) {
      for (const auto& alt : rules_[r]) {
        for (size_t k = 0; k < alt.size(); ++k) {
          if (!alt[k].is_rule) break;
          edges[r].push_back({alt[k].value, k + 1 == alt.size()});
          if (!nullable[alt[k].value]) break;
        }
      }
    }
    // A cycle through a non-tail edge u -> v: u and v in one strongly connected component
    // (Tarjan's algorithm, iterative).
    std::vector<int> index(n, -1), low(n, 0), component(n, -1);
    std::vector<bool> on_stack(n, false);
    std::vector<int> stack;
    int counter = 0, components = 0;
    for (size_t root = 0; root < n; ++root) {
      if (index[root] >= 0) continue;
      std::vector<std::pair<int, size_t>> frames = {{static_cast<int>(root), 0}};
      index[root] = low[root] = counter++;
      stack.push_back(static_cast<int>(root));
      on_stack[root] = true;
      while (!frames.empty()) {
        auto& [u, next] = frames.back();
        if (next < edges[u].size()) {
          const int v = edges[u][next++].to;
          if (index[v] < 0) {
            index[v] = low[v] = counter++;
            stack.push_back(v);
            on_stack[v] = true;
            frames.push_back({v, 0});
          } else if (on_stack[v]) {
            low[u] = std::min(low[u], index[v]);
          }
          continue;
        }
        if (low[u] == index[u]) {
          int w;
          do {
            w = stack.back();
            stack.pop_back();
            on_stack[w] = false;
            component[w] = components;
          } while (w != u);
          ++components;
        }
        const int done = u;
        frames.pop_back();
        if (!frames.empty())
          low[frames.back().first] = std::min(low[frames.back().first], low[done]);
      }
    }
    for (size_t u = 0; u < n; ++u) {
      for (const Edge& e : edges[u]) {
        if (!e.tail && component[u] == component[e.to]) {
          return absl::InvalidArgumentError(
              absl::StrCat("rule '", names_[u], "' is left-recursive"));
        }
      }
    }
    return absl::OkStatus();
  }

  std::vector<std::vector<Alternative>> rules_;
  std::vector<std::string> names_;
  std::vector<std::bitset<256>> sets_;
  std::unordered_map<std::string, int> set_index_;
};

namespace {

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  absl::StatusOr<std::shared_ptr<const Grammar>> Run() {
    SkipSpace(true);
    while (pos_ < text_.size()) {
      std::string name = Name();
      if (name.empty()) return Error("expected a rule name");
      SkipSpace(false);
      if (text_.substr(pos_, 3) != "::=") return Error("expected '::=' after '" + name + "'");
      pos_ += 3;
      const int rule = RuleIndex(name);
      if (defined_.count(rule)) return Error("rule '" + name + "' is defined twice");
      defined_.insert(rule);
      auto alternatives = Alternatives(0);
      if (!alternatives.ok()) return alternatives.status();
      b_.rules()[rule] = std::move(*alternatives);
      SkipSpace(true);
    }
    auto root = index_.find("root");
    if (root == index_.end() || !defined_.count(root->second)) {
      return absl::InvalidArgumentError("the grammar has no 'root' rule");
    }
    for (const auto& [name, rule] : index_) {
      if (!defined_.count(rule)) {
        return absl::InvalidArgumentError("rule '" + name + "' is used but not defined");
      }
    }
    return b_.Finish(root->second);
  }

 private:
  absl::Status Error(const std::string& what) const {
    int line = 1;
    for (size_t i = 0; i < pos_ && i < text_.size(); ++i) line += text_[i] == '\n';
    return absl::InvalidArgumentError(absl::StrCat("grammar line ", line, ": ", what));
  }
  // Spaces and comments; newlines only where a rule may not be going on.
  void SkipSpace(bool newlines) {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c == '#') {
        while (pos_ < text_.size() && text_[pos_] != '\n') ++pos_;
      } else if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
        ++pos_;
      } else {
        break;
      }
    }
  }
  static bool NameChar(char c) { return absl::ascii_isalnum(c) || c == '-' || c == '_'; }
  std::string Name() {
    const size_t start = pos_;
    while (pos_ < text_.size() && NameChar(text_[pos_])) ++pos_;
    return std::string(text_.substr(start, pos_ - start));
  }
  // At a line start: does a new rule begin here (name ::=)?
  bool RuleStartsHere() const {
    size_t p = pos_;
    while (p < text_.size() && NameChar(text_[p])) ++p;
    if (p == pos_) return false;
    while (p < text_.size() && (text_[p] == ' ' || text_[p] == '\t')) ++p;
    return text_.substr(p, 3) == "::=";
  }
  int RuleIndex(const std::string& name) {
    auto [it, inserted] = index_.try_emplace(name, -1);
    if (inserted) it->second = b_.NewRule(name);
    return it->second;
  }

  absl::StatusOr<std::vector<Builder::Alternative>> Alternatives(int depth) {
    if (depth > 100) return Error("groups nested too deeply");
    std::vector<Builder::Alternative> out;
    for (;;) {
      auto seq = Sequence(depth);
      if (!seq.ok()) return seq.status();
      out.push_back(std::move(*seq));
      SkipSpace(depth > 0);
      if (pos_ < text_.size() && text_[pos_] == '|') {
        ++pos_;
        continue;
      }
      // A rule's alternatives may go on on the next line after a newline when it starts
      // with '|'.
      if (depth == 0) {
        size_t p = pos_;
        while (p < text_.size() &&
               (text_[p] == '\n' || text_[p] == ' ' || text_[p] == '\t' || text_[p] == '\r')) {
          ++p;
        }
        if (p < text_.size() && text_[p] == '|') {
          pos_ = p + 1;
          continue;
        }
      }
      return out;
    }
  }

  absl::StatusOr<Builder::Alternative> Sequence(int depth) {
    Builder::Alternative out;
    for (;;) {
      SkipSpace(depth > 0);
      if (pos_ >= text_.size()) return out;
      const char c = text_[pos_];
      if (c == '|' || c == ')' || c == '\n') return out;
      if (depth == 0 && RuleStartsHere()) return out;
      auto item = Primary(depth);
      if (!item.ok()) return item.status();
      // Postfix operators.
      int min = 1, max = 1;
      if (pos_ < text_.size() && (text_[pos_] == '*' || text_[pos_] == '+' || text_[pos_] == '?')) {
        const char op = text_[pos_++];
        min = op == '+' ? 1 : 0;
        max = op == '?' ? 1 : -1;
      } else if (pos_ < text_.size() && text_[pos_] == '{') {
        ++pos_;
        auto number = [&](int* v) {
          const size_t start = pos_;
          int64_t n = 0;
          while (pos_ < text_.size() && absl::ascii_isdigit(text_[pos_])) {
            n = n * 10 + (text_[pos_++] - '0');
            if (n > 100000) return false;
          }
          *v = static_cast<int>(n);
          return pos_ > start;
        };
        if (!number(&min)) return Error("expected a count in {m,n}");
        max = min;
        if (pos_ < text_.size() && text_[pos_] == ',') {
          ++pos_;
          if (!number(&max)) max = -1;
        }
        if (pos_ >= text_.size() || text_[pos_] != '}') return Error("expected '}'");
        ++pos_;
        if (max >= 0 && max < min) return Error("{m,n} with n < m");
      }
      if (min == 1 && max == 1) {
        out.push_back(*item);
        continue;
      }
      auto repeated = b_.Repeat(*item, min, max);
      if (!repeated.ok()) return repeated.status();
      out.insert(out.end(), repeated->begin(), repeated->end());
      if (out.size() > static_cast<size_t>(kMaxElements)) return Error("the grammar is too large");
    }
  }

  // One code point of a literal or class, with escapes.
  absl::StatusOr<uint32_t> CodePoint() {
    if (pos_ >= text_.size()) return Error("unexpected end");
    const unsigned char c = text_[pos_];
    if (c == '\\') {
      if (++pos_ >= text_.size()) return Error("unexpected end after '\\'");
      const char e = text_[pos_++];
      auto hex = [&](int digits) -> absl::StatusOr<uint32_t> {
        uint32_t v = 0;
        for (int i = 0; i < digits; ++i) {
          if (pos_ >= text_.size() || !absl::ascii_isxdigit(text_[pos_])) {
            return Error("bad hex escape");
          }
          const char h = absl::ascii_tolower(text_[pos_++]);
          v = v * 16 + (h <= '9' ? h - '0' : h - 'a' + 10);
        }
        if (v > 0x10FFFF) return Error("code point out of range");
        return v;
      };
      switch (e) {
        case 'n':
          return 0x0Au;
        case 'r':
          return 0x0Du;
        case 't':
          return 0x09u;
        case 'x':
          return hex(2);
        case 'u':
          return hex(4);
        case 'U':
          return hex(8);
        default:
          return static_cast<uint32_t>(static_cast<unsigned char>(e));
      }
    }
    // A UTF-8 character as written.
    const int n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if ((c >= 0x80 && c < 0xC2) || c > 0xF4 || pos_ + n > text_.size()) {
      return Error("invalid UTF-8 in the grammar");
    }
    uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
    for (int i = 1; i < n; ++i) {
      const unsigned char d = text_[pos_ + i];
      if ((d & 0xC0) != 0x80) return Error("invalid UTF-8 in the grammar");
      cp = (cp << 6) | (d & 0x3F);
    }
    pos_ += n;
    return cp;
  }

  absl::StatusOr<Builder::Item> Primary(int depth) {
    const char c = text_[pos_];
    if (c == '"') {
      ++pos_;
      std::string bytes;
      while (pos_ < text_.size() && text_[pos_] != '"') {
        auto cp = CodePoint();
        if (!cp.ok()) return cp.status();
        utf8::Append(*cp, bytes);
      }
      if (pos_ >= text_.size()) return Error("unterminated literal");
      ++pos_;
      std::vector<Builder::Alternative> alt(1);
      for (unsigned char b : bytes) alt[0].push_back(b_.Bytes(b, b));
      if (alt[0].empty()) alt.assign(1, {});  // "" matches the empty string
      return b_.Group(std::move(alt));
    }
    if (c == '[') {
      ++pos_;
      bool negate = false;
      if (pos_ < text_.size() && text_[pos_] == '^') {
        negate = true;
        ++pos_;
      }
      std::vector<Range> ranges;
      while (pos_ < text_.size() && text_[pos_] != ']') {
        auto lo = CodePoint();
        if (!lo.ok()) return lo.status();
        uint32_t hi = *lo;
        if (pos_ + 1 < text_.size() && text_[pos_] == '-' && text_[pos_ + 1] != ']') {
          ++pos_;
          auto h = CodePoint();
          if (!h.ok()) return h.status();
          hi = *h;
          if (hi < *lo) return Error("a class range runs backwards");
        }
        ranges.emplace_back(*lo, hi);
      }
      if (pos_ >= text_.size()) return Error("unterminated character class");
      ++pos_;
      if (negate) ranges = Complement(std::move(ranges));
      bool any = false;  // surrogates are no characters
      for (auto [lo, hi] : ranges) any = any || lo < 0xD800 || hi > 0xDFFF;
      if (!any) return Error("a character class that matches nothing");
      return b_.Class(std::move(ranges));
    }
    if (c == '.') {
      ++pos_;
      return b_.Class({{0, 0x10FFFF}});
    }
    if (c == '(') {
      ++pos_;
      auto alternatives = Alternatives(depth + 1);
      if (!alternatives.ok()) return alternatives.status();
      SkipSpace(true);
      if (pos_ >= text_.size() || text_[pos_] != ')') return Error("expected ')'");
      ++pos_;
      return b_.Group(std::move(*alternatives));
    }
    if (NameChar(c)) return Builder::Item{true, RuleIndex(Name())};
    return Error(absl::StrCat("unexpected '", std::string(1, c), "'"));
  }

  std::string_view text_;
  size_t pos_ = 0;
  Builder b_;
  std::map<std::string, int> index_;
  std::set<int> defined_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<const Grammar>> Grammar::Parse(std::string_view gbnf) {
  auto g = Parser(gbnf).Run();
  if (g.ok() && State::Start(**g).dead()) {
    return absl::InvalidArgumentError(
        "the grammar's start expands beyond the matcher's limits (too ambiguous, or too many "
        "rules in a row that match nothing)");
  }
  return g;
}

}  // namespace strata::grammar
