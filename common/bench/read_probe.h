// The streaming-read probe that benchmarks measure memory-bound work against: the read
// bandwidth of all threads of the OpenMP team streaming through a buffer larger than the
// last-level cache. Loads only: a copy would count its bytes twice.
#ifndef STRATA_COMMON_BENCH_READ_PROBE_H_
#define STRATA_COMMON_BENCH_READ_PROBE_H_

#include <cstddef>

#include "common/bench/median.h"  // Median, which the probe's users report with

namespace strata {

class ReadProbe {
 public:
  // Allocates the buffer and touches every page (first touch is slow).
  explicit ReadProbe(size_t bytes = size_t{512} << 20);
  ~ReadProbe();
  ReadProbe(const ReadProbe&) = delete;
  ReadProbe& operator=(const ReadProbe&) = delete;

  // One pass over the buffer; bytes per second.
  double Measure() const;

 private:
  char* buffer_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace strata

#endif  // STRATA_COMMON_BENCH_READ_PROBE_H_
