// What the scheduler learns from step timings: the step period of a compute replica, the
// stagger between replicas under fixed pipelining, and how many memory nodes would balance
// the compute pool against the memory pool.
//
// Fixed staggered pipelining (Lamina §5.1.2): R replicas, each with one batch, share the
// memory nodes. If they start their steps together, their attention phases collide on the
// memory nodes and their GEMM phases leave the memory nodes idle. Spacing the starts by
// period / R (the period measured, so that the stagger follows the batches as they grow and
// shrink) makes the attention phases take turns.
//
// Sizing (Lamina's balance point): with n batches in flight over one memory pool, a compute
// period has room for n - 1 attention phases of the other batches, so the pools are balanced
// when one batch's attention takes t_a = t_m / (n - 1). Attention time falls as 1 / memory
// nodes (a step's sequences are spread over the pool), which gives the advice below.
#ifndef STRATA_SERVER_STEP_CLOCK_H_
#define STRATA_SERVER_STEP_CLOCK_H_

#include "absl/time/time.h"
#include "common/protocol/step.h"
#include "server/moving_average.h"

namespace strata {

// Memory nodes that would make t_a = t_m / (n - 1), given t_a measured on `memory_nodes`
// nodes. `batches` below 2 counts as 2 (the advice for --pipelining=two). At least 1; 0 when
// there is nothing to go on (no compute time measured, or no memory nodes).
int AdviseMemoryNodes(double compute_seconds, double attention_seconds, int memory_nodes,
                      int batches);

class StepClock {
 public:
  // A step came back: `wall` from sending its plan to its result. `decode_only`: every row
  // decodes (the shape sizing is about). `overlapped`: another batch ran on the node while
  // this one waited (two lanes), so the wait is what attention took beyond that batch's
  // GEMMs.
  void Observe(absl::Duration wall, const StepTiming& timing, bool decode_only, bool overlapped);

  // Smoothed wall time of decode steps (zero before the first).
  absl::Duration period() const { return absl::Seconds(period_.value()); }
  // How long after one replica's step start the next replica may start.
  absl::Duration StaggerGap(int replicas) const {
    return replicas > 1 ? period() / replicas : absl::ZeroDuration();
  }
  // Smoothed per-step GEMM time (t_m) and attention time (t_a) of decode steps. Under two
  // lanes t_a is estimated as wait + the GEMM time that hid the rest; a step that did not
  // wait at all says only t_a <= t_m, and counts as t_a = t_m.
  double compute_seconds() const { return compute_.value(); }
  double attention_seconds() const { return attention_.value(); }

 private:
  MovingAverage period_;  // seconds
  MovingAverage compute_;
  MovingAverage attention_;
};

}  // namespace strata

#endif  // STRATA_SERVER_STEP_CLOCK_H_
