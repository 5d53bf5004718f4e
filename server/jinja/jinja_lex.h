// The lexer of the Jinja interpreter (internal): splits a template into chunks of literal
// text and the tokens of each tag, applying whitespace control and Hugging Face's
// trim_blocks / lstrip_blocks. jinja_parse.cc parses the chunks.
#ifndef STRATA_SERVER_JINJA_JINJA_LEX_H_
#define STRATA_SERVER_JINJA_JINJA_LEX_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata::jinja {

struct Token {
  enum class Kind { kName, kInt, kFloat, kString, kOp, kEnd };
  Kind kind;
  std::string text;
  int line;
};

// A piece of the template: literal text or the tokens of one tag.
struct Chunk {
  enum class Kind { kText, kExpr, kStmt };
  Kind kind;
  std::string text;
  std::vector<Token> tokens;
  int line;
};

// A template error at `line`, as every stage reports them.
absl::Status Error(int line, const std::string& message);

absl::StatusOr<std::vector<Chunk>> Lex(const std::string& src);

}  // namespace strata::jinja

#endif  // STRATA_SERVER_JINJA_JINJA_LEX_H_
