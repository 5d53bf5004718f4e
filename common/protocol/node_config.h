// What the scheduler tells a node when it configures it, what the node answers, and the
// status a node reports: plain structs. The nodes' cores (MemoryServer, ComputeNode) take
// and return these; their gRPC services convert at the edge (node_config_proto.h).
#ifndef STRATA_COMMON_PROTOCOL_NODE_CONFIG_H_
#define STRATA_COMMON_PROTOCOL_NODE_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/protocol/step_plan.h"

namespace strata {

// The model as the KV side sees it.
struct ModelShape {
  std::string name;
  uint32_t num_layers = 0;
  uint32_t num_heads = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  std::string kv_dtype;  // "bf16" or "f16"
  uint32_t vocab_size = 0;
  uint32_t max_position_embeddings = 0;
};

// A node's state for heartbeats, health checks and metrics.
struct NodeStatus {
  bool ready = false;
  uint64_t kv_slots_total = 0;
  uint64_t kv_slots_in_tables = 0;  // positions held in request slot tables
  uint64_t steps_executed = 0;
  std::string error;
  // Memory nodes: data-plane totals since start.
  uint64_t attention_us = 0;
  uint64_t layer_frames = 0;
  uint64_t bytes_received = 0;
  uint64_t bytes_sent = 0;
  uint64_t checksum_failures = 0;
  uint64_t malformed_frames = 0;
};

// Scheduler -> memory node: its pool, the model and its KV slots, for one epoch.
struct MemoryConfig {
  uint64_t epoch = 0;
  PoolIndex pool;
  ModelShape model;
  uint64_t num_slots = 0;
  int32_t disk_block_tokens = 0;  // the disk tier's block (0: no disk tier)
  uint64_t max_step_rows = 0;     // rows of one step at most (0: not bounded by rows)
};

// A node's disk tier under its KV pool, as its configuration acknowledges it.
struct DiskTierAck {
  uint64_t extents = 0;  // 0: no disk tier
  bool direct = false;   // O_DIRECT
  uint64_t block_bytes = 0;
  uint64_t tier = 0;  // names this opening of the tier in the moves meant for it
};

struct MemoryConfigAck {
  uint64_t num_slots = 0;
  uint64_t kv_bytes = 0;
  DiskTierAck disk;
};

// Scheduler -> memory node: one move of a KV block between DRAM slots and a disk extent
// (proto KvMove).
struct KvMove {
  enum class Kind { kSave, kLoad, kDrop };
  Kind kind = Kind::kSave;
  uint64_t extent = 0;
  uint64_t key = 0;
  std::vector<int32_t> slots;
  uint64_t ticket = 0;  // kLoad: non-zero for layer-wise pre-loading (proto KvMove.ticket)
};

struct MemoryNodeAddress {
  PoolIndex pool;
  std::string name;
  std::string data_address;
};

// A rotation replica the scheduler declared dead (proto DepartedReplica): the contexts it
// owes of steps up to `through_step` will not come.
struct DepartedReplica {
  std::string context_address;
  uint64_t through_step = 0;
};

// Scheduler -> compute node: where attention runs. Co-located mode has no memory nodes; in
// disaggregated mode the list holds the live memory nodes (possibly none for a while).
struct ComputeConfig {
  uint64_t epoch = 0;
  std::vector<MemoryNodeAddress> memory_nodes;
  bool disaggregated = false;
  int32_t disk_block_tokens = 0;  // co-located mode: the disk tier's block; 0: none
  std::vector<DepartedReplica> departed_replicas;  // rotational pipelining
};

struct ComputeConfigAck {
  uint64_t local_kv_slots = 0;  // co-located mode: slots of the node's own KV cache
  // Co-located mode: the disk tier under that cache (0 extents: none).
  DiskTierAck disk;
};

}  // namespace strata

#endif  // STRATA_COMMON_PROTOCOL_NODE_CONFIG_H_
