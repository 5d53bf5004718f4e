// The cold tier's storage under a memory node: KV blocks in fixed-size extents of one file,
// read and written with io_uring and O_DIRECT (docs/architecture.md, "The disk tier").
//
// The scheduler allocates extents, as it allocates DRAM slots: this class only executes
// what it is told, and says what failed. An extent is a 4096-byte header (magic, layout
// version, extent index, the block's key, payload size, when it was written, a hash of the
// fingerprint, a 64-bit checksum of the payload) and the payload, both aligned for
// O_DIRECT. Every read verifies the header, the key asked for and the checksum: a block
// that fails is reported (DataLoss) and never returned as good. After a restart, Scan
// lists the extents whose headers are whole, for the node to report to the scheduler;
// Drop punches extents out of the file (their space is freed; they read as never written).
//
// The directory:
//   - is created 0700, its files 0600 (persisted KV is user data);
//   - holds a lock file: a second node opening the same directory is refused while the
//     first holds it (flock, released when the process dies);
//   - holds a FINGERPRINT file (model, KV dtype, layout version): a directory written for
//     another fingerprint is discarded at open, with a log line.
// A filesystem without O_DIRECT (tmpfs on some kernels) is a clear error at open unless
// `allow_buffered`. A full disk is ResourceExhausted; an I/O error is its errno's status.
//
// Thread-safety: one thread at a time (the memory node's disk worker).
#ifndef STRATA_MEMORY_NODE_KV_DISK_H_
#define STRATA_MEMORY_NODE_KV_DISK_H_

#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

struct io_uring;

namespace strata {

struct KvDiskOptions {
  std::string dir;
  std::string fingerprint;  // model, KV dtype, layout version
  uint64_t budget_bytes = 0;
  uint64_t block_bytes = 0;  // payload of one extent (rounded up, see `sections`)
  // Equal sections of the payload, each 4096-aligned and checked on its own, so that one can
  // be read alone (a block's layers, for layer-wise pre-loading). At most kMaxSections.
  int sections = 1;
  int queue_depth = 8;  // requests in flight
  bool allow_buffered = false;
  // Discard what the directory holds, whatever its fingerprint (the scheduler's index of
  // it is gone: a memory node configured anew starts its disk empty).
  bool start_empty = false;
};

struct KvDiskStats {
  uint64_t bytes_written = 0;
  uint64_t bytes_read = 0;
  uint64_t checksum_failures = 0;
  uint64_t write_errors = 0;
};

// One extent's I/O: `data` (4096-aligned, block_bytes long) is written to, or read from,
// extent `extent`.
struct ExtentIo {
  uint64_t extent = 0;
  void* data = nullptr;
  uint64_t bytes = 0;   // payload bytes used (<= block_bytes); reads fill it in
  uint64_t key = 0;     // the block's key (e.g. its prefix hash): written, checked on read
  absl::Status status;  // per extent, after the call
};

// One section of one extent read alone: `data` is 4096-aligned and section_bytes long.
struct SectionIo {
  uint64_t extent = 0;
  int section = 0;
  void* data = nullptr;
  uint64_t key = 0;            // checked against the extent's
  uint64_t bytes = 0;          // of the section in use; filled in
  uint64_t payload_bytes = 0;  // of the whole block in use (its header's); filled in
  absl::Status status;         // per section, after the call
};

// An extent Scan found whole (its payload is checked when it is read).
struct ExtentInfo {
  uint64_t extent = 0;
  uint64_t key = 0;
  uint64_t bytes = 0;
  int64_t written_unix_s = 0;
};

// Whether `dir` can hold a disk tier: it is created (0700) if need be and must be writable,
// on a filesystem with O_DIRECT unless `allow_buffered`. A node checks at start, so that a
// bad directory is a clear error then rather than a missing tier later.
absl::Status CheckKvDiskDir(const std::string& dir, bool allow_buffered);

class KvDisk {
 public:
  static constexpr uint64_t kAlign = 4096;
  static constexpr uint32_t kLayoutVersion = 2;
  static constexpr int kMaxSections = 496;

  static absl::StatusOr<std::unique_ptr<KvDisk>> Open(const KvDiskOptions& options);
  ~KvDisk();
  KvDisk(const KvDisk&) = delete;
  KvDisk& operator=(const KvDisk&) = delete;

  uint64_t num_extents() const { return num_extents_; }
  uint64_t block_bytes() const { return block_bytes_; }
  uint64_t section_bytes() const { return section_bytes_; }
  int sections() const { return sections_; }
  bool direct() const { return direct_; }
  // Whether the directory held blocks of another fingerprint (or none) and was started empty.
  bool discarded() const { return discarded_; }
  const KvDiskStats& stats() const { return stats_; }

  // Writes every extent, up to queue_depth at once; each gets its own status. The call
  // returns the first error (OK when all were written).
  absl::Status Write(std::span<ExtentIo> ios);
  // Reads every extent; one that was never written, or fails its header or checksum, gets
  // NotFound or DataLoss and its data must not be used.
  absl::Status Read(std::span<ExtentIo> ios);
  // Reads single sections (each extent's header once per call, then its sections), verifying
  // header, key and each section's checksum.
  absl::Status ReadSections(std::span<SectionIo> ios);
  // The extents whose headers are whole (this fingerprint and layout), in extent order.
  absl::StatusOr<std::vector<ExtentInfo>> Scan();
  // Frees the extents' space; they then read as never written.
  absl::Status Drop(std::span<const uint64_t> extents);
  // A buffer suitable for ExtentIo::data (aligned, block_bytes long).
  std::shared_ptr<uint8_t> AllocateBlock() const;

 private:
  KvDisk() = default;
  // One vectored read or write; `res` is its result (bytes, or -errno).
  struct Op {
    bool write = false;
    off_t offset = 0;
    int iovcnt = 1;
    iovec iov[2];
    int res = 0;
  };
  absl::Status Run(std::span<ExtentIo> ios, bool write);
  // Whether a header's section checksums are its own (its `checksum`).
  bool HeaderSound(const uint8_t* header) const;
  // Runs `ops`, queue_depth at a time, and reaps every completion of what it submitted
  // before returning (interrupted waits are retried). An error here leaves the ring unusable
  // (`broken_`), and every later call fails.
  absl::Status Execute(std::vector<Op>& ops);

  std::string dir_;
  int lock_fd_ = -1;
  int fd_ = -1;
  bool direct_ = false;
  bool discarded_ = false;
  uint64_t block_bytes_ = 0;
  uint64_t section_bytes_ = 0;
  int sections_ = 1;
  uint64_t extent_bytes_ = 0;  // header + block
  uint64_t num_extents_ = 0;
  uint64_t fingerprint_ = 0;  // hash of the fingerprint, in every extent's header
  std::unique_ptr<io_uring> ring_;
  int queue_depth_ = 8;
  bool broken_ = false;
  KvDiskStats stats_;
};

}  // namespace strata

#endif  // STRATA_MEMORY_NODE_KV_DISK_H_
