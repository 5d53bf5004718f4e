// The server process's Prometheus metrics: vLLM's scheduler and request metrics under
// strata_ names (same meaning where the name matches), per-pool KV capacity, the
// scheduler's step time and batch size, and HTTP requests by route and status. Every
// series carries a model_name label.
//
// Histograms are fed by the scheduler's observer (scheduler thread) and the API's request
// observer (HTTP threads); gauges and totals are copied from Scheduler::Stats() at scrape.
#ifndef STRATA_SERVER_SERVER_METRICS_H_
#define STRATA_SERVER_SERVER_METRICS_H_

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "common/metrics/metrics.h"
#include "server/scheduler.h"

namespace strata {

class ServerMetrics {
 public:
  ServerMetrics(std::shared_ptr<metrics::MetricsRegistry> registry, const std::string& model_name,
                const Scheduler* scheduler);

  // Hooks to install on the scheduler and the API.
  SchedulerObserver Observer();
  void OnHttpRequest(const std::string& route, int status, double seconds);

  std::string Text() const { return registry_->Text(); }

 private:
  void Refresh();

  std::shared_ptr<metrics::MetricsRegistry> registry_;
  const std::string model_;
  const Scheduler* scheduler_;

  prometheus::Gauge* running_;
  prometheus::Gauge* waiting_;
  prometheus::Gauge* kv_usage_;
  prometheus::Gauge* paged_waste_;
  prometheus::Gauge* lookahead_window_;
  prometheus::Gauge* alive_compute_;
  prometheus::Gauge* step_period_;
  prometheus::Gauge* plan_ahead_margin_;
  prometheus::Gauge* stagger_;
  prometheus::Gauge* step_compute_;
  prometheus::Gauge* step_attention_;
  prometheus::Gauge* advised_memory_;
  prometheus::Counter* prefix_queries_;
  prometheus::Counter* prefix_hits_;
  prometheus::Counter* prefix_misses_;
  prometheus::Family<prometheus::Counter>* tier_hits_;
  prometheus::Family<prometheus::Counter>* admission_loads_;
  prometheus::Family<prometheus::Counter>* disk_blocks_;
  prometheus::Family<prometheus::Counter>* preloads_;
  prometheus::Family<prometheus::Counter>* evictions_;
  prometheus::Counter* truncations_;
  prometheus::Family<prometheus::Counter>* truncation_tokens_;
  prometheus::Family<prometheus::Gauge>* disk_extents_;
  prometheus::Counter* preemptions_;
  prometheus::Counter* planner_shortfalls_;
  prometheus::Counter* prompt_tokens_;
  prometheus::Counter* generation_tokens_;
  prometheus::Counter* prefill_rows_;
  prometheus::Counter* steps_;
  prometheus::Counter* rejected_;
  prometheus::Family<prometheus::Counter>* success_;
  prometheus::Family<prometheus::Gauge>* pool_tokens_;
  prometheus::Family<prometheus::Gauge>* pool_alive_;

  prometheus::Histogram* ttft_;
  prometheus::Histogram* itl_;
  prometheus::Histogram* e2e_;
  prometheus::Histogram* queue_;
  prometheus::Histogram* prefill_;
  prometheus::Histogram* decode_;
  prometheus::Histogram* prompt_len_;
  prometheus::Histogram* generation_len_;
  prometheus::Histogram* step_time_;
  prometheus::Histogram* step_rows_;
  prometheus::Histogram* step_seqs_;

  prometheus::Family<prometheus::Counter>* http_requests_;
  prometheus::Family<prometheus::Histogram>* http_latency_;
  std::mutex http_mu_;
  std::map<std::string, prometheus::Histogram*> http_latency_by_route_;
};

}  // namespace strata

#endif  // STRATA_SERVER_SERVER_METRICS_H_
