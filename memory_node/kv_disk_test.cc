// The cold tier's block file on this machine's ext4 (io_uring, O_DIRECT): blocks come back
// bit for bit; a flipped byte in the file is caught on read and only that block fails; a
// second node cannot open the same directory; a directory written for another fingerprint
// is discarded; files are private; a filesystem without O_DIRECT is refused unless buffered
// I/O is allowed; a full disk fails only the blocks that did not fit.
#include "memory_node/kv_disk.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <liburing.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <tuple>

#include "gtest/gtest.h"
#include "memory_node/testing/disk_test_env.h"

// Fault injection for the allocations of extents' headers (one page each): after
// `g_pages_before_failure` more of them succeed, the next fails as if memory ran out.
std::atomic<int> g_pages_before_failure{-1};  // -1: never fails

extern "C" int posix_memalign(void** out, size_t alignment, size_t bytes) {
  using Real = int (*)(void**, size_t, size_t);
  static const Real real = reinterpret_cast<Real>(dlsym(RTLD_NEXT, "posix_memalign"));
  if (bytes == 4096 && g_pages_before_failure.load() >= 0 &&
      g_pages_before_failure.fetch_sub(1) == 0) {
    return ENOMEM;
  }
  return real(out, alignment, bytes);
}

namespace strata {
namespace {

class KvDiskTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = testing_env::IoUringUnavailable(); !why.empty())
      GTEST_SKIP() << why;
  }
};

std::string TempDir(const std::string& name) { return testing_env::FreshDir(name); }

KvDiskOptions Options(const std::string& dir, const std::string& fingerprint = "tiny bf16") {
  KvDiskOptions o;
  o.dir = dir;
  o.fingerprint = fingerprint;
  o.block_bytes = 3 * 4096 + 100;  // rounded up to 4 pages
  o.budget_bytes = 40 * (4096 + 4 * 4096);
  o.queue_depth = 4;
  return o;
}

// Fills `data` with bytes drawn from `seed`.
void Fill(uint8_t* data, uint64_t bytes, uint32_t seed) {
  std::mt19937 rng(seed);
  for (uint64_t i = 0; i < bytes; ++i) data[i] = static_cast<uint8_t>(rng());
}

TEST_F(KvDiskTest, BlocksComeBackBitForBit) {
  auto disk = KvDisk::Open(Options(TempDir("round_trip")));
  ASSERT_TRUE(disk.ok()) << disk.status();
  EXPECT_TRUE((*disk)->direct()) << "this machine's ext4 supports O_DIRECT";
  EXPECT_EQ((*disk)->num_extents(), 40u);
  EXPECT_EQ((*disk)->block_bytes(), 4u * 4096);
  std::vector<std::shared_ptr<uint8_t>> blocks;
  std::vector<ExtentIo> writes;
  for (uint64_t e = 0; e < 10; ++e) {
    blocks.push_back((*disk)->AllocateBlock());
    const uint64_t bytes = 1000 + e * 1500;
    Fill(blocks.back().get(), bytes, static_cast<uint32_t>(e));
    writes.push_back({e * 3, blocks.back().get(), bytes, 0, {}});
  }
  ASSERT_TRUE((*disk)->Write(writes).ok());
  std::vector<std::shared_ptr<uint8_t>> back;
  std::vector<ExtentIo> reads;
  for (const ExtentIo& w : writes) {
    back.push_back((*disk)->AllocateBlock());
    reads.push_back({w.extent, back.back().get(), 0, {}});
  }
  ASSERT_TRUE((*disk)->Read(reads).ok());
  for (size_t i = 0; i < reads.size(); ++i) {
    ASSERT_EQ(reads[i].bytes, writes[i].bytes);
    EXPECT_EQ(std::memcmp(back[i].get(), blocks[i].get(), writes[i].bytes), 0) << "block " << i;
  }
  // A block never written is NotFound, not garbage.
  auto spare = (*disk)->AllocateBlock();
  ExtentIo never{1, spare.get(), 0, {}};
  EXPECT_TRUE(absl::IsNotFound((*disk)->Read({&never, 1}))) << never.status;
  // Out of range, or an unaligned buffer: refused.
  ExtentIo outside{40, spare.get(), 10, {}};
  EXPECT_TRUE(absl::IsInvalidArgument((*disk)->Write({&outside, 1})));
  ExtentIo unaligned{2, spare.get() + 1, 10, {}};
  EXPECT_TRUE(absl::IsInvalidArgument((*disk)->Write({&unaligned, 1})));
  EXPECT_EQ((*disk)->stats().bytes_written, 10u * (4096 + 4 * 4096));
}

// Memory for an extent's header runs out part-way through a batch: no extent of the batch
// looks written or read, and nothing of it is taken for bad bytes on disk.
TEST_F(KvDiskTest, AnAllocationThatFailsMidBatchLeavesNoExtentLookingDone) {
  auto disk = KvDisk::Open(Options(TempDir("no_memory")));
  ASSERT_TRUE(disk.ok()) << disk.status();
  std::vector<std::shared_ptr<uint8_t>> blocks;
  std::vector<ExtentIo> writes;
  for (uint64_t e = 0; e < 3; ++e) {
    blocks.push_back((*disk)->AllocateBlock());
    Fill(blocks.back().get(), 5000, 20 + static_cast<uint32_t>(e));
    writes.push_back({e, blocks.back().get(), 5000, 7, {}});
  }
  g_pages_before_failure = 1;  // the second extent's header
  const absl::Status written = (*disk)->Write(writes);
  g_pages_before_failure = -1;
  EXPECT_TRUE(absl::IsResourceExhausted(written)) << written;
  for (const ExtentIo& w : writes) {
    EXPECT_TRUE(absl::IsResourceExhausted(w.status)) << "extent " << w.extent << ": " << w.status;
  }
  EXPECT_EQ((*disk)->stats().bytes_written, 0u);
  ASSERT_TRUE((*disk)->Write(writes).ok()) << "with memory back, the same batch is written";
  // Reading them whole, and by sections.
  std::vector<std::shared_ptr<uint8_t>> back;
  std::vector<ExtentIo> reads;
  std::vector<SectionIo> sections;
  for (uint64_t e = 0; e < 3; ++e) {
    back.push_back((*disk)->AllocateBlock());
    reads.push_back({e, back.back().get(), 0, 7, {}});
    sections.push_back({e, 0, back.back().get(), 7, 0, 0, {}});
  }
  g_pages_before_failure = 1;
  const absl::Status read = (*disk)->Read(reads);
  g_pages_before_failure = 1;
  const absl::Status read_sections = (*disk)->ReadSections(sections);
  g_pages_before_failure = -1;
  EXPECT_TRUE(absl::IsResourceExhausted(read)) << read;
  EXPECT_TRUE(absl::IsResourceExhausted(read_sections)) << read_sections;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(absl::IsResourceExhausted(reads[i].status)) << i << ": " << reads[i].status;
    EXPECT_TRUE(absl::IsResourceExhausted(sections[i].status)) << i << ": " << sections[i].status;
  }
  EXPECT_EQ((*disk)->stats().checksum_failures, 0u);
  ASSERT_TRUE((*disk)->Read(reads).ok());
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(std::memcmp(back[i].get(), blocks[i].get(), 5000), 0) << "extent " << i;
  }
}

TEST_F(KvDiskTest, AFlippedByteFailsOnlyItsBlock) {
  const std::string dir = TempDir("corrupt");
  auto disk = KvDisk::Open(Options(dir));
  ASSERT_TRUE(disk.ok()) << disk.status();
  std::vector<std::shared_ptr<uint8_t>> blocks;
  std::vector<ExtentIo> writes;
  for (uint64_t e = 0; e < 3; ++e) {
    blocks.push_back((*disk)->AllocateBlock());
    Fill(blocks.back().get(), 8000, 10 + static_cast<uint32_t>(e));
    writes.push_back({e, blocks.back().get(), 8000, {}});
  }
  ASSERT_TRUE((*disk)->Write(writes).ok());
  // Flip one payload byte of extent 1 behind the tier's back.
  const int fd = open((dir + "/blocks").c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  const off_t at = static_cast<off_t>(1 * (4096 + 4 * 4096) + 4096 + 5000);
  uint8_t byte = 0;
  ASSERT_EQ(pread(fd, &byte, 1, at), 1);
  byte ^= 0x40;
  ASSERT_EQ(pwrite(fd, &byte, 1, at), 1);
  fsync(fd);
  close(fd);
  std::vector<std::shared_ptr<uint8_t>> back;
  std::vector<ExtentIo> reads;
  for (uint64_t e = 0; e < 3; ++e) {
    back.push_back((*disk)->AllocateBlock());
    reads.push_back({e, back.back().get(), 0, {}});
  }
  EXPECT_TRUE(absl::IsDataLoss((*disk)->Read(reads)));
  EXPECT_TRUE(reads[0].status.ok()) << reads[0].status;
  EXPECT_TRUE(absl::IsDataLoss(reads[1].status)) << reads[1].status;
  EXPECT_TRUE(reads[2].status.ok()) << reads[2].status;
  EXPECT_EQ(std::memcmp(back[2].get(), blocks[2].get(), 8000), 0);
  EXPECT_EQ((*disk)->stats().checksum_failures, 1u);
}

TEST_F(KvDiskTest, OneNodePerDirectoryAndPrivateFiles) {
  const std::string dir = TempDir("locked");
  auto first = KvDisk::Open(Options(dir));
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = KvDisk::Open(Options(dir));
  EXPECT_TRUE(absl::IsFailedPrecondition(second.status())) << second.status();
  struct stat st;
  ASSERT_EQ(stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  for (const char* file : {"/blocks", "/FINGERPRINT", "/LOCK"}) {
    ASSERT_EQ(stat((dir + file).c_str(), &st), 0) << file;
    EXPECT_EQ(st.st_mode & 0777, 0600u) << file;
  }
  first->reset();
  auto third = KvDisk::Open(Options(dir));
  EXPECT_TRUE(third.ok()) << third.status();
}

TEST_F(KvDiskTest, ADirectoryOfAnotherFingerprintIsDiscarded) {
  const std::string dir = TempDir("fingerprint");
  auto block = std::shared_ptr<uint8_t>();
  {
    auto disk = KvDisk::Open(Options(dir, "model-a bf16"));
    ASSERT_TRUE(disk.ok());
    EXPECT_TRUE((*disk)->discarded());  // new: started empty
    block = (*disk)->AllocateBlock();
    Fill(block.get(), 4000, 3);
    ExtentIo w{5, block.get(), 4000, {}};
    ASSERT_TRUE((*disk)->Write({&w, 1}).ok());
  }
  {
    auto same = KvDisk::Open(Options(dir, "model-a bf16"));
    ASSERT_TRUE(same.ok());
    EXPECT_FALSE((*same)->discarded());
    auto back = (*same)->AllocateBlock();
    ExtentIo r{5, back.get(), 0, {}};
    ASSERT_TRUE((*same)->Read({&r, 1}).ok()) << r.status;
    EXPECT_EQ(std::memcmp(back.get(), block.get(), 4000), 0);
  }
  auto other = KvDisk::Open(Options(dir, "model-b bf16"));
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE((*other)->discarded());
  auto back = (*other)->AllocateBlock();
  ExtentIo r{5, back.get(), 0, {}};
  EXPECT_TRUE(absl::IsNotFound((*other)->Read({&r, 1}))) << r.status;
}

TEST_F(KvDiskTest, AnUnreadableFingerprintIsAnErrorAndKeepsTheBlocks) {
  const std::string dir = TempDir("unreadable_fingerprint");
  auto block = std::shared_ptr<uint8_t>();
  {
    auto disk = KvDisk::Open(Options(dir));
    ASSERT_TRUE(disk.ok());
    block = (*disk)->AllocateBlock();
    Fill(block.get(), 4000, 9);
    ExtentIo w{2, block.get(), 4000, {}};
    ASSERT_TRUE((*disk)->Write({&w, 1}).ok());
  }
  // FINGERPRINT that cannot be read (here a directory in its place) is not a missing one:
  // the node refuses to start instead of discarding the blocks behind it.
  const std::string fingerprint = dir + "/FINGERPRINT";
  std::filesystem::rename(fingerprint, dir + "/FINGERPRINT.saved");
  std::filesystem::create_directory(fingerprint);
  const auto blocks_bytes = std::filesystem::file_size(dir + "/blocks");
  auto refused = KvDisk::Open(Options(dir));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find(fingerprint + ": is a directory"), std::string::npos)
      << refused.status();
  EXPECT_EQ(std::filesystem::file_size(dir + "/blocks"), blocks_bytes);

  std::filesystem::remove(fingerprint);
  std::filesystem::rename(dir + "/FINGERPRINT.saved", fingerprint);
  auto disk = KvDisk::Open(Options(dir));
  ASSERT_TRUE(disk.ok()) << disk.status();
  EXPECT_FALSE((*disk)->discarded());
  auto back = (*disk)->AllocateBlock();
  ExtentIo r{2, back.get(), 0, {}};
  ASSERT_TRUE((*disk)->Read({&r, 1}).ok()) << r.status;
  EXPECT_EQ(std::memcmp(back.get(), block.get(), 4000), 0);
}

TEST_F(KvDiskTest, AFilesystemWithoutODirectIsRefusedUnlessBufferedIsAllowed) {
  // /dev/shm is tmpfs; whether it takes O_DIRECT depends on the kernel.
  if (!std::filesystem::is_directory("/dev/shm") || access("/dev/shm", W_OK) != 0) {
    GTEST_SKIP() << "no writable /dev/shm here";
  }
  const std::string probe = "/dev/shm/strata_kv_disk_probe";
  const int fd = open(probe.c_str(), O_CREAT | O_RDWR | O_DIRECT, 0600);
  const bool tmpfs_direct = fd >= 0;
  if (fd >= 0) close(fd);
  unlink(probe.c_str());
  const std::string dir = "/dev/shm/strata_kv_disk_test_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  auto strict = KvDisk::Open(Options(dir));
  if (tmpfs_direct) {
    EXPECT_TRUE(strict.ok()) << strict.status();
  } else {
    EXPECT_TRUE(absl::IsFailedPrecondition(strict.status())) << strict.status();
    EXPECT_NE(strict.status().message().find("O_DIRECT"), std::string::npos);
  }
  strict = absl::UnknownError("closed");
  KvDiskOptions buffered = Options(dir);
  buffered.allow_buffered = true;
  auto disk = KvDisk::Open(buffered);
  ASSERT_TRUE(disk.ok()) << disk.status();
  auto block = (*disk)->AllocateBlock();
  Fill(block.get(), 100, 4);
  ExtentIo w{0, block.get(), 100, {}};
  EXPECT_TRUE((*disk)->Write({&w, 1}).ok());
  disk->reset();
  std::filesystem::remove_all(dir);
}

// After a restart on the same directory, Scan lists exactly the blocks written, with their
// keys and sizes (what the node would report to the scheduler); a block whose header was
// damaged is not listed; one whose payload was damaged is listed but fails on read. Drop
// frees a block's space and it reads as never written; a read asking for another key fails.
TEST_F(KvDiskTest, ScanAfterRestartDropAndKeys) {
  const std::string dir = TempDir("restart");
  std::vector<std::shared_ptr<uint8_t>> blocks;
  {
    auto disk = KvDisk::Open(Options(dir));
    ASSERT_TRUE(disk.ok()) << disk.status();
    std::vector<ExtentIo> writes;
    for (uint64_t e : {2, 3, 7, 11, 30}) {
      blocks.push_back((*disk)->AllocateBlock());
      Fill(blocks.back().get(), 500 + e, static_cast<uint32_t>(e));
      writes.push_back({e, blocks.back().get(), 500 + e, 0xABC000 + e, {}});
    }
    ASSERT_TRUE((*disk)->Write(writes).ok());
  }
  // Damage block 7's header (its magic) and block 11's payload.
  const int fd = open((dir + "/blocks").c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  const off_t extent = 4096 + 4 * 4096;
  uint8_t byte = 0x5A;
  ASSERT_EQ(pwrite(fd, &byte, 1, 7 * extent), 1);
  ASSERT_EQ(pwrite(fd, &byte, 1, 11 * extent + 4096 + 3), 1);
  close(fd);
  auto disk = KvDisk::Open(Options(dir));
  ASSERT_TRUE(disk.ok()) << disk.status();
  EXPECT_FALSE((*disk)->discarded());
  auto found = (*disk)->Scan();
  ASSERT_TRUE(found.ok()) << found.status();
  std::vector<uint64_t> extents;
  for (const ExtentInfo& x : *found) {
    extents.push_back(x.extent);
    EXPECT_EQ(x.key, 0xABC000 + x.extent);
    EXPECT_EQ(x.bytes, 500 + x.extent);
    EXPECT_GT(x.written_unix_s, 0);
  }
  EXPECT_EQ(extents, (std::vector<uint64_t>{2, 3, 11, 30}));
  auto back = (*disk)->AllocateBlock();
  ExtentIo damaged{11, back.get(), 0, 0xABC000 + 11, {}};
  EXPECT_TRUE(absl::IsDataLoss((*disk)->Read({&damaged, 1})));
  ExtentIo other_key{3, back.get(), 0, 12345, {}};
  EXPECT_TRUE(absl::IsDataLoss((*disk)->Read({&other_key, 1}))) << other_key.status;
  ExtentIo good{3, back.get(), 0, 0xABC000 + 3, {}};
  ASSERT_TRUE((*disk)->Read({&good, 1}).ok()) << good.status;
  EXPECT_EQ(std::memcmp(back.get(), blocks[1].get(), 503), 0);

  struct stat before, after;
  ASSERT_EQ(stat((dir + "/blocks").c_str(), &before), 0);
  const uint64_t dropped[] = {2, 3};
  ASSERT_TRUE((*disk)->Drop(dropped).ok());
  ASSERT_EQ(stat((dir + "/blocks").c_str(), &after), 0);
  EXPECT_LT(after.st_blocks, before.st_blocks) << "dropping freed no space";
  ExtentIo gone{3, back.get(), 0, 0xABC000 + 3, {}};
  EXPECT_TRUE(absl::IsNotFound((*disk)->Read({&gone, 1}))) << gone.status;
  found = (*disk)->Scan();
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(found->size(), 2u);  // 11 and 30
  const uint64_t outside[] = {40};
  EXPECT_TRUE(absl::IsInvalidArgument((*disk)->Drop(outside)));
}

// Sections (a block's layers): each 4096-aligned and checked alone, so one can be read
// without the rest. A flipped byte fails its section only (and the whole-block read); the
// other sections of that block still read.
TEST_F(KvDiskTest, SectionsReadAloneAndFailAlone) {
  const std::string dir = TempDir("sections");
  KvDiskOptions o = Options(dir);
  o.sections = 12;
  o.block_bytes = 12 * 5000;  // sections of 8192 bytes (5000 rounded up)
  o.budget_bytes = 8 * (4096 + 12 * 8192);
  auto disk = KvDisk::Open(o);
  ASSERT_TRUE(disk.ok()) << disk.status();
  ASSERT_EQ((*disk)->section_bytes(), 8192u);
  ASSERT_EQ((*disk)->block_bytes(), 12u * 8192);
  const uint64_t bytes = 11 * 8192 + 100;  // the last section holds 100 bytes
  std::vector<std::shared_ptr<uint8_t>> blocks;
  std::vector<ExtentIo> writes;
  for (uint64_t e = 0; e < 2; ++e) {
    blocks.push_back((*disk)->AllocateBlock());
    Fill(blocks.back().get(), bytes, 40 + static_cast<uint32_t>(e));
    writes.push_back({e, blocks.back().get(), bytes, 77 + e, {}});
  }
  ASSERT_TRUE((*disk)->Write(writes).ok());
  const int fd = open((dir + "/blocks").c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  const off_t extent = 4096 + 12 * 8192;
  uint8_t byte = 0x77;
  ASSERT_EQ(pwrite(fd, &byte, 1, extent + 4096 + 5 * 8192 + 17), 1);  // extent 1, section 5
  close(fd);
  auto buffer = [&] {
    void* p = nullptr;
    EXPECT_EQ(posix_memalign(&p, 4096, 8192), 0);
    return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p), [](uint8_t* q) { free(q); });
  };
  std::vector<std::shared_ptr<uint8_t>> back;
  std::vector<SectionIo> reads;
  for (auto [e, s] :
       std::vector<std::pair<uint64_t, int>>{{0, 0}, {0, 11}, {1, 4}, {1, 5}, {1, 6}}) {
    back.push_back(buffer());
    reads.push_back({e, s, back.back().get(), 77 + e, 0, {}});
  }
  EXPECT_TRUE(absl::IsDataLoss((*disk)->ReadSections(reads)));
  for (size_t i = 0; i < reads.size(); ++i) {
    const SectionIo& r = reads[i];
    if (r.extent == 1 && r.section == 5) {
      EXPECT_TRUE(absl::IsDataLoss(r.status)) << r.status;
      continue;
    }
    ASSERT_TRUE(r.status.ok()) << r.extent << "/" << r.section << ": " << r.status;
    const uint64_t used = r.section == 11 ? 100 : 8192;
    EXPECT_EQ(r.bytes, used);
    EXPECT_EQ(std::memcmp(back[i].get(), blocks[r.extent].get() + r.section * 8192, used), 0)
        << r.extent << "/" << r.section;
  }
  // Consecutive sections of an extent into one contiguous buffer are read together (one
  // request), and each is still checked alone: section 5 fails, 4 and 6 beside it do not.
  auto run = (*disk)->AllocateBlock();
  std::vector<SectionIo> together;
  for (auto [e, s, slot] : std::vector<std::tuple<uint64_t, int, int>>{
           {1, 4, 0}, {1, 5, 1}, {1, 6, 2}, {0, 9, 3}, {0, 10, 4}, {0, 11, 5}}) {
    together.push_back({e, s, run.get() + slot * 8192, 77 + e, 0, {}});
  }
  EXPECT_TRUE(absl::IsDataLoss((*disk)->ReadSections(together)));
  for (const SectionIo& r : together) {
    if (r.extent == 1 && r.section == 5) {
      EXPECT_TRUE(absl::IsDataLoss(r.status)) << r.status;
      continue;
    }
    ASSERT_TRUE(r.status.ok()) << r.extent << "/" << r.section << ": " << r.status;
    const uint64_t used = r.section == 11 ? 100 : 8192;
    EXPECT_EQ(std::memcmp(r.data, blocks[r.extent].get() + r.section * 8192, used), 0)
        << "together: " << r.extent << "/" << r.section;
  }
  auto spare = buffer();
  SectionIo unwritten{3, 2, spare.get(), 0, 0, {}};
  EXPECT_TRUE(absl::IsNotFound((*disk)->ReadSections({&unwritten, 1}))) << unwritten.status;
  SectionIo other_key{0, 1, spare.get(), 5, 0, {}};
  EXPECT_TRUE(absl::IsDataLoss((*disk)->ReadSections({&other_key, 1})));
  SectionIo out_of_range{0, 12, spare.get(), 77, 0, {}};
  EXPECT_TRUE(absl::IsInvalidArgument((*disk)->ReadSections({&out_of_range, 1})));
  // The whole block: section 5 fails it.
  auto whole = (*disk)->AllocateBlock();
  ExtentIo r{1, whole.get(), 0, 78, {}};
  EXPECT_TRUE(absl::IsDataLoss((*disk)->Read({&r, 1}))) << r.status;
  ExtentIo good{0, whole.get(), 0, 77, {}};
  ASSERT_TRUE((*disk)->Read({&good, 1}).ok()) << good.status;
  EXPECT_EQ(std::memcmp(whole.get(), blocks[0].get(), bytes), 0);
}

// A full disk: a 256 KiB tmpfs this test mounts (root only; skipped otherwise) holds a few
// blocks; the write past its end is ResourceExhausted for that block alone, the blocks
// already written still read back, and the tier keeps working for reads.
TEST_F(KvDiskTest, AFullDiskIsResourceExhaustedAndLosesNothingWritten) {
  const std::string dir = TempDir("full");
  std::filesystem::create_directories(dir);
  if (mount("strata-kv-disk-test", dir.c_str(), "tmpfs", 0, "size=256k,mode=0700") != 0) {
    GTEST_SKIP() << "cannot mount a small tmpfs here: " << std::strerror(errno);
  }
  struct Unmount {
    std::string dir;
    ~Unmount() { umount2(dir.c_str(), MNT_DETACH); }
  } unmount{dir};
  KvDiskOptions o = Options(dir + "/tier");
  o.budget_bytes = 40 * (4096 + 4 * 4096);  // 800 KiB of extents on 256 KiB of disk
  o.allow_buffered = true;
  auto disk = KvDisk::Open(o);
  ASSERT_TRUE(disk.ok()) << disk.status();
  std::vector<std::shared_ptr<uint8_t>> blocks;
  std::vector<ExtentIo> writes;
  for (uint64_t e = 0; e < 20; ++e) {
    blocks.push_back((*disk)->AllocateBlock());
    Fill(blocks.back().get(), 16000, 20 + static_cast<uint32_t>(e));
    writes.push_back({e, blocks.back().get(), 16000, {}});
  }
  const absl::Status status = (*disk)->Write(writes);
  EXPECT_TRUE(absl::IsResourceExhausted(status)) << status;
  int written = 0;
  for (const ExtentIo& w : writes) {
    if (w.status.ok()) {
      ++written;
    } else {
      EXPECT_TRUE(absl::IsResourceExhausted(w.status)) << w.status;
    }
  }
  EXPECT_GT(written, 0);
  EXPECT_LT(written, 20);
  EXPECT_GT((*disk)->stats().write_errors, 0u);
  for (const ExtentIo& w : writes) {
    if (!w.status.ok()) continue;
    auto back = (*disk)->AllocateBlock();
    ExtentIo r{w.extent, back.get(), 0, {}};
    ASSERT_TRUE((*disk)->Read({&r, 1}).ok()) << r.status;
    EXPECT_EQ(std::memcmp(back.get(), w.data, 16000), 0) << "block " << w.extent;
  }
}

}  // namespace
}  // namespace strata
