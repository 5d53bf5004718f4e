// CPU affinity for node processes: which cores a process may run on.
//
// Nodes that share a machine (a compute node and its memory nodes on one host, as the local
// launcher deploys them) otherwise leave placement to the kernel, which wakes a process on
// the core of the thread that woke it: two memory nodes woken by one compute node then
// queue behind each other on one core while another core idles. Giving each memory node
// its own cores keeps their attention in parallel. Kubernetes' static CPU manager policy
// does the same for pods with whole-core requests.
//
// Lists use the kernel's cpuset syntax: "0-3,6" is cores 0, 1, 2, 3 and 6.
#ifndef STRATA_COMMON_BASE_CPU_AFFINITY_H_
#define STRATA_COMMON_BASE_CPU_AFFINITY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata {

// Parses a cpuset list into ascending, distinct core numbers. Refuses empty lists,
// reversed ranges, negative or huge numbers and stray characters.
absl::StatusOr<std::vector<int>> ParseCpuList(const std::string& list);

// Formats cores as a cpuset list, ranges collapsed ("0-3,6").
std::string FormatCpuList(const std::vector<int>& cpus);

// The cores this process may run on now, ascending.
std::vector<int> AllowedCpus();

// Restricts the calling thread, and every thread it starts from now on, to `list`. Call it
// first in main, before any thread exists (OpenMP also sizes its default team from it).
// Fails for cores outside AllowedCpus().
absl::Status PinProcessToCpus(const std::string& list);

// The team a node runs when nothing sets its size: the cores this process may run on, fewer
// where its cgroup's CPU quota (cpu_quota.h) allows fewer, rounded up (a quota of 2.5 cores
// is a team of 3), and at least 1.
int DefaultTeamSize();

// What a node's main does with its --cpus and --threads flags: pins the process to `cpus`
// (when not empty) and sets OpenMP's team size to `threads`, or, when that is 0, to
// DefaultTeamSize() over the cores pinned to; without --cpus OMP_NUM_THREADS still wins over
// the default where set. OpenMP sized its own default before main ran, from the affinity
// mask alone.
absl::Status ApplyCpuFlags(const std::string& cpus, int threads);

// Splits `cpus` into `parts` disjoint groups as even as possible (part i gets every
// parts-th core from i on); with fewer cores than parts, parts share cores round-robin.
std::vector<std::vector<int>> SplitCpus(const std::vector<int>& cpus, int parts);

// A deployment's cores split in two (--compute_cpus, --memory_cpus): compute nodes and the
// scheduler on the first set, memory nodes sharing the second. This is how one machine
// emulates compute hardware and memory hardware that do not contend.
struct CorePartition {
  std::vector<int> compute;
  std::vector<int> memory;
};

// Parses both lists and checks them: neither empty, every core within `allowed`, and no
// core in both. Errors name the flag and the core.
absl::StatusOr<CorePartition> ParseCorePartition(const std::string& compute,
                                                 const std::string& memory,
                                                 const std::vector<int>& allowed);

}  // namespace strata

#endif  // STRATA_COMMON_BASE_CPU_AFFINITY_H_
