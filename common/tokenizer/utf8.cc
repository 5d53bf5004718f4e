#include "common/tokenizer/utf8.h"

#include <array>

namespace strata::utf8 {

void Append(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string Encode(char32_t cp) {
  std::string out;
  Append(cp, out);
  return out;
}

namespace {

// Number of bytes a sequence with this lead byte has, and the allowed range of its second
// byte (which excludes overlongs, surrogates and values above U+10FFFF). 0: not a lead.
struct Lead {
  int length;
  uint8_t second_lo, second_hi;
};

Lead LeadInfo(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

// Bytes of the longest valid prefix of a sequence starting at s[i] (at least 1 if s[i] is
// a lead byte), and whether it is complete.
size_t ValidPrefix(std::string_view s, size_t i, bool* complete) {
  const Lead lead = LeadInfo(static_cast<uint8_t>(s[i]));
  *complete = false;
  if (lead.length == 0) return 0;
  if (lead.length == 1) {
    *complete = true;
    return 1;
  }
  size_t n = 1;
  for (; n < static_cast<size_t>(lead.length); ++n) {
    if (i + n >= s.size()) return n;
    const uint8_t b = static_cast<uint8_t>(s[i + n]);
    const bool ok =
        n == 1 ? (b >= lead.second_lo && b <= lead.second_hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) return n;
  }
  *complete = true;
  return n;
}

}  // namespace

size_t SequenceLength(std::string_view s, size_t i) {
  bool complete;
  const size_t n = ValidPrefix(s, i, &complete);
  return complete ? n : 0;
}

std::vector<char32_t> Decode(std::string_view s) {
  std::vector<char32_t> out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    bool complete;
    const size_t n = ValidPrefix(s, i, &complete);
    if (!complete) {
      out.push_back(kReplacement);
      i += n == 0 ? 1 : n;
      continue;
    }
    const uint8_t b0 = static_cast<uint8_t>(s[i]);
    char32_t cp;
    if (n == 1) {
      cp = b0;
    } else if (n == 2) {
      cp = ((b0 & 0x1F) << 6) | (s[i + 1] & 0x3F);
    } else if (n == 3) {
      cp = ((b0 & 0x0F) << 12) | ((s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
    } else {
      cp = ((b0 & 0x07) << 18) | ((s[i + 1] & 0x3F) << 12) | ((s[i + 2] & 0x3F) << 6) |
           (s[i + 3] & 0x3F);
    }
    out.push_back(cp);
    i += n;
  }
  return out;
}

bool IsValid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const size_t n = SequenceLength(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string Sanitize(std::string_view s) {
  if (IsValid(s)) return std::string(s);
  std::string out;
  out.reserve(s.size() + 8);
  size_t i = 0;
  while (i < s.size()) {
    bool complete;
    const size_t n = ValidPrefix(s, i, &complete);
    if (complete) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      Append(kReplacement, out);
      i += n == 0 ? 1 : n;
    }
  }
  return out;
}

size_t EmittablePrefix(std::string_view s) {
  // Only the last (up to 3) bytes can be an incomplete sequence worth waiting for.
  const size_t start = s.size() > 3 ? s.size() - 3 : 0;
  for (size_t i = start; i < s.size(); ++i) {
    const uint8_t b = static_cast<uint8_t>(s[i]);
    if (b < 0x80 || (b >= 0x80 && b <= 0xBF)) continue;  // ASCII or continuation
    bool complete;
    const size_t n = ValidPrefix(s, i, &complete);
    if (!complete && n > 0 && i + n == s.size()) return i;  // a valid prefix cut at the end
  }
  return s.size();
}

namespace {

struct ByteMaps {
  std::array<char32_t, 256> to_unicode{};
  std::array<int, 512> to_byte{};
  ByteMaps() {
    to_byte.fill(-1);
    // Printable bytes map to themselves; the rest map to 256, 257, ... in byte order.
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      to_unicode[b] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(next++);
      to_byte[to_unicode[b]] = b;
    }
  }
};

const ByteMaps& Maps() {
  static const ByteMaps* maps = new ByteMaps;
  return *maps;
}

}  // namespace

char32_t ByteToUnicode(uint8_t byte) { return Maps().to_unicode[byte]; }

int UnicodeToByte(char32_t cp) { return cp < 512 ? Maps().to_byte[cp] : -1; }

}  // namespace strata::utf8
