// Blocks of KV between a real KvStore and the block file: saved from some slots and loaded
// into others, every layer's K and V rows come back bit for bit (whole blocks and a partial
// one); a layer damaged on disk fails alone and leaves its target slots untouched while the
// other layers load; a wrong key or a slot outside the store is refused.
#include "memory_node/kv_block_io.h"

#include <fcntl.h>
#include <liburing.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>

#include "gtest/gtest.h"
#include "memory_node/testing/disk_test_env.h"

namespace strata {
namespace {

constexpr int kBlockTokens = 16;

class KvBlockIoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = testing_env::IoUringUnavailable(); !why.empty())
      GTEST_SKIP() << why;
    KvStoreConfig c;
    c.num_layers = 3;
    c.num_kv_heads = 2;
    c.head_dim = 16;
    c.num_slots = 200;
    store_ = testing_env::RandomStore(c, 3);
    dir_ = testing_env::FreshDir("kv_block_io");
    KvDiskOptions o = KvBlockIo::DiskOptions(c, kBlockTokens);
    o.dir = dir_;
    o.fingerprint = "kv_block_io_test";
    o.budget_bytes = 8 * (4096 + o.block_bytes + 4096 * c.num_layers);
    disk_ = std::move(*KvDisk::Open(o));
    io_ = std::make_unique<KvBlockIo>(store_.get(), disk_.get(), kBlockTokens);
  }

  // Whether layer `l`'s K and V rows of slots `a` equal those of slots `b`.
  bool SameRows(int l, const std::vector<int32_t>& a, const std::vector<int32_t>& b) const {
    const int64_t row = store_->row_elements();
    for (size_t i = 0; i < a.size(); ++i) {
      if (std::memcmp(store_->k(l) + a[i] * row, store_->k(l) + b[i] * row, row * 2) != 0 ||
          std::memcmp(store_->v(l) + a[i] * row, store_->v(l) + b[i] * row, row * 2) != 0) {
        return false;
      }
    }
    return true;
  }
  static std::vector<int32_t> Slots(int32_t first, int n, int32_t stride = 1) {
    std::vector<int32_t> s;
    for (int i = 0; i < n; ++i) s.push_back(first + i * stride);
    return s;
  }

  std::string dir_;
  std::unique_ptr<KvStore> store_;
  std::unique_ptr<KvDisk> disk_;
  std::unique_ptr<KvBlockIo> io_;
};

TEST_F(KvBlockIoTest, BlocksComeBackIntoOtherSlots) {
  const auto from = Slots(10, kBlockTokens, 3);
  const auto to = Slots(120, kBlockTokens);
  ASSERT_TRUE(io_->Save(4, 99, from).ok());
  for (int l = 0; l < 3; ++l) ASSERT_FALSE(SameRows(l, from, to)) << "the test data repeats";
  const int all[] = {0, 1, 2};
  ASSERT_TRUE(io_->LoadLayers(4, 99, all, to).ok());
  for (int l = 0; l < 3; ++l) EXPECT_TRUE(SameRows(l, from, to)) << "layer " << l;
  // A partial block (5 tokens), loaded one layer at a time in another order.
  const auto part_from = Slots(60, 5, 7);
  const auto part_to = Slots(170, 5);
  ASSERT_TRUE(io_->Save(6, 7, part_from).ok());
  for (int l : {2, 0, 1}) {
    const int one[] = {l};
    ASSERT_TRUE(io_->LoadLayers(6, 7, one, part_to).ok()) << "layer " << l;
    EXPECT_TRUE(SameRows(l, part_from, part_to)) << "layer " << l;
  }
  // Loading it as if it held another number of tokens is refused, whatever the layer.
  for (int l : {0, 1, 2}) {
    const int one[] = {l};
    EXPECT_TRUE(absl::IsDataLoss(io_->LoadLayers(6, 7, one, Slots(170, 6)))) << "layer " << l;
  }
}

TEST_F(KvBlockIoTest, ADamagedLayerFailsAloneAndWritesNothing) {
  const auto from = Slots(0, kBlockTokens);
  const auto to = Slots(100, kBlockTokens);
  ASSERT_TRUE(io_->Save(1, 5, from).ok());
  // Flip a byte of layer 1's section on disk.
  const int fd = open((dir_ + "/blocks").c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  const off_t extent = static_cast<off_t>(4096 + disk_->block_bytes());
  const off_t at = extent + 4096 + static_cast<off_t>(disk_->section_bytes()) + 40;
  uint8_t byte = 0;
  ASSERT_EQ(pread(fd, &byte, 1, at), 1);
  byte ^= 1;
  ASSERT_EQ(pwrite(fd, &byte, 1, at), 1);
  close(fd);
  const int64_t row = store_->row_elements();
  std::vector<uint16_t> before(store_->k(1) + to[0] * row, store_->k(1) + (to.back() + 1) * row);
  const int all[] = {0, 1, 2};
  std::vector<absl::Status> each;
  EXPECT_TRUE(absl::IsDataLoss(io_->LoadLayers(1, 5, all, to, &each)));
  ASSERT_EQ(each.size(), 3u);
  EXPECT_TRUE(each[0].ok()) << each[0];
  EXPECT_TRUE(absl::IsDataLoss(each[1])) << each[1];
  EXPECT_TRUE(each[2].ok()) << each[2];
  EXPECT_TRUE(SameRows(0, from, to));
  EXPECT_TRUE(SameRows(2, from, to));
  EXPECT_TRUE(std::equal(before.begin(), before.end(), store_->k(1) + to[0] * row))
      << "a damaged layer was written into the store";
}

TEST_F(KvBlockIoTest, WrongKeysAndSlotsAreRefused) {
  const auto slots = Slots(0, 4);
  ASSERT_TRUE(io_->Save(2, 11, slots).ok());
  const int one[] = {0};
  EXPECT_TRUE(absl::IsDataLoss(io_->LoadLayers(2, 12, one, slots)));
  EXPECT_TRUE(absl::IsNotFound(io_->LoadLayers(3, 11, one, slots)));
  EXPECT_TRUE(absl::IsInvalidArgument(io_->Save(2, 11, Slots(199, 2))));
  EXPECT_TRUE(absl::IsInvalidArgument(io_->Save(2, 11, Slots(0, kBlockTokens + 1))));
  const int bad_layer[] = {3};
  EXPECT_TRUE(absl::IsInvalidArgument(io_->LoadLayers(2, 11, bad_layer, slots)));
}

}  // namespace
}  // namespace strata
