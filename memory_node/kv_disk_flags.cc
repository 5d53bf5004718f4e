#include "memory_node/kv_disk_flags.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "memory_node/kv_disk.h"

ABSL_FLAG(std::string, kv_disk_dir, "",
          "The disk tier: a directory for KV blocks kept across turns (empty: no disk tier). "
          "Created 0700; it holds user data (see the README)");
ABSL_FLAG(double, kv_disk_budget_gib, 16, "The disk tier's budget, GiB");
ABSL_FLAG(int64_t, kv_disk_staging_mib, 64,
          "DRAM for disk-tier blocks in flight (beside the KV budget), MiB");
ABSL_FLAG(int, kv_disk_queue_depth, 8, "Disk-tier I/O requests in flight");
ABSL_FLAG(bool, kv_disk_allow_buffered, false,
          "Allow a disk-tier filesystem without O_DIRECT (buffered I/O through the page cache)");

namespace strata {

absl::StatusOr<KvDiskTierOptions> KvDiskOptionsFromFlags() {
  KvDiskTierOptions options;
  options.dir = absl::GetFlag(FLAGS_kv_disk_dir);
  options.budget_bytes =
      static_cast<uint64_t>(std::max(0.0, absl::GetFlag(FLAGS_kv_disk_budget_gib)) * (1ull << 30));
  options.staging_bytes =
      static_cast<uint64_t>(std::max<int64_t>(1, absl::GetFlag(FLAGS_kv_disk_staging_mib))) << 20;
  options.queue_depth = absl::GetFlag(FLAGS_kv_disk_queue_depth);
  options.allow_buffered = absl::GetFlag(FLAGS_kv_disk_allow_buffered);
  if (options.dir.empty()) return options;
  if (absl::Status usable = CheckKvDiskDir(options.dir, options.allow_buffered); !usable.ok()) {
    return absl::Status(usable.code(), absl::StrCat("--kv_disk_dir: ", usable.message()));
  }
  return options;
}

}  // namespace strata
