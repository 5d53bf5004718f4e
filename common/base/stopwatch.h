// Elapsed time on the monotonic clock. The project's one time API is absl::Time and
// absl::Duration; this is the only place that reads std::chrono's steady clock, because
// absl has no monotonic clock. Not thread-safe (a value type).
#ifndef STRATA_COMMON_BASE_STOPWATCH_H_
#define STRATA_COMMON_BASE_STOPWATCH_H_

#include <chrono>
#include <cstdint>

#include "absl/time/time.h"

namespace strata {

class Stopwatch {
 public:
  // Starts now.
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}

  // Restarts now.
  void Reset() { start_ = std::chrono::steady_clock::now(); }

  // Time since construction or the last Reset().
  absl::Duration Elapsed() const {
    return absl::FromChrono(std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::steady_clock::now() - start_));
  }

  // Whole microseconds elapsed, rounded down; for the StepTiming fields.
  uint64_t ElapsedMicros() const {
    return static_cast<uint64_t>(absl::ToInt64Microseconds(Elapsed()));
  }

  // Seconds elapsed; for histograms and rates.
  double ElapsedSeconds() const { return absl::ToDoubleSeconds(Elapsed()); }

 private:
  std::chrono::steady_clock::time_point start_;
};

}  // namespace strata

#endif  // STRATA_COMMON_BASE_STOPWATCH_H_
