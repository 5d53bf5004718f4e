// KV for attention benchmarks: `elems` 16-bit values on huge pages (common/base/huge_pages.h),
// as the KV store asks for them (memory_node/kv_store.cc), filled with ordinary numbers: about 0.01
// read as bf16, about 1 read as f16.
#ifndef STRATA_COMMON_BENCH_FILLED_KV_H_
#define STRATA_COMMON_BENCH_FILLED_KV_H_

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>

#include "common/base/huge_pages.h"

namespace strata {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using FilledKv = std::unique_ptr<uint16_t[], FreeDeleter>;

inline FilledKv MakeFilledKv(size_t elems) {
  auto* kv = static_cast<uint16_t*>(AllocateForStreaming(elems * 2));
  std::mt19937 rng(1);
  for (size_t i = 0; i < elems; ++i) kv[i] = 0x3c00 | (rng() & 0x7f);
  return FilledKv(kv);
}

}  // namespace strata

#endif  // STRATA_COMMON_BENCH_FILLED_KV_H_
