#include "memory_node/kv_block_io.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"

namespace strata {

absl::Status KvBlockIo::CheckSlots(std::span<const int32_t> slots) const {
  if (slots.empty() || static_cast<int>(slots.size()) > block_tokens_) {
    return absl::InvalidArgumentError(
        absl::StrCat("a block holds 1 to ", block_tokens_, " tokens, not ", slots.size()));
  }
  for (int32_t s : slots) {
    if (s < 0 || s >= store_->num_slots()) {
      return absl::InvalidArgumentError(absl::StrCat("slot ", s, " of ", store_->num_slots()));
    }
  }
  return absl::OkStatus();
}

KvDiskOptions KvBlockIo::DiskOptions(const KvStoreConfig& store, int block_tokens) {
  KvDiskOptions o;
  const uint64_t row_bytes = static_cast<uint64_t>(store.num_kv_heads) * store.head_dim * 2;
  o.sections = store.num_layers;
  o.block_bytes = static_cast<uint64_t>(store.num_layers) * 2 * block_tokens * row_bytes;
  return o;
}

KvBlockIo::KvBlockIo(KvStore* store, KvDisk* disk, int block_tokens, int staging_blocks)
    : store_(store), disk_(disk), block_tokens_(block_tokens) {
  row_bytes_ = static_cast<uint64_t>(store->row_elements()) * 2;
  CHECK_EQ(disk->sections(), store->config().num_layers) << "one disk section per layer";
  CHECK_GE(disk->section_bytes(), 2 * block_tokens * row_bytes_) << "sections too small";
  for (int i = 0; i < std::max(1, staging_blocks); ++i) {
    staging_.push_back(disk->AllocateBlock());
    CHECK(staging_.back() != nullptr) << "no memory for the disk tier's staging";
  }
}

uint64_t KvBlockIo::PayloadBytes(uint64_t tokens) const {
  // Every section is written whole; the payload in use ends after the last layer's V rows.
  return static_cast<uint64_t>(store_->config().num_layers - 1) * disk_->section_bytes() +
         2 * tokens * row_bytes_;
}

uint64_t KvBlockIo::Gather(std::span<const int32_t> slots, uint8_t* buffer) {
  const int layers = store_->config().num_layers;
  const uint64_t n = slots.size();
  for (int l = 0; l < layers; ++l) {
    uint8_t* section = buffer + static_cast<uint64_t>(l) * disk_->section_bytes();
    const auto* k = reinterpret_cast<const uint8_t*>(store_->k(l));
    const auto* v = reinterpret_cast<const uint8_t*>(store_->v(l));
    for (uint64_t t = 0; t < n; ++t) {
      std::memcpy(section + t * row_bytes_, k + slots[t] * row_bytes_, row_bytes_);
      std::memcpy(section + (n + t) * row_bytes_, v + slots[t] * row_bytes_, row_bytes_);
    }
    // No earlier block's KV in the tail: what is on disk is this block's alone.
    std::memset(section + 2 * n * row_bytes_, 0, disk_->section_bytes() - 2 * n * row_bytes_);
  }
  return PayloadBytes(n);
}

absl::Status KvBlockIo::Scatter(uint64_t extent, int layer, uint64_t payload_bytes,
                                const uint8_t* section, std::span<const int32_t> slots) {
  const uint64_t n = slots.size();
  // A block saved with another number of tokens lays its rows out otherwise: whatever layer
  // is read, the block's size in its header must be this one's.
  if (payload_bytes != PayloadBytes(n)) {
    return absl::DataLossError(absl::StrCat("block ", extent, " is not one of ", n, " tokens"));
  }
  auto* k = reinterpret_cast<uint8_t*>(store_->k(layer));
  auto* v = reinterpret_cast<uint8_t*>(store_->v(layer));
  for (uint64_t t = 0; t < n; ++t) {
    std::memcpy(k + slots[t] * row_bytes_, section + t * row_bytes_, row_bytes_);
    std::memcpy(v + slots[t] * row_bytes_, section + (n + t) * row_bytes_, row_bytes_);
  }
  return absl::OkStatus();
}

absl::Status KvBlockIo::Save(uint64_t extent, uint64_t key, std::span<const int32_t> slots) {
  BlockIo block{extent, key, slots, {}};
  SaveBlocks({&block, 1});
  return block.status;
}

namespace {

absl::Status LateError() {
  return absl::DeadlineExceededError("the caller gave up on this block before it was moved");
}

}  // namespace

void KvBlockIo::SaveBlocks(std::span<BlockIo> blocks, absl::Time deadline) {
  for (size_t first = 0; first < blocks.size(); first += staging_.size()) {
    const size_t count = std::min(staging_.size(), blocks.size() - first);
    std::vector<ExtentIo> ios;
    std::vector<BlockIo*> owners;
    const bool late = absl::Now() > deadline;
    for (size_t i = 0; i < count; ++i) {
      BlockIo& b = blocks[first + i];
      b.status = late ? LateError() : CheckSlots(b.slots);
      if (!b.status.ok()) continue;
      uint8_t* buffer = staging_[ios.size()].get();
      ios.push_back({b.extent, buffer, Gather(b.slots, buffer), b.key, {}});
      owners.push_back(&b);
    }
    if (ios.empty()) continue;
    disk_->Write(ios).IgnoreError();  // each extent's own status is below
    for (size_t i = 0; i < ios.size(); ++i) owners[i]->status = ios[i].status;
  }
}

void KvBlockIo::LoadBlocks(std::span<BlockIo> blocks, absl::Time deadline) {
  const int layers = store_->config().num_layers;
  for (size_t first = 0; first < blocks.size(); first += staging_.size()) {
    const size_t count = std::min(staging_.size(), blocks.size() - first);
    // Whole extents, one read each (header and payload, checked together).
    std::vector<ExtentIo> ios;
    std::vector<BlockIo*> owners;
    const bool late = absl::Now() > deadline;
    for (size_t i = 0; i < count; ++i) {
      BlockIo& b = blocks[first + i];
      b.status = late ? LateError() : CheckSlots(b.slots);
      if (!b.status.ok()) continue;
      ios.push_back({b.extent, staging_[ios.size()].get(), 0, b.key, {}});
      owners.push_back(&b);
    }
    if (ios.empty()) continue;
    disk_->Read(ios).IgnoreError();  // each extent's own status is below
    // The slots are written only if the caller still waits for them.
    const bool read_late = absl::Now() > deadline;
    for (size_t i = 0; i < ios.size(); ++i) {
      BlockIo& b = *owners[i];
      b.status = read_late && ios[i].status.ok() ? LateError() : ios[i].status;
      for (int l = 0; l < layers && b.status.ok(); ++l) {
        b.status = Scatter(ios[i].extent, l, ios[i].bytes,
                           static_cast<const uint8_t*>(ios[i].data) +
                               static_cast<uint64_t>(l) * disk_->section_bytes(),
                           b.slots);
      }
    }
  }
}

void KvBlockIo::LoadBlocksByLayer(
    std::span<BlockIo> blocks, absl::Time deadline, int layers_per_read,
    const std::function<void(size_t first, size_t count, int layers)>& on_layer) {
  const int layers = store_->config().num_layers;
  const int group = std::clamp(layers_per_read, 1, layers);
  for (size_t first = 0; first < blocks.size(); first += staging_.size()) {
    const size_t count = std::min(staging_.size(), blocks.size() - first);
    for (size_t i = 0; i < count; ++i) {
      BlockIo& b = blocks[first + i];
      b.status = absl::Now() > deadline ? LateError() : CheckSlots(b.slots);
    }
    for (int l0 = 0; l0 < layers; l0 += group) {
      const int l1 = std::min(layers, l0 + group);
      // Layers [l0, l1) of every block still going: one call, all reads in flight together.
      std::vector<SectionIo> ios;
      std::vector<BlockIo*> owners;
      for (size_t i = 0; i < count; ++i) {
        BlockIo& b = blocks[first + i];
        if (!b.status.ok()) continue;
        for (int l = l0; l < l1; ++l) {
          ios.push_back({b.extent,
                         l,
                         staging_[i].get() + static_cast<uint64_t>(l) * disk_->section_bytes(),
                         b.key,
                         0,
                         0,
                         {}});
          owners.push_back(&b);
        }
      }
      if (ios.empty()) break;
      disk_->ReadSections(ios).IgnoreError();  // each section's own status is below
      // Scattered layer by layer, each published as soon as every block has it. The slots
      // are written only if the caller still waits for them.
      for (int l = l0; l < l1; ++l) {
        const bool late = absl::Now() > deadline;
        for (size_t i = 0; i < ios.size(); ++i) {
          if (ios[i].section != l) continue;
          BlockIo& b = *owners[i];
          if (!b.status.ok()) continue;
          if (!ios[i].status.ok()) {
            b.status = ios[i].status;
          } else if (late) {
            b.status = LateError();
          } else {
            b.status = Scatter(ios[i].extent, l, ios[i].payload_bytes,
                               static_cast<const uint8_t*>(ios[i].data), b.slots);
          }
        }
        on_layer(first, count, l + 1);
      }
    }
  }
}

absl::Status KvBlockIo::LoadLayers(uint64_t extent, uint64_t key, std::span<const int> layers,
                                   std::span<const int32_t> slots,
                                   std::vector<absl::Status>* layer_status) {
  RETURN_IF_ERROR(CheckSlots(slots));
  std::vector<SectionIo> ios;
  for (int l : layers) {
    if (l < 0 || l >= store_->config().num_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", l, " of ", store_->config().num_layers));
    }
    ios.push_back({extent,
                   l,
                   staging_[0].get() + static_cast<uint64_t>(l) * disk_->section_bytes(),
                   key,
                   0,
                   0,
                   {}});
  }
  const absl::Status status = disk_->ReadSections(ios);
  std::vector<absl::Status> each;
  for (const SectionIo& io : ios) {
    each.push_back(io.status.ok() ? Scatter(io.extent, io.section, io.payload_bytes,
                                            static_cast<const uint8_t*>(io.data), slots)
                                  : io.status);
  }
  absl::Status first = status;
  for (const absl::Status& s : each) {
    if (first.ok() && !s.ok()) first = s;
  }
  if (layer_status != nullptr) *layer_status = std::move(each);
  return first;
}

}  // namespace strata
