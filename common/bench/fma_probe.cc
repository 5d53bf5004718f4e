#include "common/bench/fma_probe.h"

#include <immintrin.h>
#include <omp.h>

#include <cstdint>

#include "common/base/stopwatch.h"

namespace strata {
namespace {

// Independent accumulators per thread: more than FMA latency (4 cycles) times pipes (2)
// on the CPUs this runs on, so the chains never wait on each other.
constexpr int kChains = 12;
constexpr int64_t kIterations = 1 << 22;

// Each returns a value that depends on every FMA, so that none is optimised away.
__attribute__((target("avx512f"))) float Fma512() {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(0.001f * c);
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t i = 0; i < kIterations; ++i) {
#pragma GCC unroll 12  // every chain in its own register
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
  }
  for (int c = 1; c < kChains; ++c) acc[0] = _mm512_add_ps(acc[0], acc[c]);
  return _mm512_reduce_add_ps(acc[0]);
}

__attribute__((target("avx2,fma"))) float Fma256() {
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(0.001f * c);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t i = 0; i < kIterations; ++i) {
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
  }
  for (int c = 1; c < kChains; ++c) acc[0] = _mm256_add_ps(acc[0], acc[c]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc[0]);
  float sum = 0;
  for (float x : lanes) sum += x;
  return sum;
}

}  // namespace

double MeasureFmaPeak(int vector_bits) {
  const int lanes = vector_bits / 32;
  int threads = 1;
  const Stopwatch watch;
  float sink = 0;
#pragma omp parallel reduction(+ : sink)
  {
#pragma omp single
    threads = omp_get_num_threads();
    sink += vector_bits == 512 ? Fma512() : Fma256();
  }
  const double seconds = watch.ElapsedSeconds();
  asm volatile("" : : "x"(sink));
  return 2.0 * kChains * lanes * static_cast<double>(kIterations) * threads / seconds;
}

}  // namespace strata
