// Enums that options are made of (a transport backend, a policy), spelled on command lines
// and in logs by a name. One table per enum gives both directions; AbslParseFlag and
// AbslUnparseFlag overloads built on it make the enum a flag type, so a bad name is refused
// when the flags are parsed, with the known names in the message.
#ifndef STRATA_COMMON_BASE_ENUM_NAMES_H_
#define STRATA_COMMON_BASE_ENUM_NAMES_H_

#include <cstddef>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace strata {

template <typename E>
struct EnumName {
  E value;
  const char* name;
};

// Finds `text` among the names (aliases allowed: several names may map to one value).
template <typename E, size_t N>
bool ParseEnumName(absl::string_view text, const EnumName<E> (&table)[N], E* out,
                   std::string* error) {
  for (const EnumName<E>& e : table) {
    if (text == e.name) {
      *out = e.value;
      return true;
    }
  }
  std::string known;
  for (const EnumName<E>& e : table) absl::StrAppend(&known, known.empty() ? "" : ", ", e.name);
  *error = absl::StrCat("\"", text, "\" is not one of: ", known);
  return false;
}

// The first name of `value` in the table.
template <typename E, size_t N>
const char* EnumNameOf(E value, const EnumName<E> (&table)[N]) {
  for (const EnumName<E>& e : table) {
    if (e.value == value) return e.name;
  }
  return "?";
}

}  // namespace strata

#endif  // STRATA_COMMON_BASE_ENUM_NAMES_H_
