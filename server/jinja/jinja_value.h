// Values of strata's Jinja interpreter, with Python's semantics (Jinja templates are
// written against Python objects): None, undefined, bool, int, float, str, list, dict
// (insertion ordered), namespace and callables.
#ifndef STRATA_SERVER_JINJA_JINJA_VALUE_H_
#define STRATA_SERVER_JINJA_JINJA_VALUE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace strata::jinja {

class Value;
using ValueList = std::vector<Value>;

// An insertion-ordered string-keyed map (Python dicts keep insertion order).
struct ValueDict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* Find(const std::string& key) const;
  Value* Find(const std::string& key);
  void Set(const std::string& key, Value value);
};

using Callable = std::function<absl::StatusOr<Value>(
    const ValueList& args, const std::vector<std::pair<std::string, Value>>& kwargs)>;

class Value {
 public:
  enum class Kind {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kCallable
  };

  Value() = default;  // undefined
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double d);
  static Value String(std::string s);
  static Value List(ValueList items);
  static Value Dict(ValueDict dict);
  static Value Namespace(ValueDict dict);
  static Value Function(Callable fn);
  static Value FromJson(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_mapping() const { return kind_ == Kind::kDict || kind_ == Kind::kNamespace; }

  bool b() const { return b_; }
  int64_t i() const { return i_; }
  double AsDouble() const { return kind_ == Kind::kInt ? static_cast<double>(i_) : d_; }
  const std::string& s() const { return *s_; }
  const ValueList& list() const { return *list_; }
  ValueList& mutable_list() { return *list_; }
  const ValueDict& dict() const { return *dict_; }
  ValueDict& mutable_dict() { return *dict_; }  // shared: namespaces mutate in place
  const Callable& fn() const { return *fn_; }

  bool Truthy() const;
  // Python's str(): what {{ value }} prints.
  std::string Str() const;
  // Python's repr(), used inside containers.
  std::string Repr() const;
  // JSON as transformers' tojson writes it (json.dumps, ensure_ascii=False).
  std::string ToJson(int indent, int depth = 0) const;
  const char* TypeName() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  int64_t i_ = 0;
  double d_ = 0;
  std::shared_ptr<std::string> s_;
  std::shared_ptr<ValueList> list_;
  std::shared_ptr<ValueDict> dict_;
  std::shared_ptr<Callable> fn_;
};

bool Equal(const Value& a, const Value& b);
// Python ordering for numbers and strings; error for anything else.
absl::StatusOr<int> Compare(const Value& a, const Value& b);

}  // namespace strata::jinja

#endif  // STRATA_SERVER_JINJA_JINJA_VALUE_H_
