#include "memory_node/node_metrics.h"

#include <algorithm>

#include "common/base/stopwatch.h"

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
                         "that did not apply).")
                     .Register(r);
  prometheus::Counter* checksum = &errors.Add({{"node", node}, {"kind", "checksum"}});
  prometheus::Counter* malformed = &errors.Add({{"node", node}, {"kind", "malformed"}});
  prometheus::Counter* rejected = &errors.Add({{"node", node}, {"kind", "rejected_step"}});
  prometheus::Gauge* bubble = &prometheus::BuildGauge()
                                   .Name(metrics::kBubbleRatio)
                                   .Help(metrics::kBubbleRatioHelp)
                                   .Register(r)
                                   .Add({{"node", node}, {"role", "memory"}});

  // The disk tier (memory_node/kv_disk_tier.h); zero without one.
  prometheus::Counter* disk_read = counter(
      "strata_kv_disk_read_bytes_total", "Bytes the disk tier read (loads of KV blocks).", labels);
  prometheus::Counter* disk_written =
      counter("strata_kv_disk_written_bytes_total",
              "Bytes the disk tier wrote (saves of KV blocks).", labels);
  auto& disk_moves = prometheus::BuildCounter()
                         .Name("strata_kv_disk_moves_total")
                         .Help(
                             "Disk-tier moves the scheduler ordered, by kind (save, load, drop) "
                             "and outcome (ok, failed: a full disk, an I/O error, a block that "
                             "failed its checksum).")
                         .Register(r);
  prometheus::Counter* saves_ok =
      &disk_moves.Add({{"node", node}, {"kind", "save"}, {"outcome", "ok"}});
  prometheus::Counter* saves_failed =
      &disk_moves.Add({{"node", node}, {"kind", "save"}, {"outcome", "failed"}});
  prometheus::Counter* loads_ok =
      &disk_moves.Add({{"node", node}, {"kind", "load"}, {"outcome", "ok"}});
  prometheus::Counter* loads_failed =
      &disk_moves.Add({{"node", node}, {"kind", "load"}, {"outcome", "failed"}});
  prometheus::Counter* drops =
      &disk_moves.Add({{"node", node}, {"kind", "drop"}, {"outcome", "ok"}});
  auto& disk_seconds = prometheus::BuildCounter()
                           .Name("strata_kv_disk_io_seconds_total")
                           .Help(
                               "Time the disk tier spent on batches of saves and of loads (I/O "
                               "and the copies to and from the KV store), by kind.")
                           .Register(r);
  prometheus::Counter* save_seconds = &disk_seconds.Add({{"node", node}, {"kind", "save"}});
  prometheus::Counter* load_seconds = &disk_seconds.Add({{"node", node}, {"kind", "load"}});
  prometheus::Counter* disk_checksum =
      counter("strata_kv_disk_checksum_failures_total",
              "KV blocks read from disk that failed their checksum (never served).", labels);
  auto& disk_space = prometheus::BuildGauge()
                         .Name("strata_kv_disk_bytes")
                         .Help(
                             "The disk tier's space, by state: used (blocks saved), free, "
                             "staging (DRAM buffers for blocks in flight, beside the KV budget).")
                         .Register(r);
  prometheus::Gauge* disk_used = &disk_space.Add({{"node", node}, {"state", "used"}});
  prometheus::Gauge* disk_free = &disk_space.Add({{"node", node}, {"state", "free"}});
  prometheus::Gauge* disk_staging = &disk_space.Add({{"node", node}, {"state", "staging"}});

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
    metrics::SetCounterTo(*attention, s.attention_seconds);
    metrics::SetCounterTo(*steps, static_cast<double>(s.steps));
    metrics::SetCounterTo(*frames, static_cast<double>(s.layer_frames));
    metrics::SetCounterTo(*rows, static_cast<double>(s.rows));
    metrics::SetCounterTo(*sent, static_cast<double>(s.bytes_sent));
    metrics::SetCounterTo(*received, static_cast<double>(s.bytes_received));
    metrics::SetCounterTo(*checksum, static_cast<double>(s.checksum_failures));
    metrics::SetCounterTo(*malformed, static_cast<double>(s.malformed_frames));
    metrics::SetCounterTo(*rejected, static_cast<double>(s.rejected_steps));
    if (const std::optional<KvDiskTierStats> d = server->disk_stats()) {
      metrics::SetCounterTo(*disk_read, static_cast<double>(d->bytes_read));
      metrics::SetCounterTo(*disk_written, static_cast<double>(d->bytes_written));
      metrics::SetCounterTo(*saves_ok, static_cast<double>(d->saves - d->failed_saves));
      metrics::SetCounterTo(*saves_failed, static_cast<double>(d->failed_saves));
      metrics::SetCounterTo(*loads_ok, static_cast<double>(d->loads - d->failed_loads));
      metrics::SetCounterTo(*loads_failed, static_cast<double>(d->failed_loads));
      metrics::SetCounterTo(*drops, static_cast<double>(d->drops));
      metrics::SetCounterTo(*disk_checksum, static_cast<double>(d->checksum_failures));
      metrics::SetCounterTo(*save_seconds, d->save_seconds);
      metrics::SetCounterTo(*load_seconds, d->load_seconds);
      disk_used->Set(static_cast<double>(d->used_extents * d->block_bytes));
      disk_free->Set(static_cast<double>((d->extents - d->used_extents) * d->block_bytes));
      disk_staging->Set(static_cast<double>(d->staging_bytes));
    }
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
