// KV for attention benchmarks: `elems` 16-bit values on huge pages, as the KV store asks for
// them (memory_node/kv_store.cc), filled with ordinary numbers: about 0.01 read as bf16,
// about 1 read as f16.
#ifndef STRATA_COMMON_BENCH_FILLED_KV_H_
#define STRATA_COMMON_BENCH_FILLED_KV_H_

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>

namespace strata {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using FilledKv = std::unique_ptr<uint16_t[], FreeDeleter>;

inline FilledKv MakeFilledKv(size_t elems) {
  constexpr size_t kHugePage = size_t{2} << 20;
  const size_t bytes = (elems * 2 + kHugePage - 1) & ~(kHugePage - 1);
  auto* kv = static_cast<uint16_t*>(std::aligned_alloc(kHugePage, bytes));
  madvise(kv, bytes, MADV_HUGEPAGE);
  std::mt19937 rng(1);
  for (size_t i = 0; i < elems; ++i) kv[i] = 0x3c00 | (rng() & 0x7f);
  return FilledKv(kv);
}

}  // namespace strata

#endif  // STRATA_COMMON_BENCH_FILLED_KV_H_
