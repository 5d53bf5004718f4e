// Items split among an OpenMP team the way schedule(static) would split them, with one
// difference: a thread that has finished its own range takes the items still left at the
// end of another thread's range. On cores the team shares with other processes (a served
// decode step shares them with the scheduler, gRPC and HTTP threads), the OS stops one of
// the team's threads now and then; under a static split its partner then waits for it at
// the barrier that ends the region, and the step loses the whole interruption. Taking the
// stopped thread's remaining items loses about 1/team of it.
//
// Each thread takes its own items in order, front first, so it knows the item it will
// probably take next (to prefetch it); the others take from the back. Which thread computes
// an item never changes what the item's result is, so a kernel's bits do not depend on
// who ran what. Claims are a compare-and-swap on a cache line of the range's owner:
// uncontended except while someone takes from its back.
#ifndef STRATA_KERNELS_CPU_WORK_RANGES_H_
#define STRATA_KERNELS_CPU_WORK_RANGES_H_

#include <atomic>
#include <cassert>
#include <cstdint>
#include <vector>

namespace strata::kernels {

class WorkRanges {
 public:
  // [0, items) in `ranges` contiguous ranges, the first items % ranges one item longer
  // (schedule(static)'s split). Not thread-safe: call before the parallel region. Sized by
  // omp_get_max_threads() there, a team that turns out smaller (a region nested in another
  // runs on one thread) still takes every item: the ranges nobody owns are taken from the
  // back. Items fit in 32 bits.
  void Reset(int64_t items, int ranges) {
    assert(ranges >= 1 && items >= 0 && items < (int64_t{1} << 32));
    if (static_cast<int>(ranges_.size()) < ranges) ranges_ = std::vector<Range>(ranges);
    count_ = ranges;
    const int64_t share = items / ranges, extra = items % ranges;
    int64_t begin = 0;
    for (int i = 0; i < ranges; ++i) {
      const int64_t end = begin + share + (i < extra ? 1 : 0);
      ranges_[i].bounds.store(Pack(begin, end), std::memory_order_relaxed);
      begin = end;
    }
  }

  // The next item for thread `id` of the team: from the front of its own range, or, once
  // that is empty, from the back of the others', starting with its neighbour. -1 when no
  // item is left anywhere. A thread whose id has no range (a team larger than `ranges`)
  // only takes from the back.
  int64_t Next(int id) {
    if (id < count_) {
      if (const int64_t item = TakeFront(ranges_[id]); item >= 0) return item;
    }
    for (int i = 1; i <= count_; ++i) {
      const int victim = (id + i) % count_;
      if (victim == id) continue;
      if (const int64_t item = TakeBack(ranges_[victim]); item >= 0) return item;
    }
    return -1;
  }

  // The item thread `id` would take next from its own range, -1 if none; it may still be
  // taken by another thread first (a hint for prefetching, nothing more).
  int64_t PeekFront(int id) const {
    if (id >= count_) return -1;
    const uint64_t b = ranges_[id].bounds.load(std::memory_order_relaxed);
    return Front(b) < End(b) ? Front(b) : -1;
  }

 private:
  struct alignas(64) Range {
    std::atomic<uint64_t> bounds{0};  // front in the low 32 bits, end in the high 32
  };
  static uint64_t Pack(int64_t front, int64_t end) {
    return static_cast<uint64_t>(front) | static_cast<uint64_t>(end) << 32;
  }
  static int64_t Front(uint64_t b) { return static_cast<int64_t>(b & 0xffffffffu); }
  static int64_t End(uint64_t b) { return static_cast<int64_t>(b >> 32); }

  static int64_t TakeFront(Range& r) {
    uint64_t b = r.bounds.load(std::memory_order_relaxed);
    while (Front(b) < End(b)) {
      if (r.bounds.compare_exchange_weak(b, Pack(Front(b) + 1, End(b)),
                                         std::memory_order_relaxed)) {
        return Front(b);
      }
    }
    return -1;
  }
  static int64_t TakeBack(Range& r) {
    uint64_t b = r.bounds.load(std::memory_order_relaxed);
    while (Front(b) < End(b)) {
      if (r.bounds.compare_exchange_weak(b, Pack(Front(b), End(b) - 1),
                                         std::memory_order_relaxed)) {
        return End(b) - 1;
      }
    }
    return -1;
  }

  std::vector<Range> ranges_;
  int count_ = 0;
};

// The calling thread's WorkRanges, for the parallel region it is about to start: a kernel
// resets it and names the returned reference inside the region, which the team then shares
// (a thread_local named inside the region would be each team thread's own). One region at
// a time per calling thread: the kernels that use it never run inside one another.
inline WorkRanges& CallerWorkRanges() {
  thread_local WorkRanges work;
  return work;
}

}  // namespace strata::kernels

#endif  // STRATA_KERNELS_CPU_WORK_RANGES_H_
