// The lexer of the Jinja interpreter (see jinja_lex.h).
#include "server/jinja/jinja_lex.h"

#include <cctype>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/utf8.h"

namespace strata::jinja {

absl::Status Error(int line, const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat("chat template line ", line, ": ", message));
}

namespace {

bool IsSpaceOrTab(char c) { return c == ' ' || c == '\t'; }

// Lexes the inside of a tag from `pos` to its closing delimiter. Sets *strip_after when
// the tag ends with "-}}" / "-%}".
absl::Status LexTag(const std::string& src, size_t* pos, const std::string& close, int* line,
                    std::vector<Token>* out, bool* strip_after) {
  static const char* kOps[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*",
                               "/",  "%",  "~",  "<",  ">",  "=",  "(", ")", "[",
                               "]",  "{",  "}",  ".",  ",",  ":",  "|"};
  size_t i = *pos;
  *strip_after = false;
  while (true) {
    if (i >= src.size()) return Error(*line, "unterminated tag (missing '" + close + "')");
    const char c = src[i];
    if (c == '\n') ++*line;
    if (std::isspace(static_cast<unsigned char>(c))) {
      ++i;
      continue;
    }
    if (c == '-' && src.compare(i + 1, close.size(), close) == 0) {
      *strip_after = true;
      *pos = i + 1 + close.size();
      return absl::OkStatus();
    }
    if (c == '+' && src.compare(i + 1, close.size(), close) == 0) {  // "+%}": no trim
      *pos = i + 1 + close.size();
      return absl::OkStatus();
    }
    if (src.compare(i, close.size(), close) == 0) {
      *pos = i + close.size();
      return absl::OkStatus();
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < src.size() && (std::isalnum(static_cast<unsigned char>(src[j])) || src[j] == '_'))
        ++j;
      out->push_back({Token::Kind::kName, src.substr(i, j - i), *line});
      i = j;
      continue;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      bool is_float = false;
      while (j < src.size() && (std::isdigit(static_cast<unsigned char>(src[j])) || src[j] == '_'))
        ++j;
      if (j + 1 < src.size() && src[j] == '.' &&
          std::isdigit(static_cast<unsigned char>(src[j + 1]))) {
        is_float = true;
        ++j;
        while (j < src.size() && std::isdigit(static_cast<unsigned char>(src[j]))) ++j;
      }
      if (j < src.size() && (src[j] == 'e' || src[j] == 'E')) {
        size_t k = j + 1;
        if (k < src.size() && (src[k] == '+' || src[k] == '-')) ++k;
        if (k < src.size() && std::isdigit(static_cast<unsigned char>(src[k]))) {
          is_float = true;
          j = k;
          while (j < src.size() && std::isdigit(static_cast<unsigned char>(src[j]))) ++j;
        }
      }
      std::string text = src.substr(i, j - i);
      text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
      out->push_back({is_float ? Token::Kind::kFloat : Token::Kind::kInt, text, *line});
      i = j;
      continue;
    }
    if (c == '\'' || c == '"') {
      std::string value;
      size_t j = i + 1;
      while (true) {
        if (j >= src.size()) return Error(*line, "unterminated string literal");
        const char d = src[j];
        if (d == c) break;
        if (d == '\n') ++*line;
        if (d == '\\' && j + 1 < src.size()) {
          const char e = src[j + 1];
          j += 2;
          switch (e) {
            case 'n':
              value += '\n';
              break;
            case 't':
              value += '\t';
              break;
            case 'r':
              value += '\r';
              break;
            case '0':
              value += '\0';
              break;
            case '\\':
              value += '\\';
              break;
            case '\'':
              value += '\'';
              break;
            case '"':
              value += '"';
              break;
            case '\n':
              break;  // line continuation
            case 'x':
            case 'u':
            case 'U': {
              const int digits = e == 'x' ? 2 : (e == 'u' ? 4 : 8);
              if (j + digits > src.size()) return Error(*line, "bad escape in string literal");
              const char32_t cp =
                  static_cast<char32_t>(std::strtoul(src.substr(j, digits).c_str(), nullptr, 16));
              utf8::Append(cp, value);
              j += digits;
              break;
            }
            default:
              value += '\\';
              value += e;
          }
          continue;
        }
        value += d;
        ++j;
      }
      out->push_back({Token::Kind::kString, value, *line});
      i = j + 1;
      continue;
    }
    bool matched = false;
    for (const char* op : kOps) {
      const size_t n = std::char_traits<char>::length(op);
      if (src.compare(i, n, op) == 0) {
        out->push_back({Token::Kind::kOp, op, *line});
        i += n;
        matched = true;
        break;
      }
    }
    if (!matched) return Error(*line, std::string("unexpected character '") + c + "'");
  }
}

}  // namespace

// Splits a template into chunks, applying whitespace control and Hugging Face's
// trim_blocks / lstrip_blocks.
absl::StatusOr<std::vector<Chunk>> Lex(const std::string& src) {
  std::vector<Chunk> chunks;
  size_t i = 0;
  int line = 1;
  bool strip_next_text = false;  // the previous tag ended with "-"
  bool trim_newline = false;     // the previous tag was a block (trim_blocks)
  std::string text;
  auto flush_text = [&](int text_line) {
    if (!text.empty()) chunks.push_back({Chunk::Kind::kText, text, {}, text_line});
    text.clear();
  };
  int text_line = 1;
  while (i <= src.size()) {
    size_t open = src.find('{', i);
    while (open != std::string::npos && open + 1 < src.size() && src[open + 1] != '{' &&
           src[open + 1] != '%' && src[open + 1] != '#') {
      open = src.find('{', open + 1);
    }
    if (open == std::string::npos || open + 1 >= src.size()) open = src.size();
    std::string piece = src.substr(i, open - i);
    // Leading whitespace control from the previous tag.
    if (strip_next_text) {
      size_t k = 0;
      while (k < piece.size() && std::isspace(static_cast<unsigned char>(piece[k]))) ++k;
      piece.erase(0, k);
    } else if (trim_newline) {
      if (piece.compare(0, 1, "\n") == 0) {
        piece.erase(0, 1);
      } else if (piece.compare(0, 2, "\r\n") == 0) {
        piece.erase(0, 2);
      }
    }
    strip_next_text = trim_newline = false;
    if (text.empty()) text_line = line;
    for (char c : src.substr(i, open - i)) line += c == '\n';
    if (open >= src.size()) {
      text += piece;
      break;
    }
    const char kind = src[open + 1];
    const bool strip_before = open + 2 < src.size() && src[open + 2] == '-';
    const bool keep_before = open + 2 < src.size() && src[open + 2] == '+';
    if (strip_before) {
      size_t k = piece.size();
      while (k > 0 && std::isspace(static_cast<unsigned char>(piece[k - 1]))) --k;
      piece.resize(k);
    } else if ((kind == '%' || kind == '#') && !keep_before) {
      // lstrip_blocks: the spaces and tabs before a block tag go, if nothing else precedes
      // the tag on its source line.
      const std::string raw = src.substr(i, open - i);
      const size_t last_newline = raw.rfind('\n');
      const std::string prefix =
          last_newline == std::string::npos ? raw : raw.substr(last_newline + 1);
      const bool at_line_start = last_newline != std::string::npos || i == 0;
      if (at_line_start && std::all_of(prefix.begin(), prefix.end(), IsSpaceOrTab)) {
        size_t k = piece.size();
        while (k > 0 && IsSpaceOrTab(piece[k - 1])) --k;
        piece.resize(k);
      }
    }
    text += piece;
    size_t pos = open + 2 + ((strip_before || keep_before) ? 1 : 0);
    if (kind == '#') {
      const size_t end = src.find("#}", pos);
      if (end == std::string::npos) return Error(line, "unterminated comment");
      for (size_t k = pos; k < end; ++k) line += src[k] == '\n';
      strip_next_text = end > pos && src[end - 1] == '-';
      trim_newline = !strip_next_text;
      i = end + 2;
      continue;
    }
    flush_text(text_line);
    Chunk chunk;
    chunk.kind = kind == '{' ? Chunk::Kind::kExpr : Chunk::Kind::kStmt;
    chunk.line = line;
    bool strip_after = false;
    RETURN_IF_ERROR(
        LexTag(src, &pos, kind == '{' ? "}}" : "%}", &line, &chunk.tokens, &strip_after));
    // {% raw %} ... {% endraw %}: verbatim.
    if (chunk.kind == Chunk::Kind::kStmt && chunk.tokens.size() == 1 &&
        chunk.tokens[0].text == "raw") {
      const size_t end = src.find("endraw", pos);
      if (end == std::string::npos) return Error(line, "unterminated raw block");
      const size_t tag_start = src.rfind("{%", end);
      std::string raw = src.substr(pos, tag_start - pos);
      if (tag_start + 2 < src.size() && src[tag_start + 2] == '-') {
        while (!raw.empty() && std::isspace(static_cast<unsigned char>(raw.back()))) raw.pop_back();
      }
      text += raw;
      for (char c : raw) line += c == '\n';
      const size_t close = src.find("%}", end);
      if (close == std::string::npos) return Error(line, "unterminated endraw");
      strip_next_text = src[close - 1] == '-';
      trim_newline = !strip_next_text;
      i = close + 2;
      continue;
    }
    chunks.push_back(std::move(chunk));
    strip_next_text = strip_after;
    trim_newline = !strip_after && kind == '%';
    i = pos;
  }
  flush_text(text_line);
  return chunks;
}

}  // namespace strata::jinja
