// The streaming-read probe that benchmarks measure memory-bound work against: the read
// bandwidth of all threads of the OpenMP team streaming through a buffer larger than the
// last-level cache. Loads only: a copy would count its bytes twice.
#ifndef STRATA_COMMON_BENCH_READ_PROBE_H_
#define STRATA_COMMON_BENCH_READ_PROBE_H_

#include <cstddef>
#include <cstdint>
#include <span>

#include "common/bench/median.h"  // Median, which the probe's users report with

namespace strata {

// A run of memory for MeasureRunsRead: `bytes` at `at`.
struct ReadRun {
  const void* at;
  size_t bytes;
};

// The probe's loads over the caller's own layout: one pass over `runs` (their whole
// 32-byte pieces), each thread of the OpenMP team taking an even share of them in order
// and reading `streams` of its runs at once, a 256-byte block of each in turn; bytes read
// per second. For the read bound of data laid out as a benchmark reads it (attention's KV
// slots in scattered runs) against ReadProbe's one sequential share per thread. Concurrent
// runs read faster: on the Zen 5 of docs/benchmarks.md, the scattered runs of 16 attention
// slots (24 KiB each) read at about 0.6 of the sequential probe one at a time, 0.7 two at
// a time and 0.8 four or eight at a time ("The KV layout's own read bound").
double MeasureRunsRead(std::span<const ReadRun> runs, int streams);

// The loads of MeasureRunsRead, untimed: the sum of the 64-bit words it reads (wrapping),
// and in *bytes_read how many bytes that is.
int64_t SumOfRuns(std::span<const ReadRun> runs, int streams, int64_t* bytes_read);

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
