// Elapsed time on the monotonic clock, for the timings a step reports (StepTiming).
#ifndef STRATA_COMMON_BASE_STOPWATCH_H_
#define STRATA_COMMON_BASE_STOPWATCH_H_

#include <chrono>
#include <cstdint>

namespace strata {

// Microseconds from `start` until now.
inline uint64_t MicrosSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                               start)
      .count();
}

}  // namespace strata

#endif  // STRATA_COMMON_BASE_STOPWATCH_H_
