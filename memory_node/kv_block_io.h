// Moves a block of KV between a memory node's DRAM store and the disk tier's block file
// (groundwork of the disk tier: nothing drives it yet).
//
// A block is the KV of `block_tokens` token slots across every layer. On disk it is one
// extent whose sections are the layers, each holding that layer's K rows then its V rows
// for the block's tokens, in token order: a layer's KV for the block's span is one read,
// and verified alone, which is what layer-wise pre-loading (reading layer l + 1 while layer
// l computes) needs.
//
// Save gathers a block from the store's slots and writes it; LoadLayers reads the layers
// asked for and scatters them into the store's slots (which may be other slots than it was
// saved from: a block is reloaded wherever the scheduler has room). A layer that fails its
// checksum is reported (DataLoss) and nothing of it is written into the store.
//
// Thread-safety: one thread at a time (the memory node's disk worker); the slots written
// must not be read by attention until LoadLayers returns.
#ifndef STRATA_MEMORY_NODE_KV_BLOCK_IO_H_
#define STRATA_MEMORY_NODE_KV_BLOCK_IO_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "memory_node/kv_disk.h"
#include "memory_node/kv_store.h"

namespace strata {

class KvBlockIo {
 public:
  // `disk` must have been opened with KvBlockOptions(store config, block_tokens) and both
  // must outlive this object.
  KvBlockIo(KvStore* store, KvDisk* disk, int block_tokens);

  // What KvDisk needs for blocks of `block_tokens` tokens of this store: one section per
  // layer.
  static KvDiskOptions DiskOptions(const KvStoreConfig& store, int block_tokens);

  // Writes the KV of `slots` (block_tokens of them; fewer for a partial block) as extent
  // `extent` under `key`.
  absl::Status Save(uint64_t extent, uint64_t key, std::span<const int32_t> slots);
  // Reads `layers` of extent `extent` (under `key`) into `slots`; each layer succeeds or
  // fails alone (`layer_status`, one per layer asked for, may be null).
  absl::Status LoadLayers(uint64_t extent, uint64_t key, std::span<const int> layers,
                          std::span<const int32_t> slots,
                          std::vector<absl::Status>* layer_status = nullptr);

 private:
  // A block's slots: 1 to block_tokens of them, all in the store.
  absl::Status CheckSlots(std::span<const int32_t> slots) const;

  KvStore* store_;
  KvDisk* disk_;
  int block_tokens_;
  uint64_t row_bytes_;              // one token's K (or V) in one layer
  std::shared_ptr<uint8_t> block_;  // staging for a whole block
};

}  // namespace strata

#endif  // STRATA_MEMORY_NODE_KV_BLOCK_IO_H_
