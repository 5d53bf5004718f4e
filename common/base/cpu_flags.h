// The --cpus flag of the server and the node binaries (compute_node, memory_node), defined
// once here so that all take the same flag with the same meaning; see cpu_affinity.h. Also
// --service_threads_yield, for the server and the compute node (wait_policy.h).
#ifndef STRATA_COMMON_BASE_CPU_FLAGS_H_
#define STRATA_COMMON_BASE_CPU_FLAGS_H_

#include "absl/status/status.h"

namespace strata {

// ApplyCpuFlags(--cpus, threads): call first in main, with the node's --threads.
absl::Status ApplyCpusFlag(int threads);

// The default of --service_threads_yield in this binary; call in main before the command
// line is parsed. The server's is false: its threads carry every token to the client, and
// as SCHED_BATCH a token waited up to a scheduler tick for a core the step's team held
// (docs/benchmarks.md, "The server's threads preempt the step again").
void SetServiceThreadsYieldDefault(bool yield);

// With --service_threads_yield (the compute node's default), makes the calling thread, and so every
// thread it creates later, a service thread (wait_policy.h: SetThreadRole); call in main before any
// thread starts. Compute threads (OnOwnOpenMpThread) set their own role.
void ApplyServiceThreadsFlag();

}  // namespace strata

#endif  // STRATA_COMMON_BASE_CPU_FLAGS_H_
