// The disk tier's Prometheus metrics (kv_disk_tier.h), labelled by node, read at scrape:
// bytes read and written, moves by kind and outcome, I/O time, checksum failures, and space
// (used, free, staging). Zero while the node has no tier.
#ifndef STRATA_MEMORY_NODE_KV_DISK_METRICS_H_
#define STRATA_MEMORY_NODE_KV_DISK_METRICS_H_

#include <string>

#include "common/metrics/metrics.h"
#include "memory_node/kv_disk_host.h"

namespace strata {

// `host` must outlive the registry's endpoint.
void RegisterKvDiskMetrics(metrics::MetricsRegistry& registry, const std::string& node,
                           const KvDiskHost* host);

}  // namespace strata

#endif  // STRATA_MEMORY_NODE_KV_DISK_METRICS_H_
