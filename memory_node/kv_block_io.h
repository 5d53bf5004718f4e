// Moves blocks of KV between a memory node's DRAM store and the disk tier's block file
// (memory_node/kv_disk_tier.h drives it).
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
// SaveBlocks and LoadBlocks do the same for many blocks, as many at once as the staging
// buffers hold (each block's I/O in flight together, up to the disk's queue depth); loads
// go layer by layer across the blocks of a batch.
//
// Thread-safety: one thread at a time (the memory node's disk worker); the slots written
// must not be read by attention until LoadLayers returns.
#ifndef STRATA_MEMORY_NODE_KV_BLOCK_IO_H_
#define STRATA_MEMORY_NODE_KV_BLOCK_IO_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "memory_node/kv_disk.h"
#include "memory_node/kv_store.h"

namespace strata {

// One block of a batch: its extent, key and slots; `status` is set by the call.
struct BlockIo {
  uint64_t extent = 0;
  uint64_t key = 0;
  std::span<const int32_t> slots;
  absl::Status status;
};

class KvBlockIo {
 public:
  // `disk` must have been opened with KvBlockOptions(store config, block_tokens) and both
  // must outlive this object. `staging_blocks` (at least 1) block buffers are allocated.
  KvBlockIo(KvStore* store, KvDisk* disk, int block_tokens, int staging_blocks = 1);

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

  // Saves, or loads whole, every block; each gets its own status (a load that fails any
  // layer fails, and its slots must not be used).
  // Past `deadline` (the caller's, who then treats the blocks as failed and may reuse
  // their slots and extents), the blocks not yet begun are DeadlineExceeded: a save gathers
  // no slots after it, and a load scatters none.
  void SaveBlocks(std::span<BlockIo> blocks, absl::Time deadline = absl::InfiniteFuture());
  void LoadBlocks(std::span<BlockIo> blocks, absl::Time deadline = absl::InfiniteFuture());
  // Layer-wise pre-loading: loads every block layer by layer. Each batch of blocks (as many
  // as the staging buffers hold) reads `layers_per_read` layers of all of them at once (one
  // read per block and layer, each checked alone; the block's header once per call), then
  // scatters them a layer at a time, and so on; `on_layer(first, count, layers)` runs once
  // layers [0, layers) of blocks [first, first + count) are in the store (a block whose
  // status is not OK by then has stopped). Statuses and the deadline are as LoadBlocks's:
  // past it, no more layers are scattered.
  void LoadBlocksByLayer(
      std::span<BlockIo> blocks, absl::Time deadline, int layers_per_read,
      const std::function<void(size_t first, size_t count, int layers)>& on_layer);

  int staging_blocks() const { return static_cast<int>(staging_.size()); }
  int num_layers() const { return store_->config().num_layers; }
  uint64_t staging_bytes() const { return staging_.size() * disk_->block_bytes(); }

 private:
  // Gathers `slots` into `buffer`; the payload bytes in use.
  uint64_t Gather(std::span<const int32_t> slots, uint8_t* buffer);
  // Scatters one layer's section of extent `extent` into the slots, if the block's size (its
  // header's `payload_bytes`) is that of `slots`.
  absl::Status Scatter(uint64_t extent, int layer, uint64_t payload_bytes, const uint8_t* section,
                       std::span<const int32_t> slots);
  uint64_t PayloadBytes(uint64_t tokens) const;

  // A block's slots: 1 to block_tokens of them, all in the store.
  absl::Status CheckSlots(std::span<const int32_t> slots) const;

  KvStore* store_;
  KvDisk* disk_;
  int block_tokens_;
  uint64_t row_bytes_;                             // one token's K (or V) in one layer
  std::vector<std::shared_ptr<uint8_t>> staging_;  // one whole block each
};

}  // namespace strata

#endif  // STRATA_MEMORY_NODE_KV_BLOCK_IO_H_
