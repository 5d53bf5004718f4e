// A compute node's Prometheus metrics (served on its --metrics_port): steps and their
// time split (GEMMs vs waiting for memory nodes), the per-layer attention round trip,
// data-plane bytes per memory node, transport errors, and the pipeline bubble ratio (the
// share of step time spent waiting for attention answers).
#ifndef STRATA_COMPUTE_NODE_NODE_METRICS_H_
#define STRATA_COMPUTE_NODE_NODE_METRICS_H_

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "common/base/stopwatch.h"
#include "common/metrics/metrics.h"
#include "common/protocol/step.h"
#include "compute_node/compute_node.h"
#include "compute_node/step_channel.h"

namespace strata {

class ComputeNodeMetrics {
 public:
  ComputeNodeMetrics(std::shared_ptr<metrics::MetricsRegistry> registry, std::string node);

  // Step thread.
  void OnStep(const StepResult& result);
  void OnLayerRoundTrip(double seconds);
  // Between steps of one stream: from writing a result to having the next plan.
  void OnPlanWait(double seconds);
  // Reads the node's transport counters at each scrape. `node` must outlive the registry's
  // endpoint.
  void Attach(const ComputeNode* node);
  // Reads the step channel's counters at each scrape; `channel` must outlive the endpoint.
  void AttachStepChannel(const StepChannel* channel);

 private:
  void Refresh();

  std::shared_ptr<metrics::MetricsRegistry> registry_;
  const std::string node_;
  std::atomic<const ComputeNode*> compute_node_{nullptr};
  std::atomic<const StepChannel*> step_channel_{nullptr};

  prometheus::Counter* steps_;
  prometheus::Counter* step_seconds_total_;
  prometheus::Counter* gemm_seconds_;
  prometheus::Counter* wait_seconds_;
  prometheus::Counter* rows_;
  prometheus::Counter* failed_steps_;
  prometheus::Histogram* step_seconds_;
  prometheus::Histogram* step_rows_;
  prometheus::Histogram* round_trip_;
  prometheus::Histogram* plan_wait_;
  prometheus::Gauge* bubble_;
  prometheus::Gauge* kv_total_;
  prometheus::Gauge* kv_used_;
  prometheus::Gauge* gemm_primitives_;
  prometheus::Family<prometheus::Counter>* bytes_;
  prometheus::Family<prometheus::Counter>* errors_;
  prometheus::Family<prometheus::Counter>* contexts_;  // rotational pipelining
  prometheus::Family<prometheus::Counter>* step_frames_;
  prometheus::Counter* plans_polled_;
  prometheus::Counter* answers_polled_;

  // The bubble ratio over the interval since the previous scrape: the step thread's idle
  // time (waiting for attention, or for a plan) over the interval's wall time. With two
  // batches in flight the steps overlap, so step time would count twice; wall time does not.
  std::mutex window_mu_;
  Stopwatch window_;
  double last_idle_ = 0, plan_wait_total_ = 0, last_steps_ = 0;
};

}  // namespace strata

#endif  // STRATA_COMPUTE_NODE_NODE_METRICS_H_
