#include "memory_node/kv_disk.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/base/file.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/transport/frame.h"

namespace strata {
namespace {

constexpr uint64_t kMagic = 0x4B564449534B3031ull;  // "KVDISK01"

// The start of an extent's 4096-byte header.
struct ExtentHeader {
  uint64_t magic = kMagic;
  uint32_t version = KvDisk::kLayoutVersion;
  uint32_t reserved = 0;
  uint64_t extent = 0;
  uint64_t bytes = 0;  // payload bytes
  uint64_t fingerprint = 0;
  uint64_t checksum = 0;  // of the payload's `bytes` bytes
  uint64_t key = 0;
  int64_t written_unix_s = 0;
  uint32_t sections = 1;
  uint32_t reserved2 = 0;
};
// The sections' checksums follow the header at this offset, one uint64_t each; `checksum`
// is the checksum of that array (so the header checks itself).
constexpr size_t kSectionSums = 128;
static_assert(sizeof(ExtentHeader) <= kSectionSums);
static_assert(kSectionSums + 8 * KvDisk::kMaxSections <= KvDisk::kAlign);

// Bytes of section `s` in use when the payload uses `bytes`.
uint64_t SectionUsed(uint64_t bytes, uint64_t section_bytes, int s) {
  const uint64_t start = static_cast<uint64_t>(s) * section_bytes;
  return bytes <= start ? 0 : std::min(section_bytes, bytes - start);
}

// Fills the header's section checksums and its own checksum from `data`.
void SumSections(uint8_t* header, const uint8_t* data, uint64_t bytes, uint64_t section_bytes,
                 int sections) {
  auto* sums = reinterpret_cast<uint64_t*>(header + kSectionSums);
  for (int s = 0; s < sections; ++s) {
    sums[s] = transport::PayloadChecksum(std::span<const uint8_t>(
        data + static_cast<uint64_t>(s) * section_bytes, SectionUsed(bytes, section_bytes, s)));
  }
  ExtentHeader h;
  std::memcpy(&h, header, sizeof(h));
  h.checksum = transport::PayloadChecksum(
      std::span<const uint8_t>(header + kSectionSums, 8 * static_cast<size_t>(sections)));
  std::memcpy(header, &h, sizeof(h));
}

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::shared_ptr<uint8_t> Aligned(uint64_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, KvDisk::kAlign, bytes) != 0) return nullptr;
  std::memset(p, 0, bytes);
  return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p), [](uint8_t* q) { free(q); });
}

// Gives `status` to every io still waiting for its outcome (not refused, not done), and
// returns it: no io may look done after a call that gave up early.
template <typename Io>
absl::Status FailUnfinished(std::span<Io> ios, absl::Status status) {
  for (Io& io : ios) {
    if (absl::IsAborted(io.status)) io.status = status;
  }
  return status;
}

}  // namespace

absl::Status CheckKvDiskDir(const std::string& dir, bool allow_buffered) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  if (chmod(dir.c_str(), 0700) != 0) return ErrnoToStatus(errno, "chmod " + dir);
  const std::string probe = dir + "/.probe";
  int fd = open(probe.c_str(), O_CREAT | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0 && errno == EINVAL) {
    if (!allow_buffered) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the filesystem of ", dir,
          " does not support O_DIRECT; put the KV disk tier on one that does (ext4, xfs), or "
          "allow buffered I/O"));
    }
    fd = open(probe.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  }
  if (fd < 0) return ErrnoToStatus(errno, "open " + probe);
  close(fd);
  unlink(probe.c_str());
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<KvDisk>> KvDisk::Open(const KvDiskOptions& options) {
  namespace fs = std::filesystem;
  if (options.dir.empty()) return absl::InvalidArgumentError("no KV disk directory");
  if (options.block_bytes == 0 || options.block_bytes > (uint64_t{1} << 30) ||
      options.queue_depth < 1 || options.queue_depth > 4096 || options.sections < 1 ||
      options.sections > kMaxSections || options.budget_bytes > (uint64_t{1} << 52)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a KV disk needs a block size up to 1 GiB, a queue depth up to 4096, 1 to ",
                     kMaxSections, " sections and a budget up to 4 PiB"));
  }
  auto disk = std::unique_ptr<KvDisk>(new KvDisk);
  disk->dir_ = options.dir;
  disk->fingerprint_ = Fnv1a(options.fingerprint);
  disk->queue_depth_ = options.queue_depth;
  disk->sections_ = options.sections;
  const uint64_t per_section = (options.block_bytes + options.sections - 1) / options.sections;
  disk->section_bytes_ = (per_section + kAlign - 1) / kAlign * kAlign;
  disk->block_bytes_ = disk->section_bytes_ * static_cast<uint64_t>(options.sections);
  disk->extent_bytes_ = kAlign + disk->block_bytes_;
  disk->num_extents_ = options.budget_bytes / disk->extent_bytes_;
  if (disk->num_extents_ == 0) {
    return absl::InvalidArgumentError(absl::StrCat("a KV disk budget of ", options.budget_bytes,
                                                   " bytes holds no block of ", disk->block_bytes_,
                                                   " bytes"));
  }
  std::error_code ec;
  fs::create_directories(options.dir, ec);
  if (ec)
    return absl::InternalError(absl::StrCat("cannot create ", options.dir, ": ", ec.message()));
  if (chmod(options.dir.c_str(), 0700) != 0) return ErrnoToStatus(errno, "chmod " + options.dir);

  // One node per directory.
  const std::string lock_path = options.dir + "/LOCK";
  disk->lock_fd_ = open(lock_path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  if (disk->lock_fd_ < 0) return ErrnoToStatus(errno, "open " + lock_path);
  if (flock(disk->lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return absl::FailedPreconditionError(
          absl::StrCat("another memory node uses the KV disk directory ", options.dir));
    }
    return ErrnoToStatus(errno, "lock " + lock_path);
  }

  // Blocks of another model, dtype or layout are of no use: start empty.
  const std::string want = absl::StrCat(options.fingerprint, "\nlayout ", kLayoutVersion, "\n");
  const std::string fingerprint_path = options.dir + "/FINGERPRINT";
  const std::string blocks_path = options.dir + "/blocks";
  std::string have;  // empty: no fingerprint yet
  absl::StatusOr<std::string> fingerprint = ReadFileToString(fingerprint_path);
  if (fingerprint.ok()) {
    have = *std::move(fingerprint);
  } else if (!absl::IsNotFound(fingerprint.status())) {
    // Unreadable is not absent: the blocks behind it are left alone.
    return fingerprint.status();
  }
  if (have != want || options.start_empty) {
    if (fs::exists(blocks_path)) {
      LOG(WARNING) << "discarding the KV disk directory " << options.dir
                   << (have != want && have.empty() ? " (no fingerprint)"
                       : have != want               ? " (written for another model or layout)"
                                      : " (the scheduler's index of it starts empty)");
      fs::remove(blocks_path, ec);
    }
    disk->discarded_ = true;
    const int fd = open(fingerprint_path.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return ErrnoToStatus(errno, "open " + fingerprint_path);
    const ssize_t n = write(fd, want.data(), want.size());
    const int error = errno;
    close(fd);
    if (n != static_cast<ssize_t>(want.size()))
      return ErrnoToStatus(error, "write " + fingerprint_path);
  }

  disk->fd_ = open(blocks_path.c_str(), O_CREAT | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
  disk->direct_ = disk->fd_ >= 0;
  if (disk->fd_ < 0 && errno == EINVAL) {
    if (!options.allow_buffered) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the filesystem of ", options.dir,
          " does not support O_DIRECT; put the KV disk tier on one that does (ext4, xfs), or "
          "allow buffered I/O"));
    }
    LOG(WARNING) << "the filesystem of " << options.dir << " has no O_DIRECT: buffered I/O";
    disk->fd_ = open(blocks_path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  }
  if (disk->fd_ < 0) return ErrnoToStatus(errno, "open " + blocks_path);
  if (fchmod(disk->fd_, 0600) != 0) return ErrnoToStatus(errno, "chmod " + blocks_path);
  // Sparse: space is taken as blocks are written, so a full disk shows at write time.
  if (ftruncate(disk->fd_, static_cast<off_t>(disk->num_extents_ * disk->extent_bytes_)) != 0) {
    return ErrnoToStatus(errno, "size " + blocks_path);
  }
  disk->ring_ = std::make_unique<io_uring>();
  if (const int rc = io_uring_queue_init(options.queue_depth, disk->ring_.get(), 0); rc < 0) {
    disk->ring_.reset();
    return ErrnoToStatus(-rc, "io_uring");
  }
  LOG(INFO) << "KV disk tier at " << options.dir << ": " << disk->num_extents_ << " blocks of "
            << disk->block_bytes_ << " bytes, " << (disk->direct_ ? "O_DIRECT" : "buffered") << ", "
            << options.queue_depth << " requests in flight"
            << (disk->discarded_ ? " (started empty)" : "");
  return disk;
}

KvDisk::~KvDisk() {
  if (ring_) io_uring_queue_exit(ring_.get());
  if (fd_ >= 0) close(fd_);
  if (lock_fd_ >= 0) close(lock_fd_);  // releases the lock
}

std::shared_ptr<uint8_t> KvDisk::AllocateBlock() const { return Aligned(block_bytes_); }

bool KvDisk::HeaderSound(const uint8_t* header) const {
  ExtentHeader h;
  std::memcpy(&h, header, sizeof(h));
  return h.sections == static_cast<uint32_t>(sections_) &&
         transport::PayloadChecksum(std::span<const uint8_t>(
             header + kSectionSums, 8 * static_cast<size_t>(sections_))) == h.checksum;
}

absl::Status KvDisk::ReadSections(std::span<SectionIo> ios) {
  // Each extent's header once: verified, then its sections.
  std::map<uint64_t, std::shared_ptr<uint8_t>> headers;
  std::map<uint64_t, absl::Status> header_status;
  for (SectionIo& io : ios) io.status = absl::AbortedError("not read");
  for (SectionIo& io : ios) {
    if (io.extent >= num_extents_ || io.section < 0 || io.section >= sections_ ||
        io.data == nullptr || reinterpret_cast<uintptr_t>(io.data) % kAlign != 0) {
      io.status = absl::InvalidArgumentError(
          absl::StrCat("section ", io.section, " of ", sections_, " of extent ", io.extent, " of ",
                       num_extents_, io.data == nullptr ? ", no buffer" : ""));
      continue;
    }
    if (!headers.count(io.extent)) {
      headers[io.extent] = Aligned(kAlign);
      if (headers[io.extent] == nullptr) {
        return FailUnfinished(ios, absl::ResourceExhaustedError("no memory for I/O"));
      }
    }
  }
  // Reads (offset, length, buffer), queue_depth at a time; each one's result.
  auto read_all = [&](const std::vector<std::tuple<off_t, uint64_t, void*>>& reads)
      -> absl::StatusOr<std::vector<int>> {
    std::vector<Op> ops(reads.size());
    for (size_t i = 0; i < reads.size(); ++i) {
      const auto& [offset, length, buffer] = reads[i];
      ops[i].offset = offset;
      ops[i].iov[0] = {buffer, length};
    }
    RETURN_IF_ERROR(Execute(ops));
    std::vector<int> results;
    for (const Op& op : ops) results.push_back(op.res);
    return results;
  };
  std::vector<std::tuple<off_t, uint64_t, void*>> reads;
  std::vector<uint64_t> order;
  for (auto& [extent, buffer] : headers) {
    reads.emplace_back(static_cast<off_t>(extent * extent_bytes_), kAlign, buffer.get());
    order.push_back(extent);
  }
  ASSIGN_OR_RETURN(std::vector<int> got, read_all(reads));
  for (size_t i = 0; i < order.size(); ++i) {
    const uint64_t extent = order[i];
    ExtentHeader h;
    std::memcpy(&h, headers[extent].get(), sizeof(h));
    absl::Status& s = header_status[extent];
    if (got[i] < 0) {
      s = ErrnoToStatus(-got[i], absl::StrCat("read of block ", extent, " in ", dir_));
    } else if (static_cast<uint64_t>(got[i]) != kAlign || h.magic != kMagic) {
      s = absl::NotFoundError(absl::StrCat("block ", extent, " was never written"));
    } else if (h.version != kLayoutVersion || h.extent != extent || h.fingerprint != fingerprint_ ||
               h.bytes > block_bytes_ || !HeaderSound(headers[extent].get())) {
      ++stats_.checksum_failures;
      s = absl::DataLossError(
          absl::StrCat("block ", extent, " in ", dir_, " has a header that is not its own"));
    }
  }
  reads.clear();
  std::vector<SectionIo*> pending;
  // Where each pending section lands: its read, and its offset in that read. Consecutive
  // sections of one extent into consecutive buffers (a block's layers, for layer-wise
  // loads) are one read: fewer, larger requests, each section still checked alone.
  std::vector<std::pair<size_t, uint64_t>> place;
  int last_section = -1;
  uint64_t last_extent = 0;
  for (SectionIo& io : ios) {
    if (!absl::IsAborted(io.status)) continue;  // refused above
    const absl::Status& s = header_status[io.extent];
    ExtentHeader h;
    std::memcpy(&h, headers[io.extent].get(), sizeof(h));
    if (!s.ok()) {
      io.status = s;
    } else if (h.key != io.key) {
      io.status = absl::DataLossError(
          absl::StrCat("block ", io.extent, " in ", dir_, " holds key ", h.key, ", not ", io.key));
    } else {
      const bool joins =
          !reads.empty() && last_extent == io.extent && last_section + 1 == io.section &&
          static_cast<uint8_t*>(std::get<2>(reads.back())) + std::get<1>(reads.back()) ==
              static_cast<uint8_t*>(io.data);
      if (joins) {
        place.emplace_back(reads.size() - 1, std::get<1>(reads.back()));
        std::get<1>(reads.back()) += section_bytes_;
      } else {
        place.emplace_back(reads.size(), 0);
        reads.emplace_back(static_cast<off_t>(io.extent * extent_bytes_ + kAlign +
                                              static_cast<uint64_t>(io.section) * section_bytes_),
                           section_bytes_, io.data);
      }
      last_extent = io.extent;
      last_section = io.section;
      pending.push_back(&io);
    }
  }
  ASSIGN_OR_RETURN(got, read_all(reads));
  absl::Status first;
  for (size_t i = 0; i < pending.size(); ++i) {
    SectionIo& io = *pending[i];
    ExtentHeader h;
    std::memcpy(&h, headers[io.extent].get(), sizeof(h));
    const auto* sums = reinterpret_cast<const uint64_t*>(headers[io.extent].get() + kSectionSums);
    const uint64_t used = SectionUsed(h.bytes, section_bytes_, io.section);
    const auto [read, at] = place[i];
    if (got[read] < 0) {
      io.status =
          ErrnoToStatus(-got[read], absl::StrCat("read of block ", io.extent, " in ", dir_));
    } else if (static_cast<uint64_t>(got[read]) < at + section_bytes_) {
      io.status = absl::DataLossError(absl::StrCat("short read of block ", io.extent));
    } else if (transport::PayloadChecksum(std::span<const uint8_t>(
                   static_cast<const uint8_t*>(io.data), used)) != sums[io.section]) {
      ++stats_.checksum_failures;
      io.status = absl::DataLossError(absl::StrCat(
          "block ", io.extent, " in ", dir_, " fails its checksum (section ", io.section, ")"));
    } else {
      io.bytes = used;
      io.payload_bytes = h.bytes;
      io.status = absl::OkStatus();
      stats_.bytes_read += section_bytes_;
    }
  }
  for (const SectionIo& io : ios) {
    if (first.ok() && !io.status.ok()) first = io.status;
  }
  return first;
}

absl::StatusOr<std::vector<ExtentInfo>> KvDisk::Scan() {
  std::vector<ExtentInfo> found;
  std::vector<std::shared_ptr<uint8_t>> headers(queue_depth_);
  for (auto& h : headers) {
    h = Aligned(kAlign);
    if (h == nullptr) return absl::ResourceExhaustedError("no memory for I/O");
  }
  for (uint64_t begin = 0; begin < num_extents_; begin += queue_depth_) {
    const uint64_t end = std::min(num_extents_, begin + static_cast<uint64_t>(queue_depth_));
    std::vector<Op> ops(end - begin);
    for (uint64_t e = begin; e < end; ++e) {
      ops[e - begin].offset = static_cast<off_t>(e * extent_bytes_);
      ops[e - begin].iov[0] = {headers[e - begin].get(), kAlign};
    }
    RETURN_IF_ERROR(Execute(ops));
    for (uint64_t e = begin; e < end; ++e) {
      const int res = ops[e - begin].res;
      if (res < 0) return ErrnoToStatus(-res, absl::StrCat("scan of block ", e, " in ", dir_));
      if (static_cast<uint64_t>(res) != kAlign) continue;
      ExtentHeader h;
      std::memcpy(&h, headers[e - begin].get(), sizeof(h));
      if (h.magic != kMagic || h.version != kLayoutVersion || h.extent != e ||
          h.fingerprint != fingerprint_ || h.bytes > block_bytes_ ||
          !HeaderSound(headers[e - begin].get())) {
        continue;
      }
      found.push_back({e, h.key, h.bytes, h.written_unix_s});
    }
  }
  return found;
}

absl::Status KvDisk::Drop(std::span<const uint64_t> extents) {
  for (uint64_t e : extents) {
    if (e >= num_extents_) {
      return absl::InvalidArgumentError(absl::StrCat("extent ", e, " of ", num_extents_));
    }
    if (fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                  static_cast<off_t>(e * extent_bytes_), static_cast<off_t>(extent_bytes_)) == 0) {
      continue;
    }
    if (errno != EOPNOTSUPP)
      return ErrnoToStatus(errno, absl::StrCat("drop block ", e, " in ", dir_));
    // No hole punching here: a zeroed header makes the block read as never written (its
    // space is not given back until it is overwritten).
    std::shared_ptr<uint8_t> zeros = Aligned(kAlign);
    if (zeros == nullptr) return absl::ResourceExhaustedError("no memory for I/O");
    if (pwrite(fd_, zeros.get(), kAlign, static_cast<off_t>(e * extent_bytes_)) !=
        static_cast<ssize_t>(kAlign)) {
      return ErrnoToStatus(errno, absl::StrCat("drop block ", e, " in ", dir_));
    }
  }
  return absl::OkStatus();
}

absl::Status KvDisk::Write(std::span<ExtentIo> ios) { return Run(ios, /*write=*/true); }
absl::Status KvDisk::Read(std::span<ExtentIo> ios) { return Run(ios, /*write=*/false); }

absl::Status KvDisk::Execute(std::vector<Op>& ops) {
  if (broken_) {
    return absl::FailedPreconditionError(
        absl::StrCat("the KV disk tier at ", dir_, " lost its I/O ring; reopen it"));
  }
  for (size_t begin = 0; begin < ops.size(); begin += queue_depth_) {
    const size_t end = std::min(ops.size(), begin + static_cast<size_t>(queue_depth_));
    for (size_t i = begin; i < end; ++i) {
      Op& op = ops[i];
      op.res = -ECANCELED;
      io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
      if (sqe == nullptr) {
        broken_ = true;
        return absl::InternalError("io_uring: no submission entry free");
      }
      if (op.write) {
        io_uring_prep_writev(sqe, fd_, op.iov, op.iovcnt, op.offset);
      } else {
        io_uring_prep_readv(sqe, fd_, op.iov, op.iovcnt, op.offset);
      }
      io_uring_sqe_set_data64(sqe, i);
    }
    // Everything prepared must go, and everything that went must come back before any
    // buffer is let go: the kernel writes into them until their completions are reaped.
    size_t submitted = 0;
    absl::Status error;
    while (submitted < end - begin) {
      const int rc = io_uring_submit(ring_.get());
      if (rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) continue;
      if (rc <= 0) {
        error = ErrnoToStatus(rc < 0 ? -rc : EIO, "io_uring submit");
        break;
      }
      submitted += static_cast<size_t>(rc);
    }
    for (size_t done = 0; done < submitted;) {
      io_uring_cqe* cqe = nullptr;
      const int rc = io_uring_wait_cqe(ring_.get(), &cqe);
      if (rc == -EINTR) continue;
      if (rc < 0) {
        broken_ = true;
        return ErrnoToStatus(-rc, "io_uring wait");
      }
      const uint64_t i = io_uring_cqe_get_data64(cqe);
      if (i < ops.size()) ops[i].res = cqe->res;
      io_uring_cqe_seen(ring_.get(), cqe);
      ++done;
    }
    if (!error.ok()) {
      broken_ = true;  // entries prepared but not submitted would go with the next call
      return error;
    }
  }
  return absl::OkStatus();
}

absl::Status KvDisk::Run(std::span<ExtentIo> ios, bool write) {
  std::vector<Op> ops;
  std::vector<size_t> which;  // ios index of each op
  std::vector<std::shared_ptr<uint8_t>> headers;
  for (ExtentIo& io : ios) io.status = absl::AbortedError(write ? "not written" : "not read");
  for (size_t i = 0; i < ios.size(); ++i) {
    ExtentIo& io = ios[i];
    if (io.extent >= num_extents_ || io.data == nullptr ||
        reinterpret_cast<uintptr_t>(io.data) % kAlign != 0 || (write && io.bytes > block_bytes_)) {
      io.status = absl::InvalidArgumentError(
          absl::StrCat("extent ", io.extent, " of ", num_extents_, ", ", io.bytes, " bytes of ",
                       block_bytes_, ", buffer ", io.data == nullptr ? "missing" : "given"));
      continue;
    }
    std::shared_ptr<uint8_t> header = Aligned(kAlign);
    if (header == nullptr) {
      return FailUnfinished(ios, absl::ResourceExhaustedError("no memory for I/O"));
    }
    if (write) {
      ExtentHeader h;
      h.extent = io.extent;
      h.bytes = io.bytes;
      h.fingerprint = fingerprint_;
      h.key = io.key;
      h.written_unix_s = static_cast<int64_t>(time(nullptr));
      h.sections = static_cast<uint32_t>(sections_);
      std::memcpy(header.get(), &h, sizeof(h));
      SumSections(header.get(), static_cast<const uint8_t*>(io.data), io.bytes, section_bytes_,
                  sections_);
    }
    Op op;
    op.write = write;
    op.offset = static_cast<off_t>(io.extent * extent_bytes_);
    op.iovcnt = 2;
    op.iov[0] = {header.get(), kAlign};
    op.iov[1] = {io.data, block_bytes_};
    ops.push_back(op);
    which.push_back(i);
    headers.push_back(std::move(header));
  }
  RETURN_IF_ERROR(Execute(ops));
  const int64_t want = static_cast<int64_t>(kAlign + block_bytes_);
  for (size_t k = 0; k < ops.size(); ++k) {
    ExtentIo& io = ios[which[k]];
    const int res = ops[k].res;
    if (res < 0) {
      io.status = ErrnoToStatus(
          -res, absl::StrCat(write ? "write" : "read", " of block ", io.extent, " in ", dir_));
      if (write) ++stats_.write_errors;
      continue;
    }
    if (res != want) {
      io.status =
          write ? absl::ResourceExhaustedError(absl::StrCat("short write of block ", io.extent,
                                                            " in ", dir_, ": ", res, " of ", want,
                                                            " bytes"))
                : absl::NotFoundError(absl::StrCat("block ", io.extent, " was never written"));
      if (write) ++stats_.write_errors;
      continue;
    }
    if (write) {
      stats_.bytes_written += static_cast<uint64_t>(res);
      io.status = absl::OkStatus();
      continue;
    }
    stats_.bytes_read += static_cast<uint64_t>(res);
    const uint8_t* header = headers[k].get();
    ExtentHeader h;
    std::memcpy(&h, header, sizeof(h));
    if (h.magic != kMagic) {
      io.status = absl::NotFoundError(absl::StrCat("block ", io.extent, " was never written"));
    } else if (h.version != kLayoutVersion || h.extent != io.extent ||
               h.fingerprint != fingerprint_ || h.bytes > block_bytes_) {
      ++stats_.checksum_failures;
      io.status = absl::DataLossError(
          absl::StrCat("block ", io.extent, " in ", dir_, " has a header that is not its own"));
    } else if (h.key != io.key) {
      io.status = absl::DataLossError(
          absl::StrCat("block ", io.extent, " in ", dir_, " holds key ", h.key, ", not ", io.key));
    } else if (!HeaderSound(header)) {
      ++stats_.checksum_failures;
      io.status = absl::DataLossError(
          absl::StrCat("block ", io.extent, " in ", dir_, " has a damaged header"));
    } else {
      const auto* sums = reinterpret_cast<const uint64_t*>(header + kSectionSums);
      io.status = absl::OkStatus();
      for (int sec = 0; sec < sections_; ++sec) {
        const uint64_t used = SectionUsed(h.bytes, section_bytes_, sec);
        if (transport::PayloadChecksum(std::span<const uint8_t>(
                static_cast<const uint8_t*>(io.data) + sec * section_bytes_, used)) != sums[sec]) {
          ++stats_.checksum_failures;
          io.status = absl::DataLossError(absl::StrCat("block ", io.extent, " in ", dir_,
                                                       " fails its checksum (section ", sec, ")"));
          break;
        }
      }
      if (io.status.ok()) io.bytes = h.bytes;
    }
  }
  absl::Status first;
  for (const ExtentIo& io : ios) {
    if (first.ok() && !io.status.ok()) first = io.status;
  }
  return first;
}

}  // namespace strata
