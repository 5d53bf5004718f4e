#include "common/base/cpu_flags.h"

#include "absl/flags/flag.h"
#include "common/base/cpu_affinity.h"
#include "common/base/logging.h"
#include "common/base/wait_policy.h"

ABSL_FLAG(std::string, cpus, "",
          "Cores to run on, as a cpuset list (\"0-3,6\"); empty: wherever the kernel puts it. "
          "With --threads=0 the thread count follows the list");

ABSL_FLAG(bool, service_threads_yield, true,
          "Compute node (on by default) and server (off by default): run every thread but "
          "the step's OpenMP team as SCHED_BATCH, so that a thread waking to pass on a result "
          "or a plan does not preempt the team on shared cores (accepted and ignored by memory "
          "nodes, whose threads run attention)");

namespace strata {

absl::Status ApplyCpusFlag(int threads) {
  return ApplyCpuFlags(absl::GetFlag(FLAGS_cpus), threads);
}

void SetServiceThreadsYieldDefault(bool yield) {
  absl::SetFlag(&FLAGS_service_threads_yield, yield);
}

void ApplyServiceThreadsFlag() {
  if (!absl::GetFlag(FLAGS_service_threads_yield)) return;
  if (!SetThreadRole(ThreadRole::kService)) {
    LOG(WARNING) << "could not make service threads SCHED_BATCH; they may preempt the step's "
                    "OpenMP team on shared cores";
    return;
  }
  SetServiceThreadsYield(true);
}

}  // namespace strata
