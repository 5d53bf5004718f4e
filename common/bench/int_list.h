// Comma-separated integers of a benchmark's list flag (--batches=1,8,64).
#ifndef STRATA_COMMON_BENCH_INT_LIST_H_
#define STRATA_COMMON_BENCH_INT_LIST_H_

#include <string_view>
#include <vector>

namespace strata {

// The integers of `text` in order; pieces that are not integers are skipped.
std::vector<int> ParseIntList(std::string_view text);

}  // namespace strata

#endif  // STRATA_COMMON_BENCH_INT_LIST_H_
