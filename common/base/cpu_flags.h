// The --cpus flag of the server and the node binaries (compute_node, memory_node), defined
// once here so that all take the same flag with the same meaning; see cpu_affinity.h.
#ifndef STRATA_COMMON_BASE_CPU_FLAGS_H_
#define STRATA_COMMON_BASE_CPU_FLAGS_H_

#include "absl/status/status.h"

namespace strata {

// ApplyCpuFlags(--cpus, threads): call first in main, with the node's --threads.
absl::Status ApplyCpusFlag(int threads);

}  // namespace strata

#endif  // STRATA_COMMON_BASE_CPU_FLAGS_H_
