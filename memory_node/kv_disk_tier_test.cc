// The disk tier a memory node runs, over a real KvStore and block file: a batch of moves
// larger than the staging buffers saves every block, loads bring each block's rows back
// bit for bit into other slots, each move gets its own outcome in order (a wrong key is
// DataLoss, a dropped extent reads as never written, a move naming an extent or slot
// outside the tier is InvalidArgument and harms no other move), and the counters add up.
// Under a ticket (layer-wise pre-loading) loads come back layer by layer through the gate.
#include "memory_node/kv_disk_tier.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "memory_node/testing/disk_test_env.h"

namespace strata {
namespace {

constexpr int kBlockTokens = 16;

class KvDiskTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = testing_env::IoUringUnavailable(); !why.empty())
      GTEST_SKIP() << why;
    KvStoreConfig c;
    c.num_layers = 4;
    c.num_kv_heads = 2;
    c.head_dim = 32;
    c.num_slots = 256;
    store_ = testing_env::RandomStore(c, 11);
    options_.dir = testing_env::FreshDir("kv_disk_tier");
    options_.budget_bytes = 64 << 20;
    options_.staging_bytes = 1;  // one block at a time: batches split
    auto tier = KvDiskTier::Open(options_, store_.get(), kBlockTokens, "kv_disk_tier_test");
    ASSERT_TRUE(tier.ok()) << tier.status();
    tier_ = std::move(*tier);
  }

  static std::vector<int32_t> Slots(int32_t first) {
    std::vector<int32_t> s(kBlockTokens);
    for (int i = 0; i < kBlockTokens; ++i) s[i] = first + i;
    return s;
  }
  // A copy of every layer's K and V rows of `slots`, taken before anything moves: the
  // reference the loads are checked against.
  std::vector<uint16_t> Rows(const std::vector<int32_t>& slots) const {
    std::vector<uint16_t> out;
    const int64_t row = store_->row_elements();
    for (int l = 0; l < store_->config().num_layers; ++l) {
      for (int32_t s : slots) {
        out.insert(out.end(), store_->k(l) + s * row, store_->k(l) + (s + 1) * row);
        out.insert(out.end(), store_->v(l) + s * row, store_->v(l) + (s + 1) * row);
      }
    }
    return out;
  }

  KvDiskTierOptions options_;
  std::unique_ptr<KvStore> store_;
  std::unique_ptr<KvDiskTier> tier_;
};

TEST_F(KvDiskTierTest, SavesAndLoadsBlocksBitForBitInBatchesLargerThanTheStaging) {
  std::vector<KvMove> saves;
  std::vector<std::vector<uint16_t>> saved;
  for (int b = 0; b < 6; ++b) {
    saves.push_back({KvMove::Kind::kSave, static_cast<uint64_t>(b), 1000u + b, Slots(16 * b)});
    saved.push_back(Rows(Slots(16 * b)));
  }
  for (const absl::Status& s : tier_->Execute(saves)) EXPECT_TRUE(s.ok()) << s;
  // Load them back, in another order, into other slots.
  std::vector<KvMove> loads;
  for (int b = 5; b >= 0; --b) {
    loads.push_back(
        {KvMove::Kind::kLoad, static_cast<uint64_t>(b), 1000u + b, Slots(128 + 16 * (5 - b))});
  }
  for (const absl::Status& s : tier_->Execute(loads)) EXPECT_TRUE(s.ok()) << s;
  for (int b = 0; b < 6; ++b) {
    EXPECT_EQ(Rows(Slots(128 + 16 * (5 - b))), saved[b]) << "block " << b;
  }
  const KvDiskTierStats st = tier_->stats();
  EXPECT_EQ(st.saves, 6u);
  EXPECT_EQ(st.loads, 6u);
  EXPECT_EQ(st.failed_saves + st.failed_loads, 0u);
  EXPECT_EQ(st.used_extents, 6u);
  EXPECT_EQ(st.staging_bytes, tier_->block_bytes());
  EXPECT_GE(st.bytes_written, 6 * saved[0].size() * 2);
  EXPECT_GE(st.bytes_read, 6 * saved[0].size() * 2);
}

TEST_F(KvDiskTierTest, EachMoveHasItsOwnOutcomeInOrder) {
  const std::vector<uint16_t> before = Rows(Slots(200));
  const std::vector<KvMove> moves = {
      {KvMove::Kind::kSave, 0, 7, Slots(0)},
      {KvMove::Kind::kSave, 1, 8, Slots(16)},
      {KvMove::Kind::kSave, tier_->extents(), 9, Slots(32)},  // no such extent
      {KvMove::Kind::kSave, 2, 9, {0, 1, 256}},               // no such slot
      {KvMove::Kind::kLoad, 0, 99, Slots(200)},               // the wrong key
      {KvMove::Kind::kDrop, 1, 0, {}},
      {KvMove::Kind::kLoad, 1, 8, Slots(200)},  // dropped: never written
      {KvMove::Kind::kLoad, 0, 7, Slots(224)},
  };
  const std::vector<uint16_t> block0 = Rows(Slots(0));
  const std::vector<absl::Status> out = tier_->Execute(moves);
  ASSERT_EQ(out.size(), moves.size());
  EXPECT_TRUE(out[0].ok()) << out[0];
  EXPECT_TRUE(out[1].ok()) << out[1];
  EXPECT_TRUE(absl::IsInvalidArgument(out[2])) << out[2];
  EXPECT_TRUE(absl::IsInvalidArgument(out[3])) << out[3];
  EXPECT_TRUE(absl::IsDataLoss(out[4])) << out[4];
  EXPECT_TRUE(out[5].ok()) << out[5];
  EXPECT_FALSE(out[6].ok());
  EXPECT_TRUE(out[7].ok()) << out[7];
  EXPECT_EQ(Rows(Slots(200)), before) << "a failed load wrote into its slots";
  EXPECT_EQ(Rows(Slots(224)), block0);
  const KvDiskTierStats st = tier_->stats();
  EXPECT_EQ(st.saves, 4u);
  EXPECT_EQ(st.failed_saves, 2u);
  EXPECT_EQ(st.loads, 3u);
  EXPECT_EQ(st.failed_loads, 2u);
  EXPECT_EQ(st.drops, 1u);
  EXPECT_EQ(st.used_extents, 1u);
  EXPECT_EQ(st.checksum_failures, 0u);  // a wrong key is not a damaged block
}

// A tier opened on a directory that holds blocks starts empty: the scheduler's index of it
// is gone with the old configuration.
TEST_F(KvDiskTierTest, ReopeningStartsEmpty) {
  for (const absl::Status& s : tier_->Execute({{{KvMove::Kind::kSave, 0, 5, Slots(0)}}})) {
    ASSERT_TRUE(s.ok()) << s;
  }
  tier_.reset();
  auto tier = KvDiskTier::Open(options_, store_.get(), kBlockTokens, "kv_disk_tier_test");
  ASSERT_TRUE(tier.ok()) << tier.status();
  const std::vector<absl::Status> out =
      (*tier)->Execute({{{KvMove::Kind::kLoad, 0, 5, Slots(100)}}});
  EXPECT_FALSE(out[0].ok()) << "a block of the old index was served";
  EXPECT_EQ((*tier)->stats().used_extents, 0u);
}

// Moves whose caller's deadline has passed (it has given up, and may reuse their slots and
// extents) touch nothing: no slot is gathered for a save nor written by a load.
TEST_F(KvDiskTierTest, MovesPastTheCallersDeadlineTouchNoSlot) {
  for (const absl::Status& s : tier_->Execute({{{KvMove::Kind::kSave, 0, 5, Slots(0)}}})) {
    ASSERT_TRUE(s.ok()) << s;
  }
  const absl::Time gone = absl::Now() - absl::Seconds(1);
  const std::vector<uint16_t> before = Rows(Slots(100));
  std::vector<absl::Status> out = tier_->Execute({{{KvMove::Kind::kLoad, 0, 5, Slots(100)}}}, gone);
  EXPECT_TRUE(absl::IsDeadlineExceeded(out[0])) << out[0];
  EXPECT_EQ(Rows(Slots(100)), before) << "a late load wrote its slots";
  out = tier_->Execute({{{KvMove::Kind::kSave, 1, 6, Slots(16)}}}, gone);
  EXPECT_TRUE(absl::IsDeadlineExceeded(out[0])) << out[0];
  EXPECT_EQ(tier_->stats().used_extents, 1u) << "a late save was written";
  // In time, the same load works.
  out =
      tier_->Execute({{{KvMove::Kind::kLoad, 0, 5, Slots(100)}}}, absl::Now() + absl::Seconds(60));
  EXPECT_TRUE(out[0].ok()) << out[0];
  EXPECT_EQ(Rows(Slots(100)), Rows(Slots(0)));
}

// Layer-wise pre-loading: loads under a ticket come back layer by layer, and the gate lets
// a step attend layer l only once every block of the ticket has layer l in DRAM (checked
// by reading that layer the moment the gate opens); a block that fails a section fails
// its ticket and releases the step; loads without a ticket still run whole, alongside.
class KvDiskTierByLayerTest : public KvDiskTierTest {
 protected:
  void SetUp() override {
    KvDiskTierTest::SetUp();
    if (IsSkipped()) return;
    tier_.reset();
    options_.gate = &gate_;
    options_.staging_bytes = 2 * 16384;  // two blocks at a time: a ticket spans batches
    auto tier = KvDiskTier::Open(options_, store_.get(), kBlockTokens, "kv_disk_tier_test");
    ASSERT_TRUE(tier.ok()) << tier.status();
    tier_ = std::move(*tier);
  }
  // One layer's K and V rows of `slots`.
  std::vector<uint16_t> LayerRows(const std::vector<int32_t>& slots, int l) const {
    std::vector<uint16_t> out;
    const int64_t row = store_->row_elements();
    for (int32_t s : slots) {
      out.insert(out.end(), store_->k(l) + s * row, store_->k(l) + (s + 1) * row);
      out.insert(out.end(), store_->v(l) + s * row, store_->v(l) + (s + 1) * row);
    }
    return out;
  }
  LoadGate gate_;
};

TEST_F(KvDiskTierByLayerTest, AStepSeesEachLayerOnlyOnceItIsInDram) {
  const int layers = store_->config().num_layers;
  std::vector<KvMove> saves;
  std::vector<std::vector<int32_t>> from, to;
  for (int b = 0; b < 5; ++b) {
    from.push_back(Slots(16 * b));
    to.push_back(Slots(128 + 16 * b));
    saves.push_back({KvMove::Kind::kSave, static_cast<uint64_t>(b), 500u + b, from.back()});
  }
  for (const absl::Status& s : tier_->Execute(saves)) ASSERT_TRUE(s.ok()) << s;
  std::vector<std::vector<std::vector<uint16_t>>> want(5);  // [block][layer]
  for (int b = 0; b < 5; ++b) {
    for (int l = 0; l < layers; ++l) want[b].push_back(LayerRows(from[b], l));
  }
  // Four blocks under ticket 77 (two staging batches), one whole load without a ticket.
  std::vector<KvMove> loads;
  for (int b = 0; b < 4; ++b) {
    loads.push_back({KvMove::Kind::kLoad, static_cast<uint64_t>(b), 500u + b, to[b], 77});
  }
  loads.push_back({KvMove::Kind::kLoad, 4, 504, to[4], 0});
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  ASSERT_TRUE(gate_.Expect(77, deadline));
  std::vector<bool> layer_right(layers, false);
  std::thread step([&] {
    const uint64_t tickets[] = {77};
    for (int l = 0; l < layers; ++l) {
      gate_.Wait(tickets, l);
      bool right = true;
      for (int b = 0; b < 4; ++b) right = right && LayerRows(to[b], l) == want[b][l];
      layer_right[l] = right;
    }
  });
  const std::vector<absl::Status> out = tier_->Execute(loads, deadline);
  step.join();
  for (const absl::Status& s : out) EXPECT_TRUE(s.ok()) << s;
  for (int l = 0; l < layers; ++l) EXPECT_TRUE(layer_right[l]) << "layer " << l;
  for (int b = 0; b < 5; ++b) EXPECT_EQ(Rows(to[b]), Rows(from[b])) << "block " << b;
  EXPECT_EQ(gate_.stats().abandoned, 0u);
  EXPECT_EQ(tier_->stats().loads, 5u);
}

TEST_F(KvDiskTierByLayerTest, ADamagedSectionFailsItsTicketAndReleasesTheStep) {
  std::vector<KvMove> saves;
  for (int b = 0; b < 2; ++b) {
    saves.push_back({KvMove::Kind::kSave, static_cast<uint64_t>(b), 600u + b, Slots(16 * b)});
  }
  for (const absl::Status& s : tier_->Execute(saves)) ASSERT_TRUE(s.ok()) << s;
  // Flip a byte of extent 1's layer-2 section behind the tier's back.
  const uint64_t section = tier_->block_bytes() / store_->config().num_layers;
  const off_t at = static_cast<off_t>(1 * (4096 + tier_->block_bytes()) + 4096 + 2 * section + 9);
  const int fd = open((options_.dir + "/blocks").c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  uint8_t byte = 0;
  ASSERT_EQ(pread(fd, &byte, 1, at), 1);
  byte ^= 0x10;
  ASSERT_EQ(pwrite(fd, &byte, 1, at), 1);
  fsync(fd);
  close(fd);
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  ASSERT_TRUE(gate_.Expect(88, deadline));
  std::thread step([&] {
    const uint64_t tickets[] = {88};
    gate_.Wait(tickets, store_->config().num_layers - 1);  // returns when the load is over
  });
  const std::vector<absl::Status> out =
      tier_->Execute({{{KvMove::Kind::kLoad, 0, 600, Slots(128), 88},
                       {KvMove::Kind::kLoad, 1, 601, Slots(144), 88}}},
                     deadline);
  step.join();
  EXPECT_TRUE(out[0].ok()) << out[0];
  EXPECT_TRUE(absl::IsDataLoss(out[1])) << out[1];
  EXPECT_EQ(tier_->stats().checksum_failures, 1u);
  EXPECT_EQ(gate_.stats().abandoned, 0u);
}

// A step that gave up waiting (its deadline passed) read whatever was there: the load must
// then be reported failed even if its reads succeed.
TEST_F(KvDiskTierByLayerTest, ALoadAStepGaveUpOnIsReportedFailed) {
  for (const absl::Status& s : tier_->Execute({{{KvMove::Kind::kSave, 0, 700, Slots(0)}}})) {
    ASSERT_TRUE(s.ok()) << s;
  }
  ASSERT_TRUE(gate_.Expect(99, absl::Now() + absl::Milliseconds(20)));
  const uint64_t tickets[] = {99};
  gate_.Wait(tickets, 0);  // gives up at the deadline
  const std::vector<absl::Status> out = tier_->Execute(
      {{{KvMove::Kind::kLoad, 0, 700, Slots(128), 99}}}, absl::Now() + absl::Seconds(60));
  EXPECT_TRUE(absl::IsDeadlineExceeded(out[0])) << out[0];
}

}  // namespace
}  // namespace strata
