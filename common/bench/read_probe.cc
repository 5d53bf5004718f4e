#include "common/bench/read_probe.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/base/huge_pages.h"
#include "common/base/stopwatch.h"

namespace strata {

ReadProbe::ReadProbe(size_t bytes) : bytes_(bytes / 4096 * 4096) {
  // On huge pages, as the weights and the KV cache it is the bound of (huge_pages.h).
  buffer_ = static_cast<char*>(AllocateForStreaming(bytes_));
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < bytes_; i += 4096) std::memset(buffer_ + i, 1, 4096);
}

ReadProbe::~ReadProbe() { std::free(buffer_); }

double ReadProbe::Measure() const {
  // A share of the buffer for each thread, read front to back.
  const int threads = omp_get_max_threads();
  const size_t per = bytes_ / threads / 256 * 256;
  std::vector<ReadRun> shares;
  for (int t = 0; t < threads; ++t) shares.push_back({buffer_ + per * t, per});
  return MeasureRunsRead(shares, 1);
}

int64_t SumOfRuns(std::span<const ReadRun> runs, int streams, int64_t* bytes_read) {
  int64_t sink = 0, bytes = 0;
#pragma omp parallel reduction(+ : sink, bytes)
  {
    // This thread's share of the runs, `streams` at a time: a 256-byte block of each in
    // turn, then the next blocks, until the longest is read.
    const size_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    const size_t begin = runs.size() * t / threads, end = runs.size() * (t + 1) / threads;
    __m256i a[8];
    for (auto& x : a) x = _mm256_setzero_si256();
    auto load = [&](const char* p, int k) {
      a[k] = _mm256_add_epi64(a[k], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    };
    for (size_t g = begin; g < end; g += streams) {
      const size_t g_end = std::min(end, g + streams);
      size_t longest = 0;
      for (size_t r = g; r < g_end; ++r) {
        longest = std::max(longest, runs[r].bytes);
        bytes += static_cast<int64_t>(runs[r].bytes / 32 * 32);
      }
      for (size_t o = 0; o < longest; o += 256) {
        for (size_t r = g; r < g_end; ++r) {
          const char* p = static_cast<const char*>(runs[r].at) + o;
          if (o + 256 <= runs[r].bytes) {
            for (int k = 0; k < 8; ++k) load(p + 32 * k, k);
          } else {
            for (size_t i = 0; o + 32 * (i + 1) <= runs[r].bytes; ++i) load(p + 32 * i, 0);
          }
        }
      }
    }
    for (int k = 1; k < 8; ++k) a[0] = _mm256_add_epi64(a[0], a[k]);
    alignas(32) int64_t lanes[4];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), a[0]);
    sink += lanes[0] + lanes[1] + lanes[2] + lanes[3];
  }
  *bytes_read = bytes;
  return sink;
}

double MeasureRunsRead(std::span<const ReadRun> runs, int streams) {
  const Stopwatch watch;
  int64_t bytes = 0;
  const int64_t sink = SumOfRuns(runs, streams, &bytes);
  const double seconds = watch.ElapsedSeconds();
  // Keep the loads: the sum is used.
  asm volatile("" : : "r"(sink));
  return static_cast<double>(bytes) / seconds;
}

}  // namespace strata
