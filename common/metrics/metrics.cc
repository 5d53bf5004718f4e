#include "common/metrics/metrics.h"

#include <cmath>
#include <exception>

#include "absl/strings/str_cat.h"
#include "common/base/crypto.h"
#include "common/base/logging.h"
#include "prometheus/exposer.h"
#include "prometheus/text_serializer.h"

namespace strata::metrics {

std::vector<double> LatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25,
          0.5,   0.75,   1.0,   2.5,  5.0,  7.5,  10,   20,   40,  60};
}

std::vector<double> FastLatencyBuckets() {
  return {1e-5, 2.5e-5, 5e-5,  1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3,
          5e-3, 0.01,   0.025, 0.05, 0.1,    0.25, 0.5,  1.0};
}

std::vector<double> CountBuckets(double max) {
  std::vector<double> b;
  for (double v = 1; v <= max; v *= 2) b.push_back(v);
  return b;
}

void MetricsRegistry::AddRefresh(std::function<void()> refresh) {
  std::lock_guard<std::mutex> lock(refresh_mu_);
  refresh_.push_back(std::move(refresh));
}

MetricsRegistry::MetricsRegistry() : registry_(std::make_shared<prometheus::Registry>()) {
  auto& refused = prometheus::BuildCounter()
                      .Name("strata_unauthenticated_total")
                      .Help(
                          "Internal calls and connections refused for missing or wrong cluster "
                          "credentials, by channel: control (gRPC) or data_plane (bootstrap).")
                      .Register(*registry_);
  prometheus::Counter* control = &refused.Add({{"channel", "control"}});
  prometheus::Counter* data_plane = &refused.Add({{"channel", "data_plane"}});
  AddRefresh([control, data_plane] {
    SetCounterTo(*control, static_cast<double>(ProcessAuthRefusals().control.load()));
    SetCounterTo(*data_plane, static_cast<double>(ProcessAuthRefusals().data_plane.load()));
  });
}

std::vector<prometheus::MetricFamily> MetricsRegistry::Collect() const {
  {
    std::lock_guard<std::mutex> lock(refresh_mu_);
    for (const auto& refresh : refresh_) refresh();
  }
  return registry_->Collect();
}

std::string MetricsRegistry::Text() const {
  return prometheus::TextSerializer().Serialize(Collect());
}

void SetCounterTo(prometheus::Counter& counter, double total) {
  const double delta = total - counter.Value();
  if (delta > 0 && std::isfinite(delta)) counter.Increment(delta);
}

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& host, int port, std::shared_ptr<MetricsRegistry> registry) {
  auto endpoint = std::unique_ptr<MetricsEndpoint>(new MetricsEndpoint);
  try {
    endpoint->exposer_ =
        std::make_unique<prometheus::Exposer>(absl::StrCat(host, ":", port), /*num_threads=*/2);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", host, ":", port, ": ", e.what()));
  }
  endpoint->registry_ = std::move(registry);
  endpoint->exposer_->RegisterCollectable(endpoint->registry_);
  const std::vector<int> ports = endpoint->exposer_->GetListeningPorts();
  if (ports.empty()) return absl::UnavailableError("the metrics endpoint has no port");
  endpoint->port_ = ports[0];
  return endpoint;
}

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::StartIfEnabled(
    const std::string& host, int port, std::shared_ptr<MetricsRegistry> registry) {
  if (port < 0) return std::unique_ptr<MetricsEndpoint>();
  auto endpoint = Start(host, port, std::move(registry));
  if (endpoint.ok()) {
    LOG(INFO) << "metrics on http://" << host << ":" << (*endpoint)->port() << "/metrics";
  }
  return endpoint;
}

MetricsEndpoint::~MetricsEndpoint() = default;

}  // namespace strata::metrics
