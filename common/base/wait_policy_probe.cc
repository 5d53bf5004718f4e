// Helper of wait_policy_test: runs OpenMP parallel regions, then stays idle for a while and
// prints the CPU seconds the process burnt while idle (its OpenMP threads spinning, if they
// do). The environment it is started with decides how they wait.
#include <omp.h>
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace {

double CpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
         1e-6 * (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

}  // namespace

int main(int argc, char** argv) {
  const int idle_ms = argc > 1 ? std::atoi(argv[1]) : 300;
  double sink = 0;
  for (int region = 0; region < 10; ++region) {
#pragma omp parallel
    {
      double x = omp_get_thread_num();
      for (int i = 0; i < 100000; ++i) x = x * 1.0000001 + 1e-9;
#pragma omp atomic
      sink += x;
    }
  }
  const double before = CpuSeconds();
  absl::SleepFor(absl::Milliseconds(idle_ms));
  std::printf("%d %.4f %g\n", omp_get_max_threads(), CpuSeconds() - before, sink);
  return sink > 0 ? 0 : 1;
}
