// The model a benchmark runs: the directory its --model flag names, or the demo shape,
// generated once into /tmp/strata-bench-demo.
#ifndef STRATA_COMMON_BENCH_DEMO_MODEL_H_
#define STRATA_COMMON_BENCH_DEMO_MODEL_H_

#include <string>

#include "absl/status/statusor.h"

namespace strata {

// `flag` when it is not empty; else the demo model's directory, generating it if it is not
// there yet.
absl::StatusOr<std::string> BenchModelDir(const std::string& flag);

}  // namespace strata

#endif  // STRATA_COMMON_BENCH_DEMO_MODEL_H_
