// How a node's OpenMP team waits between parallel regions: spin for a bounded time, then
// sleep. A decode step is a few dozen GEMMs with short gaps between them (a kernel's
// reduction, a per-layer wait for memory nodes), and parking the team in every gap costs a
// futex wake-up per thread per GEMM: measured at half of a batch-1 step. Spinning without
// bound is worse on shared cores, where the spinning thread holds the core that the
// process it waits for (the server, a memory node) needs.
//
// libgomp spins GOMP_SPINCOUNT iterations (about 100 per microsecond by its own estimate;
// it varies with the CPU) and then sleeps on a futex. With OMP_WAIT_POLICY unset, an
// explicit GOMP_SPINCOUNT is the whole policy; a process with more OpenMP threads than
// cores spins at most 100 iterations whatever is set. The environment is read when the
// process starts, so the launcher and the manifests set it for each node they start,
// from the core layout:
//   - shared cores (the embedded default: every process may run on every core): a short
//     spin, enough to cover the gap between two GEMMs of a step, not the gap between steps;
//   - dedicated cores (Guaranteed pods with the static CPU manager): a longer spin, enough
//     to bridge the scheduler's round trip between steps.
// docs/architecture.md ("Threads on shared cores") gives the layout and the measurement.
#ifndef STRATA_COMMON_BASE_WAIT_POLICY_H_
#define STRATA_COMMON_BASE_WAIT_POLICY_H_

#include <omp.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace strata {

enum class CoreShare { kShared, kDedicated };

// libgomp spin iterations before a thread sleeps (GOMP_SPINCOUNT).
inline constexpr int64_t kSharedCoreSpinCount = 10000;      // about 0.1 ms
inline constexpr int64_t kDedicatedCoreSpinCount = 300000;  // about 3 ms

int64_t SpinCountFor(CoreShare share);

// The OpenMP environment of a node process: OMP_NUM_THREADS and GOMP_SPINCOUNT, with
// OMP_WAIT_POLICY unset so that the spin count is what applies. `spin_count` < 0: from
// `share`.
std::map<std::string, std::string> OpenMpEnvironment(int threads, CoreShare share,
                                                     int64_t spin_count = -1);

// The same, as NAME=VALUE strings for execve-style environments.
std::vector<std::string> OpenMpEnvironmentList(int threads, CoreShare share,
                                               int64_t spin_count = -1);

// Which threads get a core first when serving and computing share the cores. Linux lets a
// thread that wakes up preempt the one running; a served decode step hands off a result
// and a plan through some 20 thread wake-ups (gRPC, the executor, the scheduler's loop,
// HTTP), and on shared cores each of them can stop one thread of the step's OpenMP team,
// whose partner then waits for it at the next barrier. A service thread is SCHED_BATCH:
// it never preempts on waking, and runs when a core frees up or the running thread's
// slice ends (a millisecond or a few with Linux's EEVDF scheduler, whose base slice grows
// with the core count, at the next timer tick), which asynchronous scheduling's plan ahead
// covers. A compute thread is SCHED_OTHER, as every thread starts.
// A thread created later inherits its creator's role, libgomp's worker threads included.
enum class ThreadRole { kService, kCompute };

// Sets the calling thread's role. False, changing nothing, where the kernel refuses (a
// seccomp profile, a non-Linux kernel).
bool SetThreadRole(ThreadRole role);

// The calling thread's role (kCompute for any policy but SCHED_BATCH).
ThreadRole CurrentThreadRole();

// Whether this process runs its service threads as kService (set where main made itself
// one; see cpu_flags.h).
void SetServiceThreadsYield(bool yield);
bool ServiceThreadsYield();

// For a compute thread that starts service threads (a transport's loop): while it lives,
// the calling thread is a service thread where this process's service threads yield, so
// the threads it starts are too; the role it had comes back at the end.
class ServiceThreadScope {
 public:
  ServiceThreadScope();
  ~ServiceThreadScope();
  ServiceThreadScope(const ServiceThreadScope&) = delete;
  ServiceThreadScope& operator=(const ServiceThreadScope&) = delete;

 private:
  ThreadRole before_;
  bool changed_ = false;
};

// Runs `work` on a thread of its own and returns what it returns, so that the OpenMP team
// its parallel regions create ends when it does. The thread is a compute thread whatever
// its caller is, and so are its team's.
//
// libgomp keeps a team of worker threads for every thread that has entered a parallel
// region, until that thread exits, and counts the workers of every team together: while
// they outnumber the cores, every team spins at most 100 iterations (about 1 us) before it
// sleeps, whatever GOMP_SPINCOUNT says. A node whose model loading, pool touching or
// configuration ran parallel regions on the main thread or a gRPC handler thread kept those
// teams idle but alive, and its steps' team then slept and woke in every gap between two
// GEMMs. Everything in a node process that runs parallel regions outside its one step
// thread goes through here.
// The thread's team has `threads` threads, by default the caller's team size: a size set
// with omp_set_num_threads (--threads, --cpus) holds only for the thread that set it.
template <typename Work>
auto OnOwnOpenMpThread(Work&& work, int threads = omp_get_max_threads())
    -> std::invoke_result_t<Work&> {
  using Result = std::invoke_result_t<Work&>;
  if constexpr (std::is_void_v<Result>) {
    std::thread([&work, threads] {
      SetThreadRole(ThreadRole::kCompute);
      omp_set_num_threads(threads);
      work();
    }).join();
  } else {
    std::optional<Result> result;
    std::thread([&work, &result, threads] {
      SetThreadRole(ThreadRole::kCompute);
      omp_set_num_threads(threads);
      result.emplace(work());
    }).join();
    return std::move(*result);
  }
}

}  // namespace strata

#endif  // STRATA_COMMON_BASE_WAIT_POLICY_H_
