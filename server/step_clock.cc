#include "server/step_clock.h"

#include <algorithm>
#include <cmath>

namespace strata {

int AdviseMemoryNodes(double compute_seconds, double attention_seconds, int memory_nodes,
                      int batches) {
  if (compute_seconds <= 0.0 || memory_nodes <= 0) return 0;
  const int others = std::max(batches, 2) - 1;
  // t_a(M') = t_a(M) * M / M' = t_m / others.
  const double nodes = attention_seconds * memory_nodes * others / compute_seconds;
  // A hair below an integer is that integer (timings are noisy, not exact).
  return static_cast<int>(std::clamp(std::ceil(nodes - 1e-6), 1.0, 1e6));
}

void StepClock::Observe(absl::Duration wall, const StepTiming& timing, bool decode_only,
                        bool overlapped) {
  // Decode steps only: a prefill step's long wall would hold the stagger wide for many
  // steps after it.
  if (!decode_only) return;
  period_.Observe(absl::ToDoubleSeconds(wall));
  if (timing.gemm_us == 0) return;
  const double compute = timing.gemm_us * 1e-6;
  double attention = timing.attention_us * 1e-6;
  if (overlapped) attention += compute;
  compute_.Observe(compute);
  attention_.Observe(attention);
}

}  // namespace strata
