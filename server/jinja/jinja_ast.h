// The syntax tree of a parsed template, and the registries of names the evaluator knows.
// Private to server/chat.
#ifndef STRATA_SERVER_JINJA_JINJA_AST_H_
#define STRATA_SERVER_JINJA_JINJA_AST_H_

#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "server/jinja/jinja_value.h"

namespace strata::jinja {

struct Expr {
  enum class Kind {
    kLiteral,
    kName,
    kList,
    kDict,
    kTuple,
    kGetAttr,
    kGetItem,
    kSlice,
    kCall,
    kFilter,
    kTest,
    kNeg,
    kPos,
    kNot,
    kBinary,
    kAnd,
    kOr,
    kCompare,
    kTernary
  };
  Kind kind;
  int line = 0;
  Value literal;
  std::string name;                         // name, attribute, filter, test, binary operator
  std::vector<std::shared_ptr<Expr>> args;  // operands / positional arguments
  std::vector<std::pair<std::string, std::shared_ptr<Expr>>> kwargs;
  std::vector<std::string> ops;  // kCompare: operators between args
  bool negated = false;          // kTest: "is not"
};
using ExprPtr = std::shared_ptr<Expr>;

struct Node {
  enum class Kind {
    kSequence,
    kText,
    kOutput,
    kIf,
    kFor,
    kSet,
    kSetBlock,
    kMacro,
    kBreak,
    kContinue
  };
  Kind kind;
  int line = 0;
  std::string text;                             // kText
  ExprPtr expr;                                 // kOutput, kSet value, kFor iterable
  std::vector<std::shared_ptr<Node>> children;  // kSequence
  // kIf: conditions[i] guards branches[i]; a trailing branch without condition is else.
  std::vector<ExprPtr> conditions;
  std::vector<std::shared_ptr<Node>> branches;
  // kFor / kSet: target names ("ns.attr" form for namespace attributes in kSet).
  std::vector<std::string> targets;
  ExprPtr loop_filter;  // kFor: "for x in y if cond"
  std::shared_ptr<Node> body, else_body;
  // kMacro
  std::string macro_name;
  std::vector<std::pair<std::string, ExprPtr>> params;  // default may be null
};
using NodePtr = std::shared_ptr<Node>;

// Names the built-ins implement (jinja_builtins.h); the parser rejects anything else.
const std::set<std::string>& KnownFilters();
const std::set<std::string>& KnownTests();
const std::set<std::string>& KnownFunctions();
const std::set<std::string>& KnownMethods();

}  // namespace strata::jinja

#endif  // STRATA_SERVER_JINJA_JINJA_AST_H_
