// The disk tier's block file against a raw sequential-read probe of the same file, at the
// same block size and queue depth, interleaved rounds, medians (what the issue "A disk tier
// under the memory nodes" asks disk reads to be compared with: at least 70% of the probe).
//
//   bazel-bin/memory_node/bench/kv_disk_bench --dir=/var/tmp/strata_kv_disk_bench \
//       [--block_kib=576] [--blocks=1024] [--queue_depth=8] [--rounds=5]
//
// 576 KiB is a 16-token block of the demo model (12 layers, K and V, 768 bf16 values per
// token and layer). The file is written once; then each round reads every block in order,
// once through KvDisk::Read (io_uring, O_DIRECT, header, key and checksum verified) and once
// through the probe (io_uring, O_DIRECT, the same extents' bytes, nothing verified), in
// alternating order. O_DIRECT keeps the page cache out of both.
#include <fcntl.h>
#include <liburing.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/bench/median.h"
#include "memory_node/kv_disk.h"

ABSL_FLAG(std::string, dir, "/var/tmp/strata_kv_disk_bench", "Directory (removed first)");
ABSL_FLAG(int64_t, block_kib, 576, "Block payload, KiB");
ABSL_FLAG(int64_t, blocks, 1024, "Blocks written and read");
ABSL_FLAG(int, queue_depth, 8, "Reads in flight");
ABSL_FLAG(int, rounds, 5, "Interleaved rounds");

namespace {

using strata::ExtentIo;
using strata::KvDisk;
using strata::Median;

// Reads `blocks` extents of `extent_bytes` in order, `depth` at a time, into `buffers`.
double Probe(const std::string& path, uint64_t extent_bytes, int64_t blocks, int depth,
             std::vector<std::shared_ptr<uint8_t>>& buffers) {
  const int fd = open(path.c_str(), O_RDONLY | O_DIRECT);
  if (fd < 0) {
    std::perror("probe open");
    std::exit(1);
  }
  io_uring ring;
  io_uring_queue_init(depth, &ring, 0);
  const absl::Time start = absl::Now();
  for (int64_t begin = 0; begin < blocks; begin += depth) {
    const int64_t end = std::min(blocks, begin + depth);
    for (int64_t b = begin; b < end; ++b) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      io_uring_prep_read(sqe, fd, buffers[b - begin].get(), extent_bytes,
                         static_cast<off_t>(b * extent_bytes));
    }
    io_uring_submit(&ring);
    for (int64_t b = begin; b < end; ++b) {
      io_uring_cqe* cqe = nullptr;
      io_uring_wait_cqe(&ring, &cqe);
      if (cqe->res != static_cast<int>(extent_bytes)) {
        std::fprintf(stderr, "probe: short read %d\n", cqe->res);
        std::exit(1);
      }
      io_uring_cqe_seen(&ring, cqe);
    }
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  io_uring_queue_exit(&ring);
  close(fd);
  return seconds;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string dir = absl::GetFlag(FLAGS_dir);
  const int64_t blocks = absl::GetFlag(FLAGS_blocks);
  const int depth = absl::GetFlag(FLAGS_queue_depth);
  std::filesystem::remove_all(dir);
  strata::KvDiskOptions o;
  o.dir = dir;
  o.fingerprint = "kv_disk_bench";
  o.block_bytes = static_cast<uint64_t>(absl::GetFlag(FLAGS_block_kib)) << 10;
  o.budget_bytes = static_cast<uint64_t>(blocks) * (o.block_bytes + KvDisk::kAlign);
  o.queue_depth = depth;
  auto disk = KvDisk::Open(o);
  if (!disk.ok()) {
    std::fprintf(stderr, "%s\n", std::string(disk.status().message()).c_str());
    return 1;
  }
  const uint64_t block = (*disk)->block_bytes();
  const uint64_t extent = block + KvDisk::kAlign;
  // Write every block once, with random contents.
  std::vector<std::shared_ptr<uint8_t>> buffers;
  for (int i = 0; i < depth; ++i) buffers.push_back((*disk)->AllocateBlock());
  std::mt19937_64 rng(7);
  for (auto& b : buffers) {
    auto* w = reinterpret_cast<uint64_t*>(b.get());
    for (uint64_t i = 0; i < block / 8; ++i) w[i] = rng();
  }
  for (int64_t begin = 0; begin < blocks; begin += depth) {
    std::vector<ExtentIo> ios;
    for (int64_t b = begin; b < std::min(blocks, begin + depth); ++b) {
      ios.push_back({static_cast<uint64_t>(b),
                     buffers[b - begin].get(),
                     block,
                     static_cast<uint64_t>(b) + 1,
                     {}});
    }
    if (auto s = (*disk)->Write(ios); !s.ok()) {
      std::fprintf(stderr, "write: %s\n", std::string(s.message()).c_str());
      return 1;
    }
  }
  sync();
  // The probe reads whole extents (header and payload) into buffers of that size.
  std::vector<std::shared_ptr<uint8_t>> probe_buffers;
  for (int i = 0; i < depth; ++i) {
    void* p = nullptr;
    if (posix_memalign(&p, KvDisk::kAlign, extent) != 0) return 1;
    probe_buffers.emplace_back(static_cast<uint8_t*>(p), [](uint8_t* q) { free(q); });
  }
  std::vector<double> tier, probe;
  const double bytes = static_cast<double>(blocks) * static_cast<double>(extent);
  for (int r = 0; r < absl::GetFlag(FLAGS_rounds); ++r) {
    auto run_tier = [&] {
      const absl::Time start = absl::Now();
      for (int64_t begin = 0; begin < blocks; begin += depth) {
        std::vector<ExtentIo> ios;
        for (int64_t b = begin; b < std::min(blocks, begin + depth); ++b) {
          ios.push_back({static_cast<uint64_t>(b),
                         buffers[b - begin].get(),
                         0,
                         static_cast<uint64_t>(b) + 1,
                         {}});
        }
        if (auto s = (*disk)->Read(ios); !s.ok()) {
          std::fprintf(stderr, "read: %s\n", std::string(s.message()).c_str());
          std::exit(1);
        }
      }
      tier.push_back(bytes / absl::ToDoubleSeconds(absl::Now() - start) / 1e9);
    };
    auto run_probe = [&] {
      probe.push_back(bytes / Probe(dir + "/blocks", extent, blocks, depth, probe_buffers) / 1e9);
    };
    if (r % 2 == 0) {
      run_tier();
      run_probe();
    } else {
      run_probe();
      run_tier();
    }
    std::printf("round %d: tier %.3f GB/s, probe %.3f GB/s\n", r + 1, tier.back(), probe.back());
  }
  const double t = Median(tier), p = Median(probe);
  std::printf(
      "%lld blocks of %llu KiB (+4 KiB header), queue depth %d, %s; %d interleaved "
      "rounds, medians: tier %.3f GB/s (header, key and checksum verified), probe %.3f "
      "GB/s, tier/probe %.2f\n",
      static_cast<long long>(blocks), static_cast<unsigned long long>(block >> 10), depth,
      (*disk)->direct() ? "O_DIRECT" : "buffered", absl::GetFlag(FLAGS_rounds), t, p, t / p);
  disk->reset();
  std::filesystem::remove_all(dir);
  return 0;
}
