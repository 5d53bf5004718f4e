// Memory for the large arrays that kernels stream through every step (a linear layer's
// packed weight, a benchmark's probe buffer): aligned to 2 MiB and advised for transparent
// huge pages (MADV_HUGEPAGE), as the KV store's mapping is (memory_node/kv_store.cc).
//
// Where the kernel's THP setting is "madvise" (the setting of the machine these notes are
// measured on), only advised memory gets huge pages; the rest is mapped in 4 KiB pages, and
// a stream of them costs a TLB miss and a page walk every 4 KiB, on which the hardware
// prefetchers also stop. With its weights on huge pages the demo model's batch-1 decode
// step took 0.85-0.96 of its time, and the read probe read 10-15% more (docs/benchmarks.md,
// "Weights and the read probe on huge pages"). Under "always" nothing changes; under "never"
// the advice is ignored.
//
// Only whole huge pages are advised: an array's last partial one, and an array under one
// huge page, stay on 4 KiB pages, so that no array takes more memory than it uses (a huge
// page is made resident whole, by its first touch).
#ifndef STRATA_COMMON_BASE_HUGE_PAGES_H_
#define STRATA_COMMON_BASE_HUGE_PAGES_H_

#include <sys/mman.h>

#include <cstddef>
#include <cstdlib>
#include <new>

namespace strata {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// `bytes` of memory, 2 MiB-aligned with its whole huge pages advised where it holds one or
// more, else 64-byte aligned; for std::free. Null if the allocation fails.
inline void* AllocateForStreaming(size_t bytes) {
  void* p = nullptr;
  if (bytes < kHugePageBytes) return posix_memalign(&p, 64, bytes) == 0 ? p : nullptr;
  if (posix_memalign(&p, kHugePageBytes, bytes) != 0) return nullptr;
  madvise(p, bytes / kHugePageBytes * kHugePageBytes, MADV_HUGEPAGE);
  return p;
}

// A standard allocator over AllocateForStreaming, for a std::vector of weights.
template <class T>
struct StreamingAllocator {
  using value_type = T;
  StreamingAllocator() = default;
  template <class U>
  StreamingAllocator(const StreamingAllocator<U>&) {}  // NOLINT: converting, as allocators are
  T* allocate(size_t n) {
    void* p = AllocateForStreaming(n * sizeof(T));
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { std::free(p); }
  template <class U>
  bool operator==(const StreamingAllocator<U>&) const {
    return true;
  }
};

}  // namespace strata

#endif  // STRATA_COMMON_BASE_HUGE_PAGES_H_
