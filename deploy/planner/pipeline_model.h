// A discrete-event model of a strata deployment's decode loop, for sizing it: how many
// tokens per second, how long per token, and how idle each pool is, under each pipelining
// mode, from a handful of measured costs (a slice of GEMMs alone, an attention alone, the
// link). The planner command (planner_main.cc) prints it; the scheduler's sizing advice
// (server/step_clock.h) is its steady-state balance point.
//
// What is modelled. A decode step of one batch of `rows` sequences, each `context` tokens
// long, is a chain of L + 1 compute slices and L attentions: slice 0 (embedding, layer 0's
// q/k/v), attention 0, slice 1 (layer 0's output projection and FFN, layer 1's q/k/v), ...,
// attention L-1, slice L (the last FFN, the LM head, sampling). Slices run on a compute
// device; each attention is split evenly over the memory nodes (a batch's sequences are
// spread over the pool), sent over a link (latency + bytes / bandwidth each way), and run
// on every memory node at once. Every device and memory node is a server taking work in the
// order it became ready (first come, first served), one piece at a time.
//   off         one replica per batch, batches on separate devices; with
//               `asynchronous`, a batch's next step starts when the last one ends,
//               otherwise after the scheduler's round trip (`step_gap_us`);
//   two         two batches per replica on one device, interleaved slice by slice;
//   fixed       R replicas, one batch each, their step starts spaced by the (measured)
//               step period over R, as the scheduler does;
//   rotational  n batches on n - 1 replicas; slice k of batch j runs on replica
//               (j + k) mod (n - 1); the batch's context (its residual rows) migrates to the
//               next replica while its attention runs, and the attention output goes
//               straight there.
// Replicas map onto `compute_devices` devices round-robin, so several replicas may share
// one device (as on a machine with fewer cores than replicas).
//
// The scheduler's and the API's CPU time per step is a piece of device work where they
// share the compute device's cores (`serving_*_us`).
//
// What is not: prefill, admission and finishing (the batch is steady), and contention on
// the links (each pair has its own).
#ifndef STRATA_DEPLOY_PLANNER_PIPELINE_MODEL_H_
#define STRATA_DEPLOY_PLANNER_PIPELINE_MODEL_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace strata::planner {

// y(x) by linear interpolation between measured points, extended linearly past the ends.
class Curve {
 public:
  Curve() = default;
  explicit Curve(std::vector<std::pair<double, double>> points);
  // "x:y,x:y,...", x increasing.
  static absl::StatusOr<Curve> Parse(absl::string_view text);
  double At(double x) const;
  bool empty() const { return points_.empty(); }

 private:
  std::vector<std::pair<double, double>> points_;
};

struct Costs {
  int layers = 0;
  // GEMM time of one whole decode step (every slice, the LM head and sampling) on one
  // compute device, by rows in the batch, microseconds.
  Curve compute_us;
  // Attention of one step over all layers on one memory node holding the rows:
  // fixed + per_row * rows + per_position * rows * context, microseconds.
  double attention_fixed_us = 0.0;
  double attention_per_row_us = 0.0;
  double attention_per_position_us = 0.0;
  // One link, each direction.
  double link_latency_us = 0.0;
  double link_bytes_per_us = 1e9;
  // Per row and layer: q, k, v out; the output back. Per row: the context that migrates.
  double bytes_out_per_row = 0.0;
  double bytes_back_per_row = 0.0;
  double context_bytes_per_row = 0.0;
  // Between a batch's result and its next plan at the node (synchronous scheduling).
  double step_gap_us = 0.0;
  // CPU that serving takes per step of a batch on the compute device, where the scheduler,
  // the API and the compute node's service threads share its cores (one machine; 0 where
  // they have cores of their own): fixed + per_row * rows, microseconds. It runs on the
  // device right after the step ends, before anything queued behind.
  double serving_fixed_us = 0.0;
  double serving_per_row_us = 0.0;
};

enum class Mode { kOff, kTwo, kFixed, kRotational };
absl::StatusOr<Mode> ParseMode(absl::string_view name);
std::string ModeName(Mode mode);

struct Scenario {
  Mode mode = Mode::kOff;
  int rows = 1;       // per batch
  int context = 256;  // tokens per sequence
  int batches = 1;    // off: one per replica; two: 2 per replica; fixed: R; rotational: n
  int compute_devices = 1;
  int memory_nodes = 1;
  bool asynchronous = false;  // off only
};

struct Prediction {
  double tokens_per_s = 0.0;    // all batches
  double step_ms = 0.0;         // mean time between a batch's consecutive step ends
  double compute_bubble = 0.0;  // idle fraction of the compute devices
  double memory_bubble = 0.0;   // idle fraction of the memory nodes
};

// Replicas of the setup (devices hold them round-robin).
int Replicas(const Scenario& s);
absl::Status Validate(const Scenario& s);
// Simulates `steps` steps of every batch and measures the second half (steady state).
absl::StatusOr<Prediction> Simulate(const Costs& costs, const Scenario& s, int steps = 64);

}  // namespace strata::planner

#endif  // STRATA_DEPLOY_PLANNER_PIPELINE_MODEL_H_
