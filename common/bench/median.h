// The median that benchmarks report their figures as.
#ifndef STRATA_COMMON_BENCH_MEDIAN_H_
#define STRATA_COMMON_BENCH_MEDIAN_H_

#include <vector>

namespace strata {

// The median of `values` (the upper one for an even count); 0 when empty.
double Median(std::vector<double> values);

}  // namespace strata

#endif  // STRATA_COMMON_BENCH_MEDIAN_H_
