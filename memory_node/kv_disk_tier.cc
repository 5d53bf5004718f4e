#include "memory_node/kv_disk_tier.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/base/stopwatch.h"

namespace strata {

absl::StatusOr<std::unique_ptr<KvDiskTier>> KvDiskTier::Open(const KvDiskTierOptions& options,
                                                             KvStore* store, int block_tokens,
                                                             const std::string& fingerprint) {
  if (block_tokens < 1 || block_tokens > 4096) {
    return absl::InvalidArgumentError(absl::StrCat("a disk block of ", block_tokens, " tokens"));
  }
  KvDiskOptions disk = KvBlockIo::DiskOptions(store->config(), block_tokens);
  disk.dir = options.dir;
  disk.fingerprint = absl::StrCat(fingerprint, "\nblock ", block_tokens, " tokens");
  disk.budget_bytes = options.budget_bytes;
  disk.queue_depth = options.queue_depth;
  disk.allow_buffered = options.allow_buffered;
  disk.start_empty = true;
  auto tier = std::unique_ptr<KvDiskTier>(new KvDiskTier);
  ASSIGN_OR_RETURN(tier->disk_, KvDisk::Open(disk));
  const uint64_t block_bytes = tier->disk_->block_bytes();
  const int staging = static_cast<int>(
      std::clamp<uint64_t>(options.staging_bytes / std::max<uint64_t>(block_bytes, 1), 1, 1024));
  tier->io_ = std::make_unique<KvBlockIo>(store, tier->disk_.get(), block_tokens, staging);
  tier->used_.assign(tier->disk_->num_extents(), false);
  tier->gate_ = options.gate;
  tier->stats_.extents = tier->disk_->num_extents();
  tier->stats_.block_bytes = block_bytes;
  tier->stats_.staging_bytes = tier->io_->staging_bytes();
  return tier;
}

std::vector<absl::Status> KvDiskTier::Execute(std::span<const KvMove> moves, absl::Time deadline) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<absl::Status> out(moves.size());
  // Runs of one kind keep their order and batch together.
  for (size_t first = 0; first < moves.size();) {
    size_t end = first + 1;
    while (end < moves.size() && moves[end].kind == moves[first].kind) ++end;
    Run(moves[first].kind, moves.subspan(first, end - first),
        std::span<absl::Status>(out).subspan(first, end - first), deadline);
    first = end;
  }
  return out;
}

void KvDiskTier::Run(KvMove::Kind kind, std::span<const KvMove> moves, std::span<absl::Status> out,
                     absl::Time deadline) {
  const Stopwatch watch;
  const KvDiskStats before = disk_->stats();
  uint64_t failed = 0;
  if (kind == KvMove::Kind::kDrop) {
    std::vector<uint64_t> extents;
    for (size_t i = 0; i < moves.size(); ++i) {
      if (moves[i].extent >= used_.size()) {
        out[i] = absl::InvalidArgumentError(
            absl::StrCat("extent ", moves[i].extent, " of ", used_.size()));
        continue;
      }
      extents.push_back(moves[i].extent);
    }
    const absl::Status dropped = disk_->Drop(extents);
    for (size_t i = 0; i < moves.size(); ++i) {
      if (!out[i].ok()) continue;
      out[i] = dropped;
      if (dropped.ok()) Mark(moves[i].extent, false);
    }
  } else {
    std::vector<BlockIo> blocks;
    std::vector<size_t> index;
    for (size_t i = 0; i < moves.size(); ++i) {
      if (moves[i].extent >= used_.size()) {
        out[i] = absl::InvalidArgumentError(
            absl::StrCat("extent ", moves[i].extent, " of ", used_.size()));
        // A step waiting for this ticket waits no longer.
        if (gate_ != nullptr && kind == KvMove::Kind::kLoad) gate_->Finish(moves[i].ticket, false);
        continue;
      }
      blocks.push_back({moves[i].extent, moves[i].key, moves[i].slots, {}});
      index.push_back(i);
    }
    if (kind == KvMove::Kind::kSave) {
      io_->SaveBlocks(blocks, deadline);
    } else {
      // Loads a step waits for (layer-wise pre-loading) first, layer by layer; then the
      // rest, whole.
      std::vector<BlockIo> by_layer, whole;
      std::vector<uint64_t> tickets;
      std::vector<size_t> by_layer_index, whole_index;
      for (size_t b = 0; b < blocks.size(); ++b) {
        const uint64_t ticket = gate_ != nullptr ? moves[index[b]].ticket : 0;
        if (ticket != 0) {
          by_layer.push_back(blocks[b]);
          tickets.push_back(ticket);
          by_layer_index.push_back(b);
        } else {
          whole.push_back(blocks[b]);
          whole_index.push_back(b);
        }
      }
      if (!by_layer.empty()) LoadByLayer(by_layer, tickets, deadline);
      if (!whole.empty()) io_->LoadBlocks(whole, deadline);
      for (size_t i = 0; i < by_layer.size(); ++i) blocks[by_layer_index[i]] = by_layer[i];
      for (size_t i = 0; i < whole.size(); ++i) blocks[whole_index[i]] = whole[i];
    }
    for (size_t b = 0; b < blocks.size(); ++b) {
      out[index[b]] = blocks[b].status;
      if (kind == KvMove::Kind::kSave) Mark(blocks[b].extent, blocks[b].status.ok());
    }
  }
  for (const absl::Status& s : out) failed += s.ok() ? 0 : 1;
  const KvDiskStats after = disk_->stats();
  std::lock_guard<std::mutex> lock(stats_mu_);
  switch (kind) {
    case KvMove::Kind::kSave:
      stats_.saves += moves.size();
      stats_.failed_saves += failed;
      break;
    case KvMove::Kind::kLoad:
      stats_.loads += moves.size();
      stats_.failed_loads += failed;
      break;
    case KvMove::Kind::kDrop:
      stats_.drops += moves.size();
      break;
  }
  stats_.used_extents = used_count_;
  stats_.bytes_written += after.bytes_written - before.bytes_written;
  stats_.bytes_read += after.bytes_read - before.bytes_read;
  stats_.checksum_failures += after.checksum_failures - before.checksum_failures;
  if (kind == KvMove::Kind::kSave) stats_.save_seconds += watch.ElapsedSeconds();
  if (kind == KvMove::Kind::kLoad) stats_.load_seconds += watch.ElapsedSeconds();
  if (failed > 0) {
    for (size_t i = 0; i < moves.size(); ++i) {
      if (!out[i].ok()) {
        LOG(WARNING) << failed << " of " << moves.size() << " disk-tier "
                     << (kind == KvMove::Kind::kSave   ? "saves"
                         : kind == KvMove::Kind::kLoad ? "loads"
                                                       : "drops")
                     << " failed; the first: " << out[i];
        break;
      }
    }
  }
}

void KvDiskTier::LoadByLayer(std::span<BlockIo> blocks, std::span<const uint64_t> tickets,
                             absl::Time deadline) {
  // A ticket's progress is the least of its blocks': layers each has in DRAM.
  std::map<uint64_t, std::vector<size_t>> of_ticket;
  for (size_t b = 0; b < blocks.size(); ++b) of_ticket[tickets[b]].push_back(b);
  std::vector<int> layers_in(blocks.size(), 0);
  // A quarter of the layers per read of a block rather than one: a quarter as many round
  // trips to the disk, and the first quarter ready after the first.
  const int layers_per_read = (io_->num_layers() + 3) / 4;
  io_->LoadBlocksByLayer(blocks, deadline, layers_per_read,
                         [&](size_t first, size_t count, int layers) {
                           std::set<uint64_t> touched;
                           for (size_t b = first; b < first + count; ++b) {
                             if (blocks[b].status.ok()) layers_in[b] = layers;
                             touched.insert(tickets[b]);
                           }
                           for (uint64_t ticket : touched) {
                             int ready = layers;
                             for (size_t b : of_ticket[ticket])
                               ready = std::min(ready, layers_in[b]);
                             gate_->Advance(ticket, ready);
                           }
                         });
  for (const auto& [ticket, members] : of_ticket) {
    bool ok = true;
    for (size_t b : members) ok = ok && blocks[b].status.ok();
    if (gate_->Finish(ticket, ok) || !ok) continue;
    // A step stopped waiting for it and attended over what was there: it must not count.
    for (size_t b : members) {
      blocks[b].status = absl::DeadlineExceededError(
          "the step waiting for this block gave up before it was loaded");
    }
  }
}

void KvDiskTier::Mark(uint64_t extent, bool used) {
  if (used_[extent] != used) used_count_ += used ? 1 : -1;
  used_[extent] = used;
}

KvDiskTierStats KvDiskTier::stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return stats_;
}

}  // namespace strata
