// Whether a prefix found on disk is read back or recomputed: the swap-or-recompute rule.
// Loading n blocks takes about `latency + n * per_block`, fitted to the load batches this
// pool has seen (a decayed least-squares line through their sizes and times, so a fixed
// round-trip cost and the disk's bandwidth both show). Recomputing them takes
// n * block_tokens / prefill_rate, with the rate measured from steps that computed prompt
// rows (one PrefillRate for the scheduler: every pool's prefixes compute alike). Short
// prefixes are recomputed when the round trip costs more than their prefill; long ones are
// loaded when the disk reads faster than the node prefills. Until both sides have been
// measured, it loads (measuring the disk needs loads). A batch that ran out of its deadline
// says only that the disk is at least that slow: prefixes are then recomputed, whatever
// their length. Once the disk's last measure is kRemeasureAfter old, one batch is let
// through to measure it again, so a disk that was slow for a while is not given up for good.
//
// Thread-safety: none; the scheduler's thread owns it.
#ifndef STRATA_SERVER_LOAD_RULE_H_
#define STRATA_SERVER_LOAD_RULE_H_

#include <cstdint>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/moving_average.h"

namespace strata {

// How fast prompt rows compute, smoothed over the steps that computed some.
class PrefillRate {
 public:
  // A step computed `rows` prompt rows in `seconds` of wall time.
  void Observe(int64_t rows, double seconds);
  double rows_per_second() const { return rate_.value(); }  // 0 before anything was measured

 private:
  MovingAverage rate_;
};

// One pool's disk, as its load batches show it.
class LoadRule {
 public:
  static constexpr absl::Duration kRemeasureAfter = absl::Seconds(30);

  // A batch of `blocks` loads came back after `seconds` (queueing on the node included).
  void ObserveLoad(int blocks, double seconds, absl::Time now = absl::Now());
  // A batch of loads ran out of its deadline: the disk is slower than it allows.
  void ObserveLate(absl::Time now = absl::Now());

  // Whether to load `blocks` blocks of `block_tokens` tokens rather than recompute them at
  // `prefill`'s rate. True once per kRemeasureAfter, to measure the disk again, for the
  // first caller after its last measure went stale.
  bool Load(int blocks, int block_tokens, const PrefillRate& prefill, absl::Time now = absl::Now());

  // The load estimate behind the rule (seconds); negative before any load was measured.
  double LoadSeconds(int blocks) const;
  // Its fixed part (the round trip before the first byte): LoadSeconds(0), or 0 unknown.
  double LatencySeconds() const { return LoadSeconds(0) > 0 ? LoadSeconds(0) : 0; }

 private:
  static constexpr double kDecay = 0.9;  // weight of the older observations, per new one
  // Decayed sums over load batches (n blocks, t seconds): weight, n, n^2, t, n*t.
  double w_ = 0, n_ = 0, nn_ = 0, t_ = 0, nt_ = 0;
  absl::Time last_observed_ = absl::InfinitePast();  // a measure, a late batch, or a probe
  bool late_ = false;  // the last measure was a batch that ran out of its deadline
};

// Layer-wise pre-loading's read-ahead (AttentionStore's rule, docs/architecture.md): a
// load of `layers` layers takes `latency_s`, then `body_s` spread evenly over the layers
// (t_l each); the chunk that needs it computes for `compute_s` (t_c per layer). If the
// chunk starts D after the load, layer i is in DRAM at latency + (i + 1) t_l and needed at
// D + i t_c, so no layer waits when
//   D >= latency + t_l + (layers - 1) * max(0, t_l - t_c):
// a disk faster than compute needs only its first layer ahead; a slower one needs enough
// read ahead that the last layer lands as compute reaches it. Returns that lead (seconds).
double PreloadLead(double latency_s, double body_s, double compute_s, int layers);

}  // namespace strata

#endif  // STRATA_SERVER_LOAD_RULE_H_
