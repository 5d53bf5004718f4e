#include "common/base/cpu_flags.h"

#include <omp.h>

#include <cstdint>
#include <cstdlib>
#include <optional>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "common/base/cpu_affinity.h"
#include "common/base/cpu_quota.h"
#include "common/base/logging.h"
#include "common/base/wait_policy.h"

ABSL_FLAG(std::string, cpus, "",
          "Cores to run on, as a cpuset list (\"0-3,6\"); empty: wherever the kernel puts it. "
          "With --threads=0 the thread count follows the list (and a CPU quota below it)");

ABSL_FLAG(bool, service_threads_yield, true,
          "Compute node (on by default) and server (off by default): run every thread but "
          "the step's OpenMP team as SCHED_BATCH, so that a thread waking to pass on a result "
          "or a plan does not preempt the team on shared cores (accepted and ignored by memory "
          "nodes, whose threads run attention)");

namespace strata {

absl::Status ApplyCpusFlag(int threads) {
  if (absl::Status applied = ApplyCpuFlags(absl::GetFlag(FLAGS_cpus), threads); !applied.ok()) {
    return applied;
  }
  // A quota below the cores allowed: the cores are shared with other containers, and a long
  // spin between a step's GEMMs spends the quota that the step needs (wait_policy.h).
  const std::optional<double> limit = CgroupCpuLimit();
  const size_t allowed = AllowedCpus().size();
  if (limit && *limit < static_cast<double>(allowed)) {
    LOG(INFO) << "CPU quota of " << *limit << " cores on " << allowed
              << " allowed cores: OpenMP team of " << omp_get_max_threads() << " threads";
    const char* spin = std::getenv("GOMP_SPINCOUNT");
    int64_t count = 0;
    if (spin != nullptr && absl::SimpleAtoi(spin, &count) && count > kSharedCoreSpinCount) {
      LOG(WARNING) << "GOMP_SPINCOUNT=" << spin << " is a dedicated core's spin, but this "
                   << "process shares its cores under a CPU quota: spinning threads use up the "
                   << "quota and the step is throttled. Give the pod whole cores of its own (the "
                   << "kubelet's static CPU manager policy) or set GOMP_SPINCOUNT="
                   << kSharedCoreSpinCount;
    }
  }
  return absl::OkStatus();
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
