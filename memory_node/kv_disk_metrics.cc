#include "memory_node/kv_disk_metrics.h"

namespace strata {

void RegisterKvDiskMetrics(metrics::MetricsRegistry& registry, const std::string& node,
                           const KvDiskHost* host) {
  prometheus::Registry& r = registry.registry();
  const prometheus::Labels labels = {{"node", node}};
  auto counter = [&](const std::string& name, const std::string& help) {
    return &prometheus::BuildCounter().Name(name).Help(help).Register(r).Add(labels);
  };
  prometheus::Counter* read =
      counter("strata_kv_disk_read_bytes_total", "Bytes the disk tier read (loads of KV blocks).");
  prometheus::Counter* written = counter("strata_kv_disk_written_bytes_total",
                                         "Bytes the disk tier wrote (saves of KV blocks).");
  auto& moves = prometheus::BuildCounter()
                    .Name("strata_kv_disk_moves_total")
                    .Help(
                        "Disk-tier moves the scheduler ordered, by kind (save, load, drop) and "
                        "outcome (ok, failed: a full disk, an I/O error, a block that failed "
                        "its checksum).")
                    .Register(r);
  auto move = [&](const char* kind, const char* outcome) {
    return &moves.Add({{"node", node}, {"kind", kind}, {"outcome", outcome}});
  };
  prometheus::Counter* saves_ok = move("save", "ok");
  prometheus::Counter* saves_failed = move("save", "failed");
  prometheus::Counter* loads_ok = move("load", "ok");
  prometheus::Counter* loads_failed = move("load", "failed");
  prometheus::Counter* drops = move("drop", "ok");
  auto& seconds = prometheus::BuildCounter()
                      .Name("strata_kv_disk_io_seconds_total")
                      .Help(
                          "Time the disk tier spent on batches of saves and of loads (I/O and "
                          "the copies to and from the KV store), by kind.")
                      .Register(r);
  prometheus::Counter* save_seconds = &seconds.Add({{"node", node}, {"kind", "save"}});
  prometheus::Counter* load_seconds = &seconds.Add({{"node", node}, {"kind", "load"}});
  prometheus::Counter* checksum =
      counter("strata_kv_disk_checksum_failures_total",
              "KV blocks read from disk that failed their checksum (never served).");
  auto& space = prometheus::BuildGauge()
                    .Name("strata_kv_disk_bytes")
                    .Help(
                        "The disk tier's space, by state: used (blocks saved), free, staging "
                        "(DRAM buffers for blocks in flight, beside the KV budget).")
                    .Register(r);
  prometheus::Gauge* used = &space.Add({{"node", node}, {"state", "used"}});
  prometheus::Gauge* free = &space.Add({{"node", node}, {"state", "free"}});
  prometheus::Gauge* staging = &space.Add({{"node", node}, {"state", "staging"}});
  auto& read_ahead = prometheus::BuildCounter()
                         .Name("strata_kv_disk_read_ahead_layers_total")
                         .Help(
                             "Layer-wise pre-loading: layers of a step's attention that needed "
                             "KV still being read from disk, by outcome: hit (the read-ahead "
                             "had it in DRAM already), waited (attention waited for the disk).")
                         .Register(r);
  prometheus::Counter* ahead_hit = &read_ahead.Add({{"node", node}, {"outcome", "hit"}});
  prometheus::Counter* ahead_waited = &read_ahead.Add({{"node", node}, {"outcome", "waited"}});
  prometheus::Counter* ahead_seconds =
      counter("strata_kv_disk_read_ahead_wait_seconds_total",
              "Layer-wise pre-loading: time attention waited for KV still being read from disk.");
  prometheus::Counter* abandoned =
      counter("strata_kv_disk_read_ahead_abandoned_total",
              "Layer-wise pre-loads a step gave up waiting for (their loads are reported failed).");
  registry.AddRefresh([=] {
    const LoadGateStats g = host->gate().stats();
    metrics::SetCounterTo(*ahead_hit, static_cast<double>(g.ready_layers));
    metrics::SetCounterTo(*ahead_waited, static_cast<double>(g.waited_layers));
    metrics::SetCounterTo(*ahead_seconds, g.wait_seconds);
    metrics::SetCounterTo(*abandoned, static_cast<double>(g.abandoned));
  });
  registry.AddRefresh([=] {
    const std::optional<KvDiskTierStats> d = host->stats();
    if (!d) return;  // counters keep their last values across a reconfiguration
    metrics::SetCounterTo(*read, static_cast<double>(d->bytes_read));
    metrics::SetCounterTo(*written, static_cast<double>(d->bytes_written));
    metrics::SetCounterTo(*saves_ok, static_cast<double>(d->saves - d->failed_saves));
    metrics::SetCounterTo(*saves_failed, static_cast<double>(d->failed_saves));
    metrics::SetCounterTo(*loads_ok, static_cast<double>(d->loads - d->failed_loads));
    metrics::SetCounterTo(*loads_failed, static_cast<double>(d->failed_loads));
    metrics::SetCounterTo(*drops, static_cast<double>(d->drops));
    metrics::SetCounterTo(*checksum, static_cast<double>(d->checksum_failures));
    metrics::SetCounterTo(*save_seconds, d->save_seconds);
    metrics::SetCounterTo(*load_seconds, d->load_seconds);
    used->Set(static_cast<double>(d->used_extents * d->block_bytes));
    free->Set(static_cast<double>((d->extents - d->used_extents) * d->block_bytes));
    staging->Set(static_cast<double>(d->staging_bytes));
  });
}

}  // namespace strata
