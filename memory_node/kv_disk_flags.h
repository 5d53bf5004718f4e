// The disk tier's flags, shared by the nodes that can run one: memory nodes, and compute
// nodes in co-located mode.
//   --kv_disk_dir  --kv_disk_budget_gib  --kv_disk_staging_mib  --kv_disk_queue_depth
//   --kv_disk_allow_buffered
#ifndef STRATA_MEMORY_NODE_KV_DISK_FLAGS_H_
#define STRATA_MEMORY_NODE_KV_DISK_FLAGS_H_

#include "absl/status/statusor.h"
#include "memory_node/kv_disk_tier.h"

namespace strata {

// The tier's options from the flags (an empty dir: no tier). A directory the tier cannot
// use is an error now, at the node's start, not a missing tier at its first configuration.
absl::StatusOr<KvDiskTierOptions> KvDiskOptionsFromFlags();

}  // namespace strata

#endif  // STRATA_MEMORY_NODE_KV_DISK_FLAGS_H_
