// A memory node's Prometheus metrics (served on its --metrics_port), all read from
// MemoryServer::stats() at scrape: KV token slots used and free, attention time, frames,
// data-plane bytes and faults, and the pipeline bubble ratio (the share of the last scrape
// interval the node sat idle between frames while steps were flowing).
#ifndef STRATA_MEMORY_NODE_NODE_METRICS_H_
#define STRATA_MEMORY_NODE_NODE_METRICS_H_

#include <memory>
#include <string>

#include "common/metrics/metrics.h"
#include "memory_node/memory_server.h"

namespace strata {

// Registers the metrics of `server` (which must outlive the registry's endpoint).
void RegisterMemoryNodeMetrics(metrics::MetricsRegistry& registry, const std::string& node,
                               const MemoryServer* server);

}  // namespace strata

#endif  // STRATA_MEMORY_NODE_NODE_METRICS_H_
