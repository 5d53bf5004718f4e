#include "common/bench/int_list.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace strata {

std::vector<int> ParseIntList(std::string_view text) {
  std::vector<int> out;
  for (absl::string_view piece :
       absl::StrSplit(absl::string_view(text.data(), text.size()), ',', absl::SkipEmpty())) {
    int v = 0;
    if (absl::SimpleAtoi(piece, &v)) out.push_back(v);
  }
  return out;
}

}  // namespace strata
