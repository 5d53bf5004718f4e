#include "memory_node/node_metrics.h"

#include <algorithm>

#include "common/base/stopwatch.h"
#include "memory_node/kv_disk_metrics.h"

namespace strata {

void RegisterMemoryNodeMetrics(metrics::MetricsRegistry& registry, const std::string& node,
                               const MemoryServer* server) {
  prometheus::Registry& r = registry.registry();
  const prometheus::Labels labels = {{"node", node}};
  auto counter = [&](const std::string& name, const std::string& help,
                     const prometheus::Labels& l) {
    return &prometheus::BuildCounter().Name(name).Help(help).Register(r).Add(l);
  };
  auto& kv = prometheus::BuildGauge()
                 .Name("strata_memory_node_kv_tokens")
                 .Help(
                     "KV token slots on this memory node, by state: used (assigned to "
                     "requests), free, total.")
                 .Register(r);
  prometheus::Gauge* kv_used = &kv.Add({{"node", node}, {"state", "used"}});
  prometheus::Gauge* kv_free = &kv.Add({{"node", node}, {"state", "free"}});
  prometheus::Gauge* kv_total = &kv.Add({{"node", node}, {"state", "total"}});
  prometheus::Gauge* peers = &prometheus::BuildGauge()
                                  .Name("strata_memory_node_peers")
                                  .Help("Connected compute nodes.")
                                  .Register(r)
                                  .Add(labels);
  prometheus::Gauge* parked = &prometheus::BuildGauge()
                                   .Name("strata_memory_node_parked_frames")
                                   .Help(
                                       "Frames waiting for a layer that is still loading from "
                                       "disk, and the frames of their peers behind them.")
                                   .Register(r)
                                   .Add(labels);
  prometheus::Counter* attention = counter("strata_memory_node_attention_seconds_total",
                                           "Time spent computing attention.", labels);
  prometheus::Counter* steps =
      counter("strata_memory_node_steps_total", "Step descriptors.", labels);
  prometheus::Counter* frames =
      counter("strata_memory_node_layer_frames_total", "Layer frames answered.", labels);
  prometheus::Counter* rows =
      counter("strata_memory_node_rows_total", "Query rows attended.", labels);
  auto& bytes = prometheus::BuildCounter()
                    .Name(metrics::kDataPlaneBytes)
                    .Help(metrics::kDataPlaneBytesHelp)
                    .Register(r);
  prometheus::Counter* sent = &bytes.Add({{"node", node}, {"peer", "all"}, {"direction", "sent"}});
  prometheus::Counter* received =
      &bytes.Add({{"node", node}, {"peer", "all"}, {"direction", "received"}});
  auto& errors = prometheus::BuildCounter()
                     .Name("strata_data_plane_errors_total")
                     .Help(
                         "Data-plane faults, by kind: checksum (payload mismatch), malformed "
                         "(bad header, size, step or layer), rejected_step (a descriptor "
                         "that did not apply), over_budget (a frame refused while its peer's "
                         "queued frames held their budget).")
                     .Register(r);
  prometheus::Counter* checksum = &errors.Add({{"node", node}, {"kind", "checksum"}});
  prometheus::Counter* malformed = &errors.Add({{"node", node}, {"kind", "malformed"}});
  prometheus::Counter* rejected = &errors.Add({{"node", node}, {"kind", "rejected_step"}});
  prometheus::Counter* over_budget = &errors.Add({{"node", node}, {"kind", "over_budget"}});
  prometheus::Gauge* bubble = &prometheus::BuildGauge()
                                   .Name(metrics::kBubbleRatio)
                                   .Help(metrics::kBubbleRatioHelp)
                                   .Register(r)
                                   .Add({{"node", node}, {"role", "memory"}});

  RegisterKvDiskMetrics(registry, node, &server->disk());

  struct Window {
    Stopwatch since;  // the start of the interval
    double attention = 0;
    uint64_t frames = 0;
  };
  auto window = std::make_shared<Window>();
  registry.AddRefresh([=] {
    const MemoryServerStats s = server->stats();
    kv_total->Set(static_cast<double>(s.kv_slots));
    kv_used->Set(static_cast<double>(s.kv_positions));
    kv_free->Set(static_cast<double>(std::max<int64_t>(0, s.kv_slots - s.kv_positions)));
    peers->Set(static_cast<double>(s.peers));
    parked->Set(static_cast<double>(s.parked_frames));
    metrics::SetCounterTo(*attention, s.attention_seconds);
    metrics::SetCounterTo(*steps, static_cast<double>(s.steps));
    metrics::SetCounterTo(*frames, static_cast<double>(s.layer_frames));
    metrics::SetCounterTo(*rows, static_cast<double>(s.rows));
    metrics::SetCounterTo(*sent, static_cast<double>(s.bytes_sent));
    metrics::SetCounterTo(*received, static_cast<double>(s.bytes_received));
    metrics::SetCounterTo(*checksum, static_cast<double>(s.checksum_failures));
    metrics::SetCounterTo(*malformed, static_cast<double>(s.malformed_frames));
    metrics::SetCounterTo(*rejected, static_cast<double>(s.rejected_steps));
    metrics::SetCounterTo(*over_budget, static_cast<double>(s.frames_over_budget));
    // Idle share of an interval in which frames flowed; 0 when nothing was asked of it.
    const double wall = window->since.ElapsedSeconds();
    window->since.Reset();
    if (s.layer_frames > window->frames && wall > 0) {
      bubble->Set(std::clamp(1.0 - (s.attention_seconds - window->attention) / wall, 0.0, 1.0));
    } else {
      bubble->Set(0);
    }
    window->attention = s.attention_seconds;
    window->frames = s.layer_frames;
  });
}

}  // namespace strata
