// Parsing of templates (see jinja.h for the supported language) from the lexer's chunks
// (jinja_lex.h).
#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/utf8.h"
#include "server/jinja/jinja.h"
#include "server/jinja/jinja_ast.h"
#include "server/jinja/jinja_lex.h"

namespace strata::jinja {
namespace {

// Recursive-descent parser over the chunk list.
class Parser {
 public:
  explicit Parser(std::vector<Chunk> chunks) : chunks_(std::move(chunks)) {
    // Macros may be called before their definition: collect names first.
    for (const Chunk& c : chunks_) {
      if (c.kind == Chunk::Kind::kStmt && c.tokens.size() >= 2 && c.tokens[0].text == "macro") {
        macros_.insert(c.tokens[1].text);
      }
    }
  }

  absl::StatusOr<NodePtr> ParseTemplate() {
    std::string terminator;
    ASSIGN_OR_RETURN(NodePtr root, ParseBlock({}, &terminator));
    if (!terminator.empty()) return Error(line_, "unexpected {% " + terminator + " %}");
    return root;
  }

 private:
  // Parses nodes until a statement whose first word is in `ends` (left in *terminator).
  absl::StatusOr<NodePtr> ParseBlock(const std::set<std::string>& ends, std::string* terminator) {
    auto seq = std::make_shared<Node>();
    seq->kind = Node::Kind::kSequence;
    while (chunk_ < chunks_.size()) {
      const Chunk& c = chunks_[chunk_];
      line_ = c.line;
      if (c.kind == Chunk::Kind::kText) {
        auto n = std::make_shared<Node>();
        n->kind = Node::Kind::kText;
        n->text = c.text;
        seq->children.push_back(n);
        ++chunk_;
        continue;
      }
      tokens_ = &c.tokens;
      tok_ = 0;
      if (c.kind == Chunk::Kind::kExpr) {
        auto n = std::make_shared<Node>();
        n->kind = Node::Kind::kOutput;
        n->line = c.line;
        ASSIGN_OR_RETURN(n->expr, ParseExpression());
        RETURN_IF_ERROR(ExpectEnd());
        seq->children.push_back(n);
        ++chunk_;
        continue;
      }
      if (tokens_->empty()) return Error(c.line, "empty statement");
      const std::string word = (*tokens_)[0].text;
      if (ends.count(word)) {
        *terminator = word;
        return seq;
      }
      ++chunk_;
      tok_ = 1;
      ASSIGN_OR_RETURN(NodePtr n, ParseStatement(word, c.line));
      if (n) seq->children.push_back(n);
    }
    if (!ends.empty()) return Error(line_, "missing {% " + *ends.begin() + " %}");
    terminator->clear();
    return seq;
  }

  absl::StatusOr<NodePtr> ParseStatement(const std::string& word, int line) {
    auto n = std::make_shared<Node>();
    n->line = line;
    if (word == "if") {
      n->kind = Node::Kind::kIf;
      ASSIGN_OR_RETURN(ExprPtr cond, ParseExpression());
      RETURN_IF_ERROR(ExpectEnd());
      n->conditions.push_back(cond);
      while (true) {
        std::string term;
        ASSIGN_OR_RETURN(NodePtr body, ParseBlock({"elif", "else", "endif"}, &term));
        n->branches.push_back(body);
        SetTokens();
        if (term == "endif") {
          RETURN_IF_ERROR(ExpectEnd());
          break;
        }
        if (term == "elif") {
          ASSIGN_OR_RETURN(ExprPtr c2, ParseExpression());
          RETURN_IF_ERROR(ExpectEnd());
          n->conditions.push_back(c2);
          continue;
        }
        RETURN_IF_ERROR(ExpectEnd());  // else
        ASSIGN_OR_RETURN(NodePtr else_body, ParseBlock({"endif"}, &term));
        n->branches.push_back(else_body);
        SetTokens();
        RETURN_IF_ERROR(ExpectEnd());
        break;
      }
      return n;
    }
    if (word == "for") {
      n->kind = Node::Kind::kFor;
      do {
        ASSIGN_OR_RETURN(std::string target, ExpectName());
        n->targets.push_back(target);
      } while (Accept(","));
      if (!AcceptWord("in")) return Error(line, "expected 'in' in for");
      ASSIGN_OR_RETURN(n->expr, ParseTernary(/*allow_if=*/false));
      if (AcceptWord("if")) {
        ASSIGN_OR_RETURN(n->loop_filter, ParseOr());
      }
      AcceptWord("recursive");
      RETURN_IF_ERROR(ExpectEnd());
      std::string term;
      ASSIGN_OR_RETURN(n->body, ParseBlock({"else", "endfor"}, &term));
      SetTokens();
      if (term == "else") {
        RETURN_IF_ERROR(ExpectEnd());
        ASSIGN_OR_RETURN(n->else_body, ParseBlock({"endfor"}, &term));
        SetTokens();
      }
      RETURN_IF_ERROR(ExpectEnd());
      return n;
    }
    if (word == "set") {
      ASSIGN_OR_RETURN(std::string target, ExpectName());
      if (Accept(".")) {
        ASSIGN_OR_RETURN(std::string attr, ExpectName());
        target += "." + attr;
      }
      n->targets.push_back(target);
      while (Accept(",")) {
        ASSIGN_OR_RETURN(std::string more, ExpectName());
        n->targets.push_back(more);
      }
      if (Accept("=")) {
        n->kind = Node::Kind::kSet;
        ASSIGN_OR_RETURN(n->expr, ParseExpression());
        RETURN_IF_ERROR(ExpectEnd());
        return n;
      }
      n->kind = Node::Kind::kSetBlock;
      RETURN_IF_ERROR(ExpectEnd());
      std::string term;
      ASSIGN_OR_RETURN(n->body, ParseBlock({"endset"}, &term));
      SetTokens();
      RETURN_IF_ERROR(ExpectEnd());
      return n;
    }
    if (word == "macro") {
      n->kind = Node::Kind::kMacro;
      ASSIGN_OR_RETURN(n->macro_name, ExpectName());
      if (!Accept("(")) return Error(line, "expected '(' after macro name");
      if (!Accept(")")) {
        do {
          ASSIGN_OR_RETURN(std::string param, ExpectName());
          ExprPtr def;
          if (Accept("=")) {
            ASSIGN_OR_RETURN(def, ParseExpression());
          }
          n->params.emplace_back(param, def);
        } while (Accept(","));
        if (!Accept(")")) return Error(line, "expected ')' after macro parameters");
      }
      RETURN_IF_ERROR(ExpectEnd());
      std::string term;
      ASSIGN_OR_RETURN(n->body, ParseBlock({"endmacro"}, &term));
      SetTokens();
      RETURN_IF_ERROR(ExpectEnd());
      return n;
    }
    if (word == "generation") {  // marks assistant text for training masks: render as is
      RETURN_IF_ERROR(ExpectEnd());
      std::string term;
      ASSIGN_OR_RETURN(NodePtr body, ParseBlock({"endgeneration"}, &term));
      SetTokens();
      RETURN_IF_ERROR(ExpectEnd());
      return body;
    }
    if (word == "break" || word == "continue") {
      n->kind = word == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
      RETURN_IF_ERROR(ExpectEnd());
      return n;
    }
    return Error(line, "unsupported statement {% " + word + " %}");
  }

  // The tokens of the terminator statement that ParseBlock stopped at.
  void SetTokens() {
    tokens_ = &chunks_[chunk_].tokens;
    line_ = chunks_[chunk_].line;
    tok_ = 1;
    ++chunk_;
  }

  // --- expressions ---
  const Token* Peek(size_t ahead = 0) const {
    return tok_ + ahead < tokens_->size() ? &(*tokens_)[tok_ + ahead] : nullptr;
  }
  bool Accept(const std::string& op) {
    const Token* t = Peek();
    if (t && t->kind == Token::Kind::kOp && t->text == op) {
      ++tok_;
      return true;
    }
    return false;
  }
  bool AcceptWord(const std::string& word) {
    const Token* t = Peek();
    if (t && t->kind == Token::Kind::kName && t->text == word) {
      ++tok_;
      return true;
    }
    return false;
  }
  bool PeekWord(const std::string& word, size_t ahead = 0) const {
    const Token* t = Peek(ahead);
    return t && t->kind == Token::Kind::kName && t->text == word;
  }
  absl::StatusOr<std::string> ExpectName() {
    const Token* t = Peek();
    if (!t || t->kind != Token::Kind::kName) return Error(line_, "expected a name");
    ++tok_;
    return t->text;
  }
  absl::Status ExpectEnd() {
    if (tok_ != tokens_->size()) return Error(line_, "unexpected '" + (*tokens_)[tok_].text + "'");
    return absl::OkStatus();
  }
  ExprPtr Make(Expr::Kind kind) {
    auto e = std::make_shared<Expr>();
    e->kind = kind;
    e->line = line_;
    return e;
  }

  absl::StatusOr<ExprPtr> ParseExpression() {
    ASSIGN_OR_RETURN(ExprPtr first, ParseTernary(true));
    if (!PeekOp(",")) return first;
    auto tuple = Make(Expr::Kind::kTuple);
    tuple->args.push_back(first);
    while (Accept(",")) {
      if (!Peek()) break;
      ASSIGN_OR_RETURN(ExprPtr next, ParseTernary(true));
      tuple->args.push_back(next);
    }
    return tuple;
  }
  bool PeekOp(const std::string& op) const {
    const Token* t = Peek();
    return t && t->kind == Token::Kind::kOp && t->text == op;
  }

  absl::StatusOr<ExprPtr> ParseTernary(bool allow_if) {
    ASSIGN_OR_RETURN(ExprPtr value, ParseOr());
    if (!allow_if || !PeekWord("if")) return value;
    ++tok_;
    auto e = Make(Expr::Kind::kTernary);
    ASSIGN_OR_RETURN(ExprPtr cond, ParseOr());
    ExprPtr otherwise;
    if (AcceptWord("else")) {
      ASSIGN_OR_RETURN(otherwise, ParseTernary(true));
    } else {
      otherwise = Make(Expr::Kind::kLiteral);  // undefined
    }
    e->args = {cond, value, otherwise};
    return e;
  }
  absl::StatusOr<ExprPtr> ParseOr() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseAnd());
    while (AcceptWord("or")) {
      ASSIGN_OR_RETURN(ExprPtr right, ParseAnd());
      auto e = Make(Expr::Kind::kOr);
      e->args = {left, right};
      left = e;
    }
    return left;
  }
  absl::StatusOr<ExprPtr> ParseAnd() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseNot());
    while (AcceptWord("and")) {
      ASSIGN_OR_RETURN(ExprPtr right, ParseNot());
      auto e = Make(Expr::Kind::kAnd);
      e->args = {left, right};
      left = e;
    }
    return left;
  }
  absl::StatusOr<ExprPtr> ParseNot() {
    if (AcceptWord("not")) {
      ASSIGN_OR_RETURN(ExprPtr inner, ParseNot());
      auto e = Make(Expr::Kind::kNot);
      e->args = {inner};
      return e;
    }
    return ParseCompare();
  }
  absl::StatusOr<ExprPtr> ParseCompare() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseMath1());
    ExprPtr chain;
    while (true) {
      std::string op;
      if (PeekOp("==") || PeekOp("!=") || PeekOp("<") || PeekOp(">") || PeekOp("<=") ||
          PeekOp(">=")) {
        op = Peek()->text;
        ++tok_;
      } else if (PeekWord("in")) {
        op = "in";
        ++tok_;
      } else if (PeekWord("not") && PeekWord("in", 1)) {
        op = "not in";
        tok_ += 2;
      } else {
        break;
      }
      ASSIGN_OR_RETURN(ExprPtr right, ParseMath1());
      if (!chain) {
        chain = Make(Expr::Kind::kCompare);
        chain->args.push_back(left);
      }
      chain->ops.push_back(op);
      chain->args.push_back(right);
    }
    return chain ? chain : left;
  }
  absl::StatusOr<ExprPtr> Binary(const std::string& op, ExprPtr l, ExprPtr r) {
    auto e = Make(Expr::Kind::kBinary);
    e->name = op;
    e->args = {std::move(l), std::move(r)};
    return e;
  }
  absl::StatusOr<ExprPtr> ParseMath1() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseConcat());
    while (PeekOp("+") || PeekOp("-")) {
      const std::string op = Peek()->text;
      ++tok_;
      ASSIGN_OR_RETURN(ExprPtr right, ParseConcat());
      ASSIGN_OR_RETURN(left, Binary(op, left, right));
    }
    return left;
  }
  absl::StatusOr<ExprPtr> ParseConcat() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseMath2());
    while (Accept("~")) {
      ASSIGN_OR_RETURN(ExprPtr right, ParseMath2());
      ASSIGN_OR_RETURN(left, Binary("~", left, right));
    }
    return left;
  }
  absl::StatusOr<ExprPtr> ParseMath2() {
    ASSIGN_OR_RETURN(ExprPtr left, ParsePow());
    while (PeekOp("*") || PeekOp("/") || PeekOp("//") || PeekOp("%")) {
      const std::string op = Peek()->text;
      ++tok_;
      ASSIGN_OR_RETURN(ExprPtr right, ParsePow());
      ASSIGN_OR_RETURN(left, Binary(op, left, right));
    }
    return left;
  }
  absl::StatusOr<ExprPtr> ParsePow() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseUnary());
    while (Accept("**")) {
      ASSIGN_OR_RETURN(ExprPtr right, ParseUnary());
      ASSIGN_OR_RETURN(left, Binary("**", left, right));
    }
    return left;
  }
  absl::StatusOr<ExprPtr> ParseUnary() {
    if (Accept("-")) {
      ASSIGN_OR_RETURN(ExprPtr inner, ParseUnary());
      auto e = Make(Expr::Kind::kNeg);
      e->args = {inner};
      return e;
    }
    if (Accept("+")) {
      ASSIGN_OR_RETURN(ExprPtr inner, ParseUnary());
      auto e = Make(Expr::Kind::kPos);
      e->args = {inner};
      return e;
    }
    ASSIGN_OR_RETURN(ExprPtr primary, ParsePrimary());
    return ParsePostfix(primary);
  }
  absl::Status ParseCallArgs(Expr* call) {
    if (Accept(")")) return absl::OkStatus();
    do {
      if (PeekOp(")")) break;
      const Token* t = Peek();
      const Token* next = Peek(1);
      if (t && t->kind == Token::Kind::kName && next && next->kind == Token::Kind::kOp &&
          next->text == "=") {
        tok_ += 2;
        ASSIGN_OR_RETURN(ExprPtr value, ParseTernary(true));
        call->kwargs.emplace_back(t->text, value);
      } else {
        ASSIGN_OR_RETURN(ExprPtr value, ParseTernary(true));
        call->args.push_back(value);
      }
    } while (Accept(","));
    if (!Accept(")")) return Error(line_, "expected ')'");
    return absl::OkStatus();
  }
  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr e) {
    while (true) {
      if (Accept(".")) {
        ASSIGN_OR_RETURN(std::string attr, ExpectName());
        auto a = Make(Expr::Kind::kGetAttr);
        a->name = attr;
        a->args = {e};
        e = a;
      } else if (Accept("[")) {
        // Item or slice.
        ExprPtr parts[3];
        bool is_slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!PeekOp(":") && !PeekOp("]")) {
            ASSIGN_OR_RETURN(parts[k], ParseTernary(true));
          }
          if (k < 2 && Accept(":")) {
            is_slice = true;
            continue;
          }
          break;
        }
        if (!Accept("]")) return Error(line_, "expected ']'");
        auto a = Make(is_slice ? Expr::Kind::kSlice : Expr::Kind::kGetItem);
        a->args = {e, parts[0], parts[1], parts[2]};
        e = a;
      } else if (Accept("(")) {
        auto call = Make(Expr::Kind::kCall);
        call->args.push_back(e);
        RETURN_IF_ERROR(ParseCallArgs(call.get()));
        // Validate what is called: a method, a global function or a macro.
        if (e->kind == Expr::Kind::kGetAttr) {
          if (!KnownMethods().count(e->name))
            return Error(line_, "unsupported method ." + e->name + "()");
        } else if (e->kind == Expr::Kind::kName) {
          if (!KnownFunctions().count(e->name) && !macros_.count(e->name)) {
            return Error(line_, "unsupported function " + e->name + "()");
          }
        }
        e = call;
      } else if (Accept("|")) {
        ASSIGN_OR_RETURN(std::string filter, ExpectName());
        if (!KnownFilters().count(filter))
          return Error(line_, "unsupported filter '" + filter + "'");
        auto f = Make(Expr::Kind::kFilter);
        f->name = filter;
        f->args.push_back(e);
        if (Accept("(")) RETURN_IF_ERROR(ParseCallArgs(f.get()));
        e = f;
      } else if (PeekWord("is")) {
        ++tok_;
        auto t = Make(Expr::Kind::kTest);
        t->negated = AcceptWord("not");
        ASSIGN_OR_RETURN(std::string test, ExpectName());
        if (!KnownTests().count(test)) return Error(line_, "unsupported test 'is " + test + "'");
        t->name = test;
        t->args.push_back(e);
        if (Accept("(")) {
          RETURN_IF_ERROR(ParseCallArgs(t.get()));
        } else if (Peek() &&
                   (Peek()->kind == Token::Kind::kString || Peek()->kind == Token::Kind::kInt ||
                    Peek()->kind == Token::Kind::kFloat ||
                    (Peek()->kind == Token::Kind::kName && !PeekWord("and") && !PeekWord("or") &&
                     !PeekWord("else") && !PeekWord("if")))) {
          ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
          t->args.push_back(arg);
        }
        e = t;
      } else {
        return e;
      }
    }
  }
  absl::StatusOr<ExprPtr> ParsePrimary() {
    const Token* t = Peek();
    if (!t) return Error(line_, "expected an expression");
    ++tok_;
    switch (t->kind) {
      case Token::Kind::kString: {
        // Adjacent string literals concatenate.
        std::string value = t->text;
        while (Peek() && Peek()->kind == Token::Kind::kString) value += (*tokens_)[tok_++].text;
        auto e = Make(Expr::Kind::kLiteral);
        e->literal = Value::String(value);
        return e;
      }
      case Token::Kind::kInt: {
        auto e = Make(Expr::Kind::kLiteral);
        e->literal = Value::Int(std::strtoll(t->text.c_str(), nullptr, 10));
        return e;
      }
      case Token::Kind::kFloat: {
        auto e = Make(Expr::Kind::kLiteral);
        e->literal = Value::Float(std::strtod(t->text.c_str(), nullptr));
        return e;
      }
      case Token::Kind::kName: {
        auto e = Make(Expr::Kind::kLiteral);
        if (t->text == "true" || t->text == "True") {
          e->literal = Value::Bool(true);
        } else if (t->text == "false" || t->text == "False") {
          e->literal = Value::Bool(false);
        } else if (t->text == "none" || t->text == "None") {
          e->literal = Value::None();
        } else {
          e->kind = Expr::Kind::kName;
          e->name = t->text;
        }
        return e;
      }
      case Token::Kind::kOp:
        if (t->text == "(") {
          if (Accept(")")) return Make(Expr::Kind::kTuple);
          ASSIGN_OR_RETURN(ExprPtr inner, ParseExpression());
          if (!Accept(")")) return Error(line_, "expected ')'");
          return inner;
        }
        if (t->text == "[") {
          auto e = Make(Expr::Kind::kList);
          if (!Accept("]")) {
            do {
              if (PeekOp("]")) break;
              ASSIGN_OR_RETURN(ExprPtr item, ParseTernary(true));
              e->args.push_back(item);
            } while (Accept(","));
            if (!Accept("]")) return Error(line_, "expected ']'");
          }
          return e;
        }
        if (t->text == "{") {
          auto e = Make(Expr::Kind::kDict);
          if (!Accept("}")) {
            do {
              if (PeekOp("}")) break;
              ASSIGN_OR_RETURN(ExprPtr key, ParseTernary(true));
              if (!Accept(":")) return Error(line_, "expected ':' in dict literal");
              ASSIGN_OR_RETURN(ExprPtr value, ParseTernary(true));
              e->args.push_back(key);
              e->args.push_back(value);
            } while (Accept(","));
            if (!Accept("}")) return Error(line_, "expected '}'");
          }
          return e;
        }
        return Error(line_, "unexpected '" + t->text + "'");
      default:
        return Error(line_, "unexpected end of expression");
    }
  }

  std::vector<Chunk> chunks_;
  size_t chunk_ = 0;
  const std::vector<Token>* tokens_ = nullptr;
  size_t tok_ = 0;
  int line_ = 1;
  std::set<std::string> macros_;
};

}  // namespace

absl::StatusOr<NodePtr> ParseTemplateSource(std::string_view source) {
  ASSIGN_OR_RETURN(std::vector<Chunk> chunks, Lex(std::string(source)));
  Parser parser(std::move(chunks));
  return parser.ParseTemplate();
}

}  // namespace strata::jinja
