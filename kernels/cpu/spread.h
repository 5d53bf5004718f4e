// Requests spaced evenly over a loop: `total` of them over `steps` steps. Before step i
// (counting from 1) the loop has made floor(i * total / steps) requests in all, the way a
// line-drawing algorithm spaces its pixels, so none of them bunch up at the start.
//
// The kernels use it to ask for the next piece of work's cache lines while they compute on
// this one: a line every few steps keeps the requests in the shadow of the arithmetic,
// where a burst at the start would stall the loads the current work needs.
#ifndef STRATA_KERNELS_CPU_SPREAD_H_
#define STRATA_KERNELS_CPU_SPREAD_H_

#include <cassert>
#include <cstdint>

namespace strata::kernels {

class Spread {
 public:
  // steps > 0, total >= 0.
  Spread(int64_t total, int64_t steps) : total_(total), steps_(steps) {}

  // Call before each step: calls request() once for each request now due.
  template <class Request>
  void Step(Request&& request) {
    for (owed_ += total_; owed_ >= steps_; owed_ -= steps_) request();
  }

 private:
  int64_t total_, steps_;
  int64_t owed_ = 0;  // total * steps so far, less `steps_` per request made
};

// The 64-byte line that holds `at`, and how many lines hold [at, at + bytes) (0 when bytes
// <= 0): a run that starts part of the way into a line ends that much further along.
inline const char* LineOf(const void* at) {
  return reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(at) & ~uintptr_t{63});
}
inline int LinesHolding(const void* at, int bytes) {
  if (bytes <= 0) return 0;
  return static_cast<int>(((reinterpret_cast<uintptr_t>(at) & 63) + bytes + 63) / 64);
}

// The 64-byte lines of a few runs of memory, requested one at a time over `steps` calls
// of Request() (Spread), in order: the runs in the order added, each one's lines
// ascending. For requests whose burst at once would stall the loads around them.
class SpreadLines {
 public:
  static constexpr int kMaxRuns = 32;

  // A run of `bytes` at `at`: the lines that hold it (LinesHolding; part lines at either
  // end count whole); nothing if bytes is 0. At most kMaxRuns runs.
  void Add(const void* at, int bytes) {
    if (bytes <= 0) return;
    assert(runs_ < kMaxRuns);
    const int lines = LinesHolding(at, bytes);
    at_[runs_] = LineOf(at);
    lines_[runs_++] = lines;
    total_ += lines;
  }
  // Every line added is requested by the `steps`-th call of Request() (steps > 0).
  void Begin(int steps) { spread_ = Spread(total_, steps); }
  // request(line) for each line now due; calls past Begin's `steps` request nothing.
  template <class F>
  void Request(F&& request) {
    spread_.Step([&] {
      if (run_ == runs_) return;
      request(at_[run_] + line_ * 64);
      if (++line_ == lines_[run_]) {
        line_ = 0;
        ++run_;
      }
    });
  }

 private:
  const char* at_[kMaxRuns];
  int lines_[kMaxRuns];
  int runs_ = 0, total_ = 0, run_ = 0, line_ = 0;
  Spread spread_{0, 1};
};

}  // namespace strata::kernels

#endif  // STRATA_KERNELS_CPU_SPREAD_H_
