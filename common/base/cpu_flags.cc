#include "common/base/cpu_flags.h"

#include "absl/flags/flag.h"
#include "common/base/cpu_affinity.h"

ABSL_FLAG(std::string, cpus, "",
          "Cores to run on, as a cpuset list (\"0-3,6\"); empty: wherever the kernel puts it. "
          "With --threads=0 the thread count follows the list");

namespace strata {

absl::Status ApplyCpusFlag(int threads) {
  return ApplyCpuFlags(absl::GetFlag(FLAGS_cpus), threads);
}

}  // namespace strata
