// What delayed write-back saves (HILOS; the issue "AttentionStore and HILOS policies"):
// writing each decoded token's KV to disk as it is produced (write-through), against
// gathering a block's tokens in DRAM and writing the block once when it is full (what the
// disk tier does), on the same file and file system, with O_DIRECT, interleaved rounds,
// medians.
//
//   bazel-bin/memory_node/bench/write_back_bench --dir=/var/tmp/strata_write_back_bench \
//       [--layers=12] [--row_bytes=1536] [--block_tokens=16] [--blocks=64] [--rounds=3]
//
// The defaults are the demo model (12 layers; K or V of one token in one layer is 768 bf16
// values) and the tier's 16-token block, laid out as the tier lays it out: one section per
// layer, its K rows then its V rows. Write-through writes, for each token, the 4 KiB pages
// that hold its K row and its V row in every layer (O_DIRECT writes whole aligned pages; a
// row is smaller than a page and may straddle two), all of one token's pages at once. The
// block write is KvDisk::Write of the whole extent (its header, checksums and payload) once
// per block. Printed: write operations, bytes and time per token, each way.
#include <fcntl.h>
#include <liburing.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <set>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/bench/median.h"
#include "memory_node/kv_disk.h"

ABSL_FLAG(std::string, dir, "/var/tmp/strata_write_back_bench", "Directory (removed first)");
ABSL_FLAG(int, layers, 12, "Layers (one section each)");
ABSL_FLAG(int64_t, row_bytes, 1536, "K (or V) bytes of one token in one layer");
ABSL_FLAG(int, block_tokens, 16, "Tokens per block");
ABSL_FLAG(int64_t, blocks, 64, "Blocks written each way per round");
ABSL_FLAG(int, rounds, 3, "Interleaved rounds");

namespace {

using strata::ExtentIo;
using strata::KvDisk;
using strata::Median;

struct Cost {
  double seconds = 0;
  uint64_t ops = 0, bytes = 0;
};

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string dir = absl::GetFlag(FLAGS_dir);
  const int layers = absl::GetFlag(FLAGS_layers);
  const uint64_t row = static_cast<uint64_t>(absl::GetFlag(FLAGS_row_bytes));
  const int tokens = absl::GetFlag(FLAGS_block_tokens);
  const int64_t blocks = absl::GetFlag(FLAGS_blocks);
  std::filesystem::remove_all(dir);
  strata::KvDiskOptions o;
  o.dir = dir;
  o.fingerprint = "write_back_bench";
  o.sections = layers;
  o.block_bytes = static_cast<uint64_t>(layers) * 2 * tokens * row;
  o.budget_bytes = static_cast<uint64_t>(blocks) * (o.block_bytes + 64 * KvDisk::kAlign);
  o.queue_depth = 8;
  auto disk = KvDisk::Open(o);
  if (!disk.ok()) {
    std::fprintf(stderr, "%s\n", std::string(disk.status().message()).c_str());
    return 1;
  }
  const uint64_t block = (*disk)->block_bytes();
  const uint64_t section = (*disk)->section_bytes();
  const uint64_t extent = block + KvDisk::kAlign;
  std::shared_ptr<uint8_t> buffer = (*disk)->AllocateBlock();
  std::mt19937_64 rng(7);
  auto* w = reinterpret_cast<uint64_t*>(buffer.get());
  for (uint64_t i = 0; i < block / 8; ++i) w[i] = rng();
  const std::string path = dir + "/blocks";
  const int fd = open(path.c_str(), O_WRONLY | O_DIRECT);
  if (fd < 0) {
    std::perror("open");
    return 1;
  }
  io_uring ring;
  const int depth = 4 * layers;
  io_uring_queue_init(depth, &ring, 0);

  // Write-through: each token's pages, all of them in flight together.
  auto write_through = [&] {
    Cost c;
    const absl::Time start = absl::Now();
    for (int64_t b = 0; b < blocks; ++b) {
      for (int t = 0; t < tokens; ++t) {
        std::set<uint64_t> pages;  // file offsets of the 4 KiB pages this token touches
        for (int l = 0; l < layers; ++l) {
          const uint64_t base = b * extent + KvDisk::kAlign + l * section;
          for (uint64_t at : {base + t * row, base + (tokens + t) * row}) {
            for (uint64_t p = at / KvDisk::kAlign; p <= (at + row - 1) / KvDisk::kAlign; ++p) {
              pages.insert(p * KvDisk::kAlign);
            }
          }
        }
        int submitted = 0;
        for (uint64_t page : pages) {
          io_uring_sqe* sqe = io_uring_get_sqe(&ring);
          io_uring_prep_write(sqe, fd, buffer.get(), KvDisk::kAlign, static_cast<off_t>(page));
          if (++submitted == depth) {
            io_uring_submit_and_wait(&ring, submitted);
            for (int i = 0; i < submitted; ++i) {
              io_uring_cqe* cqe = nullptr;
              io_uring_wait_cqe(&ring, &cqe);
              if (cqe->res != static_cast<int>(KvDisk::kAlign)) std::exit(1);
              io_uring_cqe_seen(&ring, cqe);
            }
            submitted = 0;
          }
        }
        io_uring_submit_and_wait(&ring, submitted);
        for (int i = 0; i < submitted; ++i) {
          io_uring_cqe* cqe = nullptr;
          io_uring_wait_cqe(&ring, &cqe);
          if (cqe->res != static_cast<int>(KvDisk::kAlign)) {
            std::fprintf(stderr, "write: %d\n", cqe->res);
            std::exit(1);
          }
          io_uring_cqe_seen(&ring, cqe);
        }
        c.ops += pages.size();
        c.bytes += pages.size() * KvDisk::kAlign;
      }
    }
    c.seconds = absl::ToDoubleSeconds(absl::Now() - start);
    return c;
  };
  // Delayed write-back: one extent write per full block.
  auto write_back = [&] {
    Cost c;
    const uint64_t before = (*disk)->stats().bytes_written;
    const absl::Time start = absl::Now();
    for (int64_t b = 0; b < blocks; ++b) {
      std::vector<ExtentIo> ios = {
          {static_cast<uint64_t>(b), buffer.get(), block, static_cast<uint64_t>(b) + 1, {}}};
      if (auto s = (*disk)->Write(ios); !s.ok()) {
        std::fprintf(stderr, "write: %s\n", std::string(s.message()).c_str());
        std::exit(1);
      }
      c.ops += 1;
    }
    c.seconds = absl::ToDoubleSeconds(absl::Now() - start);
    c.bytes = (*disk)->stats().bytes_written - before;
    return c;
  };
  std::vector<double> through_us, back_us;
  Cost through, back;
  const double per = static_cast<double>(blocks) * tokens;
  for (int r = 0; r < absl::GetFlag(FLAGS_rounds); ++r) {
    if (r % 2 == 0) {
      through = write_through();
      back = write_back();
    } else {
      back = write_back();
      through = write_through();
    }
    through_us.push_back(through.seconds / per * 1e6);
    back_us.push_back(back.seconds / per * 1e6);
    std::printf("round %d: per token, write-through %.1f us, block write-back %.1f us\n", r + 1,
                through_us.back(), back_us.back());
  }
  std::printf(
      "%d layers, %llu-byte rows, %d-token blocks of %llu KiB, %s, %d interleaved rounds, "
      "medians per token: write-through %.2f writes, %.1f KiB, %.1f us; block write-back "
      "%.3f writes, %.1f KiB, %.1f us; write-back needs %.0fx fewer writes and %.2fx fewer "
      "bytes, and takes %.2fx less time\n",
      layers, static_cast<unsigned long long>(row), tokens,
      static_cast<unsigned long long>(block >> 10), (*disk)->direct() ? "O_DIRECT" : "buffered",
      absl::GetFlag(FLAGS_rounds), through.ops / per, through.bytes / per / 1024,
      Median(through_us), back.ops / per, back.bytes / per / 1024, Median(back_us),
      static_cast<double>(through.ops) / back.ops, static_cast<double>(through.bytes) / back.bytes,
      Median(through_us) / Median(back_us));
  io_uring_queue_exit(&ring);
  close(fd);
  disk->reset();
  std::filesystem::remove_all(dir);
  return 0;
}
