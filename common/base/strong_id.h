// A typed integer id: two ids of different kinds (a sequence id and a pool index, say)
// do not convert into each other or into plain integers, so an argument or aggregate
// initializer in the wrong order fails to compile instead of running. Construction from
// the integer and value() are explicit; ids compare, hash (absl and std) and print (with
// absl::StrCat and to streams).
//
// Thread-safety: a value type.
#ifndef STRATA_COMMON_BASE_STRONG_ID_H_
#define STRATA_COMMON_BASE_STRONG_ID_H_

#include <cstddef>
#include <functional>
#include <ostream>
#include <utility>

#include "absl/strings/str_cat.h"

namespace strata {

template <typename Tag, typename Int>
class StrongId {
 public:
  using ValueType = Int;

  constexpr StrongId() = default;
  constexpr explicit StrongId(Int value) : value_(value) {}

  constexpr Int value() const { return value_; }

  friend constexpr bool operator==(StrongId a, StrongId b) { return a.value_ == b.value_; }
  friend constexpr bool operator!=(StrongId a, StrongId b) { return a.value_ != b.value_; }
  friend constexpr bool operator<(StrongId a, StrongId b) { return a.value_ < b.value_; }
  friend constexpr bool operator<=(StrongId a, StrongId b) { return a.value_ <= b.value_; }
  friend constexpr bool operator>(StrongId a, StrongId b) { return a.value_ > b.value_; }
  friend constexpr bool operator>=(StrongId a, StrongId b) { return a.value_ >= b.value_; }

  template <typename H>
  friend H AbslHashValue(H h, StrongId id) {
    return H::combine(std::move(h), id.value_);
  }
  friend std::ostream& operator<<(std::ostream& os, StrongId id) { return os << id.value_; }
  // For absl::StrCat (this absl predates AbslStringify).
  operator absl::AlphaNum() const { return absl::AlphaNum(value_); }  // NOLINT(runtime/explicit)

 private:
  Int value_{};
};

}  // namespace strata

template <typename Tag, typename Int>
struct std::hash<strata::StrongId<Tag, Int>> {
  size_t operator()(strata::StrongId<Tag, Int> id) const { return std::hash<Int>()(id.value()); }
};

#endif  // STRATA_COMMON_BASE_STRONG_ID_H_
