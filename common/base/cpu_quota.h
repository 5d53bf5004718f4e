// The CPU bandwidth limit a container runtime puts on a process: its cgroup's CFS quota
// (cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us` over `cpu.cfs_period_us`). Kubernetes sets it
// from a container's CPU limit. Unlike a cpuset it leaves sched_getaffinity at every core of
// the host, so a team sized from the affinity mask (OpenMP's own default) runs a thread per
// host core inside the quota of a few: the threads are throttled in turn, and every barrier
// of a step waits for the throttled ones. Nodes size their teams from the smaller of the two
// (cpu_affinity.h, DefaultTeamSize).
//
// A cgroup's limit is the lowest along its path up to its hierarchy's root (a parent's quota
// caps its children). Both hierarchies are read where both are mounted (a hybrid host has
// the cpu controller on v1 and an empty v2 beside it), and the lowest limit found counts.
#ifndef STRATA_COMMON_BASE_CPU_QUOTA_H_
#define STRATA_COMMON_BASE_CPU_QUOTA_H_

#include <optional>
#include <string>

namespace strata {

// Cores' worth of CPU time per period that this process's cgroups allow (2.5: two and a half
// cores); nullopt where no quota is set, or where nothing can be read (no /proc, no cgroup
// file system mounted).
std::optional<double> CgroupCpuLimit();

// The same from the given texts of /proc/self/mountinfo and /proc/self/cgroup, reading the
// cgroups' files under `fs_root` prepended to each mount point ("" for the real file system;
// tests give a directory of their own). Lines and files that do not parse are skipped.
std::optional<double> CgroupCpuLimitFrom(const std::string& mountinfo, const std::string& cgroup,
                                         const std::string& fs_root);

}  // namespace strata

#endif  // STRATA_COMMON_BASE_CPU_QUOTA_H_
