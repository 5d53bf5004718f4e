#include "common/bench/read_probe.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

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
  const Stopwatch watch;
  int64_t sink = 0;
#pragma omp parallel reduction(+ : sink)
  {
    const size_t per = bytes_ / omp_get_num_threads() / 256 * 256;
    const auto* p = reinterpret_cast<const __m256i*>(buffer_ + per * omp_get_thread_num());
    __m256i a[8];
    for (auto& x : a) x = _mm256_setzero_si256();
    for (size_t i = 0; i < per / 32; i += 8) {
      for (int k = 0; k < 8; ++k) a[k] = _mm256_add_epi64(a[k], _mm256_load_si256(p + i + k));
    }
    for (int k = 1; k < 8; ++k) a[0] = _mm256_add_epi64(a[0], a[k]);
    alignas(32) int64_t lanes[4];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), a[0]);
    sink += lanes[0] + lanes[1] + lanes[2] + lanes[3];
  }
  const double seconds = watch.ElapsedSeconds();
  // Keep the loads: the sum is used.
  asm volatile("" : : "r"(sink));
  return static_cast<double>(bytes_) / seconds;
}

}  // namespace strata
