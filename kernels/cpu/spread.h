// Requests spaced evenly over a loop: `total` of them over `steps` steps. Before step i
// (counting from 1) the loop has made floor(i * total / steps) requests in all, the way a
// line-drawing algorithm spaces its pixels, so none of them bunch up at the start.
//
// The kernels use it to ask for the next piece of work's cache lines while they compute on
// this one: a line every few steps keeps the requests in the shadow of the arithmetic,
// where a burst at the start would stall the loads the current work needs.
#ifndef STRATA_KERNELS_CPU_SPREAD_H_
#define STRATA_KERNELS_CPU_SPREAD_H_

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

}  // namespace strata::kernels

#endif  // STRATA_KERNELS_CPU_SPREAD_H_
