#include "memory_node/kv_block_io.h"

#include <cstring>

#include "absl/strings/str_cat.h"
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

KvBlockIo::KvBlockIo(KvStore* store, KvDisk* disk, int block_tokens)
    : store_(store), disk_(disk), block_tokens_(block_tokens) {
  row_bytes_ = static_cast<uint64_t>(store->row_elements()) * 2;
  CHECK_EQ(disk->sections(), store->config().num_layers) << "one disk section per layer";
  CHECK_GE(disk->section_bytes(), 2 * block_tokens * row_bytes_) << "sections too small";
  block_ = disk->AllocateBlock();
  CHECK(block_ != nullptr) << "no memory for a block's staging";
}

absl::Status KvBlockIo::Save(uint64_t extent, uint64_t key, std::span<const int32_t> slots) {
  RETURN_IF_ERROR(CheckSlots(slots));
  const int layers = store_->config().num_layers;
  const uint64_t n = slots.size();
  for (int l = 0; l < layers; ++l) {
    uint8_t* section = block_.get() + static_cast<uint64_t>(l) * disk_->section_bytes();
    const auto* k = reinterpret_cast<const uint8_t*>(store_->k(l));
    const auto* v = reinterpret_cast<const uint8_t*>(store_->v(l));
    for (uint64_t t = 0; t < n; ++t) {
      std::memcpy(section + t * row_bytes_, k + slots[t] * row_bytes_, row_bytes_);
      std::memcpy(section + (n + t) * row_bytes_, v + slots[t] * row_bytes_, row_bytes_);
    }
    // No earlier block's KV in the tail: what is on disk is this block's alone.
    std::memset(section + 2 * n * row_bytes_, 0, disk_->section_bytes() - 2 * n * row_bytes_);
  }
  // Every section is written whole (its unused tail zeroed above); the
  // payload in use ends after the last layer's V rows.
  ExtentIo io{extent,
              block_.get(),
              static_cast<uint64_t>(layers - 1) * disk_->section_bytes() + 2 * n * row_bytes_,
              key,
              {}};
  return disk_->Write({&io, 1});
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
    ios.push_back(
        {extent, l, block_.get() + static_cast<uint64_t>(l) * disk_->section_bytes(), key, 0, {}});
  }
  const absl::Status status = disk_->ReadSections(ios);
  const uint64_t n = slots.size();
  std::vector<absl::Status> each;
  for (const SectionIo& io : ios) {
    absl::Status s = io.status;
    // A block saved with another number of tokens lays its rows out otherwise: whatever
    // layer is read, the block's size in its header must be this one's.
    const uint64_t want =
        static_cast<uint64_t>(store_->config().num_layers - 1) * disk_->section_bytes() +
        2 * n * row_bytes_;
    if (s.ok() && io.payload_bytes != want) {
      s = absl::DataLossError(absl::StrCat("block ", extent, " is not one of ", n, " tokens"));
    }
    if (s.ok()) {
      const auto* section = static_cast<const uint8_t*>(io.data);
      auto* k = reinterpret_cast<uint8_t*>(store_->k(io.section));
      auto* v = reinterpret_cast<uint8_t*>(store_->v(io.section));
      for (uint64_t t = 0; t < n; ++t) {
        std::memcpy(k + slots[t] * row_bytes_, section + t * row_bytes_, row_bytes_);
        std::memcpy(v + slots[t] * row_bytes_, section + (n + t) * row_bytes_, row_bytes_);
      }
    }
    each.push_back(std::move(s));
  }
  absl::Status first = status;
  for (const absl::Status& s : each) {
    if (first.ok() && !s.ok()) first = s;
  }
  if (layer_status != nullptr) *layer_status = std::move(each);
  return first;
}

}  // namespace strata
