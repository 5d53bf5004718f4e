// String helpers. strata's APIs take std::string_view; Debian's Abseil has its own
// absl::string_view, so calls into Abseil convert with AbslView().
#ifndef STRATA_COMMON_BASE_STRINGS_H_
#define STRATA_COMMON_BASE_STRINGS_H_

#include <string_view>

#include "absl/strings/string_view.h"

namespace strata {

inline absl::string_view AbslView(std::string_view s) { return {s.data(), s.size()}; }

}  // namespace strata

#endif  // STRATA_COMMON_BASE_STRINGS_H_
