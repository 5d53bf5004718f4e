// Operations on template values shared by the evaluator and the built-ins: the cores of
// Python's string methods, len(), iteration, argument lookup, attribute and item access,
// and `in`.
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/utf8.h"
#include "server/jinja/jinja_builtins.h"

namespace strata::jinja {
namespace {

std::string FromChars(const std::vector<char32_t>& cps, size_t begin, size_t end) {
  std::string out;
  for (size_t i = begin; i < end; ++i) utf8::Append(cps[i], out);
  return out;
}

}  // namespace

absl::Status Fail(int line, const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat("chat template line ", line, ": ", message));
}

bool IsPythonSpace(char32_t c) { return u_isUWhiteSpace(c) || (c >= 0x1c && c <= 0x1f); }

std::vector<char32_t> Chars(const std::string& s) { return utf8::Decode(s); }

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

}  // namespace strata::jinja
