// Prometheus metrics shared by strata's processes, on prometheus-cpp.
//
// A process keeps its metrics in a MetricsRegistry: prometheus-cpp families plus refresh
// hooks that copy gauges and totals from the component that owns them (the scheduler's
// stats, a node's counters) just before each scrape, so hot paths never touch metrics they
// already count. The server exposes the text through its HTTP API's /metrics; nodes that
// serve no HTTP start a MetricsEndpoint on a port of their own.
//
// Names follow Prometheus' rules (and promtool's): a strata_ prefix, no colons, base units
// (seconds, bytes), counters ending in _total.
#ifndef STRATA_COMMON_METRICS_METRICS_H_
#define STRATA_COMMON_METRICS_METRICS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace prometheus {
class Exposer;
}

namespace strata::metrics {

// Families that compute and memory nodes both export, with one description.
inline constexpr char kDataPlaneBytes[] = "strata_data_plane_bytes_total";
inline constexpr char kDataPlaneBytesHelp[] =
    "Data-plane bytes (headers included), by peer and direction.";
inline constexpr char kBubbleRatio[] = "strata_pipeline_bubble_ratio";
inline constexpr char kBubbleRatioHelp[] =
    "Share of the last scrape interval that a node sat idle, over intervals in which it "
    "worked (compute: its step thread waiting for attention or for a plan; memory: "
    "waiting for q/k/v).";

// Bucket boundaries.
std::vector<double> LatencyBuckets();          // 1 ms .. 60 s, for request-level latencies
std::vector<double> FastLatencyBuckets();      // 10 us .. 1 s, for per-layer and per-step times
std::vector<double> CountBuckets(double max);  // 1, 2, 4, ... up to max

// Every registry also exports strata_unauthenticated_total{channel}: the process's calls and
// connections refused for missing or wrong cluster credentials (common/base/crypto.h).
class MetricsRegistry : public prometheus::Collectable {
 public:
  MetricsRegistry();

  prometheus::Registry& registry() { return *registry_; }

  // Runs before every scrape (under a lock: hooks never run concurrently).
  void AddRefresh(std::function<void()> refresh);

  // prometheus::Collectable: refreshes, then collects.
  std::vector<prometheus::MetricFamily> Collect() const override;

  // The exposition text (format 0.0.4).
  std::string Text() const;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  mutable std::mutex refresh_mu_;
  std::vector<std::function<void()>> refresh_;
};

// Sets a prometheus counter to a running total kept elsewhere (counters only go up: a total
// that went down, e.g. after a restart of its source, is ignored until it passes again).
void SetCounterTo(prometheus::Counter& counter, double total);

// Serves a registry on http://host:port/metrics (prometheus-cpp's exposer, two threads).
class MetricsEndpoint {
 public:
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const std::string& host, int port, std::shared_ptr<MetricsRegistry> registry);
  // Start() when port >= 0 (and logs where it serves); null when port < 0 (off).
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> StartIfEnabled(
      const std::string& host, int port, std::shared_ptr<MetricsRegistry> registry);
  ~MetricsEndpoint();
  int port() const { return port_; }

 private:
  MetricsEndpoint() = default;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::shared_ptr<MetricsRegistry> registry_;
  int port_ = 0;
};

}  // namespace strata::metrics

#endif  // STRATA_COMMON_METRICS_METRICS_H_
