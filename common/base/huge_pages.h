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
// page is made resident whole, by its first touch). Many arrays kept for a process's life
// (a model's weights) go into a StreamingArena instead, where they follow one another in
// advised chunks and share their partial huge pages: all of them on huge pages, and no
// more memory resident than they use (docs/benchmarks.md, "Only whole huge pages advised").
#ifndef STRATA_COMMON_BASE_HUGE_PAGES_H_
#define STRATA_COMMON_BASE_HUGE_PAGES_H_

#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <new>
#include <vector>

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

// Arrays placed one after another, 64-byte aligned, in chunks of whole huge pages that are
// all advised: for arrays allocated once and kept as long as the arena (a model's weights).
// Memory is given back only when the arena goes. A chunk's end beyond the huge page where
// its last array ends is never touched, so it is not resident.
//
// Thread-safety: not thread-safe.
class StreamingArena {
 public:
  // Chunks of `chunk_bytes` (rounded up to whole huge pages), or of one array where it is
  // larger.
  explicit StreamingArena(size_t chunk_bytes = size_t{64} << 20)
      : chunk_bytes_(WholeHugePages(chunk_bytes)) {}
  ~StreamingArena() {
    for (void* chunk : chunks_) std::free(chunk);
  }
  StreamingArena(const StreamingArena&) = delete;
  StreamingArena& operator=(const StreamingArena&) = delete;

  // `bytes` of memory, 64-byte aligned; null if the allocation fails.
  void* Allocate(size_t bytes) {
    bytes = (bytes + 63) / 64 * 64;
    if (bytes > left_) {
      const size_t size = std::max(chunk_bytes_, WholeHugePages(bytes));
      void* chunk = AllocateForStreaming(size);  // whole huge pages: all advised
      if (chunk == nullptr) return nullptr;
      chunks_.push_back(chunk);
      next_ = static_cast<char*>(chunk);
      left_ = size;
    }
    void* p = next_;
    next_ += bytes;
    left_ -= bytes;
    return p;
  }
  size_t chunks() const { return chunks_.size(); }

 private:
  static size_t WholeHugePages(size_t bytes) {
    return std::max<size_t>(1, (bytes + kHugePageBytes - 1) / kHugePageBytes) * kHugePageBytes;
  }

  const size_t chunk_bytes_;
  std::vector<void*> chunks_;
  char* next_ = nullptr;
  size_t left_ = 0;
};

}  // namespace strata

#endif  // STRATA_COMMON_BASE_HUGE_PAGES_H_
