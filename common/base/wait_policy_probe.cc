// Helper of wait_policy_test, in two modes.
//
//   wait_policy_probe [IDLE_MS]
//     runs OpenMP parallel regions, then stays idle for a while and prints the CPU seconds
//     the process burnt while idle (its OpenMP threads spinning, if they do). The
//     environment it is started with decides how they wait.
//
//   wait_policy_probe teams own|kept REGIONS
//     first runs a parallel region on another thread: through OnOwnOpenMpThread (own), or
//     on a thread that stays alive meanwhile (kept), as a gRPC handler thread would. Then
//     the main thread runs REGIONS short parallel regions with a 20 us gap between them, as
//     a step's GEMMs have, and prints the voluntary context switches (threads going to
//     sleep) the process made meanwhile.
#include <omp.h>
#include <sys/resource.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/wait_policy.h"

namespace {

double CpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
         1e-6 * (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

long VoluntarySwitches() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_nvcsw;
}

// A parallel region of `spins` multiply-adds per thread; returns a value the caller keeps.
double Region(int spins) {
  double sink = 0;
#pragma omp parallel
  {
    double x = omp_get_thread_num();
    for (int i = 0; i < spins; ++i) x = x * 1.0000001 + 1e-9;
#pragma omp atomic
    sink += x;
  }
  return sink;
}

int Idle(int idle_ms) {
  double sink = 0;
  for (int region = 0; region < 10; ++region) sink += Region(100000);
  const double before = CpuSeconds();
  absl::SleepFor(absl::Milliseconds(idle_ms));
  std::printf("%d %.4f %g\n", omp_get_max_threads(), CpuSeconds() - before, sink);
  return sink > 0 ? 0 : 1;
}

int Teams(bool own, int regions) {
  double sink = 0;
  std::atomic<bool> done{false};
  std::thread kept;
  if (own) {
    sink += strata::OnOwnOpenMpThread([] { return Region(1000); });
  } else {
    std::atomic<bool> ran{false};
    kept = std::thread([&] {
      sink += Region(1000);
      ran.store(true);
      while (!done.load()) absl::SleepFor(absl::Milliseconds(1));
    });
    while (!ran.load()) absl::SleepFor(absl::Milliseconds(1));
  }
  sink += Region(1000);  // the main thread's team exists before counting starts
  const long before = VoluntarySwitches();
  for (int r = 0; r < regions; ++r) {
    sink += Region(1000);
    const absl::Time gap_end = absl::Now() + absl::Microseconds(20);
    while (absl::Now() < gap_end) {
    }
  }
  const long switches = VoluntarySwitches() - before;
  done.store(true);
  if (kept.joinable()) kept.join();
  std::printf("%d %ld %g\n", omp_get_max_threads(), switches, sink);
  return sink > 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 3 && std::strcmp(argv[1], "teams") == 0) {
    return Teams(std::strcmp(argv[2], "own") == 0, std::atoi(argv[3]));
  }
  return Idle(argc > 1 ? std::atoi(argv[1]) : 300);
}
