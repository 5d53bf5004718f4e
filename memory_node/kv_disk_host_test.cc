// A node's disk tier across configurations: moves run only for the epoch and tier id that
// Open returned, never before an Open or after a Close, and never for a tier a
// reconfiguration replaced (even within one epoch); a reopened tier is empty (the blocks of
// the previous index are never served); counters add up over every tier the node opened.
#include "memory_node/kv_disk_host.h"

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "memory_node/testing/disk_test_env.h"

namespace strata {
namespace {

constexpr int kBlockTokens = 16;

class KvDiskHostTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = testing_env::IoUringUnavailable(); !why.empty())
      GTEST_SKIP() << why;
    KvStoreConfig c;
    c.num_layers = 2;
    c.num_kv_heads = 2;
    c.head_dim = 32;
    c.num_slots = 64;
    store_ = testing_env::RandomStore(c, 5);
    options_.dir = testing_env::FreshDir("kv_disk_host");
    options_.budget_bytes = 8 << 20;
  }
  static KvMove Move(KvMove::Kind kind, uint64_t extent, uint64_t key, int32_t first_slot) {
    KvMove m{kind, extent, key, {}};
    for (int i = 0; i < kBlockTokens; ++i) m.slots.push_back(first_slot + i);
    return m;
  }
  // Opens `host`'s tier for epoch 1 (`*ack`) and saves block `key` from slots 0-15 to
  // extent 0.
  void OpenWithBlockSaved(KvDiskHost& host, uint64_t key, DiskTierAck* ack) {
    auto info = host.Open(1, store_.get(), kBlockTokens, "model a");
    ASSERT_TRUE(info.ok()) << info.status();
    *ack = *info;
    const KvMove save = Move(KvMove::Kind::kSave, 0, key, 0);
    ASSERT_TRUE(AllOk(host.Move(1, ack->tier, {&save, 1})));
  }
  static bool AllOk(const absl::StatusOr<std::vector<absl::Status>>& out) {
    if (!out.ok()) return false;
    for (const absl::Status& s : *out) {
      if (!s.ok()) return false;
    }
    return true;
  }

  KvDiskTierOptions options_;
  std::unique_ptr<KvStore> store_;
};

TEST_F(KvDiskHostTest, MovesRunOnlyForTheEpochThatOpenedTheTier) {
  KvDiskHost host(options_);
  ASSERT_TRUE(host.enabled());
  EXPECT_FALSE(host.stats().has_value());
  const KvMove save = Move(KvMove::Kind::kSave, 0, 77, 0);
  EXPECT_TRUE(absl::IsFailedPrecondition(host.Move(0, 0, {&save, 1}).status()));  // not open
  auto info = host.Open(3, store_.get(), kBlockTokens, "model a");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_GT(info->extents, 0u);
  EXPECT_NE(info->tier, 0u);
  EXPECT_EQ(info->block_bytes, host.stats()->block_bytes);
  EXPECT_TRUE(absl::IsFailedPrecondition(host.Move(2, info->tier, {&save, 1}).status()));
  EXPECT_TRUE(absl::IsFailedPrecondition(host.Move(3, info->tier + 1, {&save, 1}).status()));
  EXPECT_TRUE(AllOk(host.Move(3, info->tier, {&save, 1})));
  const KvMove load = Move(KvMove::Kind::kLoad, 0, 77, 32);
  EXPECT_TRUE(AllOk(host.Move(3, info->tier, {&load, 1})));
  // Reconfigured within the epoch: the old tier's moves are refused.
  auto again = host.Open(3, store_.get(), kBlockTokens, "model a");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_NE(again->tier, info->tier);
  EXPECT_TRUE(absl::IsFailedPrecondition(host.Move(3, info->tier, {&load, 1}).status()));
  // A caller that has given up (its deadline passed while the moves waited): nothing runs.
  const uint64_t loads = host.stats()->loads;
  EXPECT_TRUE(absl::IsDeadlineExceeded(
      host.Move(3, again->tier, {&load, 1}, absl::Now() - absl::Seconds(1)).status()));
  EXPECT_EQ(host.stats()->loads, loads);
  host.Close();
  EXPECT_TRUE(absl::IsFailedPrecondition(host.Move(3, again->tier, {&load, 1}).status()));
}

TEST_F(KvDiskHostTest, AReopenedTierIsEmptyAndCountersAddUpOverTiers) {
  KvDiskHost host(options_);
  auto first = host.Open(1, store_.get(), kBlockTokens, "model a");
  ASSERT_TRUE(first.ok()) << first.status();
  const KvMove save = Move(KvMove::Kind::kSave, 0, 77, 0);
  ASSERT_TRUE(AllOk(host.Move(1, first->tier, {&save, 1})));
  const uint64_t written = host.stats()->bytes_written;
  EXPECT_GT(written, 0u);
  EXPECT_EQ(host.stats()->used_extents, 1u);
  // The next configuration: the block saved for the old index must not come back.
  auto second = host.Open(2, store_.get(), kBlockTokens, "model a");
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(host.stats()->used_extents, 0u);
  const KvMove load = Move(KvMove::Kind::kLoad, 0, 77, 32);
  auto out = host.Move(2, second->tier, {&load, 1});
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 1u);
  EXPECT_FALSE((*out)[0].ok()) << "a block of the previous tier was served";
  ASSERT_TRUE(AllOk(host.Move(2, second->tier, {&save, 1})));
  const KvDiskTierStats s = *host.stats();
  EXPECT_EQ(s.saves, 2u);
  EXPECT_EQ(s.loads, 1u);
  EXPECT_EQ(s.failed_loads, 1u);
  EXPECT_EQ(s.bytes_written, 2 * written);
  // Closed: the counters stay.
  host.Close();
  ASSERT_TRUE(host.stats().has_value());
  EXPECT_EQ(host.stats()->saves, 2u);
  EXPECT_EQ(host.stats()->used_extents, 0u);
}

// Layer-wise pre-loading: a load whose ticket a step already gave up on is refused at once
// (it would be reported failed whatever it read), and the other moves of its batch run.
TEST_F(KvDiskHostTest, LoadsOfATicketAStepGaveUpOnAreRefused) {
  KvDiskHost host(options_);
  auto info = host.Open(3, store_.get(), kBlockTokens, "model a");
  ASSERT_TRUE(info.ok()) << info.status();
  const KvMove save = Move(KvMove::Kind::kSave, 0, 77, 0);
  ASSERT_TRUE(AllOk(host.Move(3, info->tier, {&save, 1})));
  ASSERT_TRUE(host.gate().Expect(5, absl::Now() + absl::Milliseconds(20)));
  const uint64_t tickets[] = {5};
  host.gate().Wait(tickets, 0);  // gives up at the deadline
  ASSERT_EQ(host.gate().stats().abandoned, 1u);
  KvMove given_up = Move(KvMove::Kind::kLoad, 0, 77, 32);
  given_up.ticket = 5;
  KvMove other = Move(KvMove::Kind::kLoad, 0, 77, 48);
  other.ticket = 6;
  const std::vector<KvMove> moves = {given_up, other};
  auto out = host.Move(3, info->tier, moves, absl::Now() + absl::Seconds(60));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(absl::IsDeadlineExceeded((*out)[0])) << (*out)[0];
  EXPECT_TRUE((*out)[1].ok()) << (*out)[1];
  EXPECT_EQ(host.stats()->loads, 1u) << "the refused load ran";
}

// A metrics scrape (stats()) that holds the tier while the scheduler reconfigures the node:
// the reopened tier still takes the directory (its lock is the old tier's until that goes),
// every time. It used to fail now and then, and the node ran without a disk tier.
TEST_F(KvDiskHostTest, ReopeningNeverRacesAReaderOfItsCounters) {
  KvDiskHost host(options_);
  std::atomic<bool> stop{false};
  std::thread reader([&] {
    while (!stop.load()) (void)host.stats();
  });
  int failed = 0;
  absl::Status first;
  for (int i = 0; i < 300; ++i) {
    auto info = host.Open(1, store_.get(), kBlockTokens, "model a");
    if (!info.ok() && failed++ == 0) first = info.status();
  }
  stop.store(true);
  reader.join();
  EXPECT_EQ(failed, 0) << first;
}

// A load (a step may wait for it) does not wait behind a long batch of saves: it runs
// between two turns of the batch, which then goes on and saves every block.
TEST_F(KvDiskHostTest, ALoadGoesBeforeTheRestOfALongBatchOfSaves) {
  KvStoreConfig c;
  c.num_layers = 4;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.num_slots = 64;
  store_ = testing_env::RandomStore(c, 6);
  options_.budget_bytes = uint64_t{96} << 20;  // 300 blocks of 256 KiB
  KvDiskHost host(options_);
  DiskTierAck info;
  ASSERT_NO_FATAL_FAILURE(OpenWithBlockSaved(host, 7, &info));
  constexpr int kSaves = 256;
  std::vector<KvMove> saves;
  for (int i = 1; i <= kSaves; ++i) saves.push_back(Move(KvMove::Kind::kSave, i, 100 + i, 16));
  std::atomic<bool> saves_ok{false};
  std::thread saver([&] { saves_ok = AllOk(host.Move(1, info.tier, saves)); });
  // Once the batch has saved its first turn of blocks, a load comes.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (host.stats()->saves < 2 && absl::Now() < deadline) absl::SleepFor(absl::Microseconds(50));
  const KvMove load = Move(KvMove::Kind::kLoad, 0, 7, 32);
  EXPECT_TRUE(AllOk(host.Move(1, info.tier, {&load, 1})));
  const uint64_t saved_by_then = host.stats()->saves - 1;
  saver.join();
  EXPECT_LT(saved_by_then, static_cast<uint64_t>(kSaves)) << "the load waited for every save";
  EXPECT_TRUE(saves_ok.load());
  EXPECT_EQ(host.stats()->saves, static_cast<uint64_t>(kSaves) + 1);
  EXPECT_EQ(host.stats()->failed_saves, 0u);
  // What the load brought is the block saved.
  const size_t row = static_cast<size_t>(c.num_kv_heads) * c.head_dim;
  for (int layer = 0; layer < c.num_layers; ++layer) {
    for (const uint16_t* base : {store_->k(layer), store_->v(layer)}) {
      EXPECT_EQ(std::memcmp(base + 32 * row, base, kBlockTokens * row * sizeof(uint16_t)), 0)
          << "layer " << layer;
    }
  }
}

// Loads that keep coming hold a batch of saves back only until the batch's own deadline:
// it then gives up while the loads go on, the saves it had not run failing
// DeadlineExceeded, and the same saves run in full once the loads stop.
TEST_F(KvDiskHostTest, SavesHeldBackByLoadsGiveUpAtTheirOwnDeadline) {
  KvDiskHost host(options_);
  DiskTierAck info;
  ASSERT_NO_FATAL_FAILURE(OpenWithBlockSaved(host, 7, &info));
  // Three threads load the saved block into their own slots, 64 times a batch and batch
  // after batch, so that one of them always waits for the host, until told to stop (or for
  // 20 s at most).
  std::atomic<bool> stop{false};
  std::atomic<int> loaders_running{3};
  std::atomic<int> failed_loads{0};
  std::vector<std::thread> loaders;
  for (int t = 0; t < 3; ++t) {
    loaders.emplace_back([&, t] {
      const std::vector<KvMove> loads(64, Move(KvMove::Kind::kLoad, 0, 7, kBlockTokens * (t + 1)));
      const absl::Time until = absl::Now() + absl::Seconds(20);
      while (!stop.load() && absl::Now() < until) {
        if (!AllOk(host.Move(1, info.tier, loads))) ++failed_loads;
      }
      --loaders_running;
    });
  }
  const absl::Time started = absl::Now() + absl::Seconds(10);
  while (host.stats()->loads < 8 && absl::Now() < started) absl::SleepFor(absl::Milliseconds(1));
  constexpr int kSaves = 512;  // 32 turns of kMovesPerTurn
  std::vector<KvMove> saves;
  for (int i = 1; i <= kSaves; ++i) saves.push_back(Move(KvMove::Kind::kSave, i, 1000 + i, 0));
  const auto held = host.Move(1, info.tier, saves, absl::Now() + absl::Milliseconds(300));
  const int running_at_return = loaders_running.load();
  stop = true;
  for (std::thread& t : loaders) t.join();
  EXPECT_GT(running_at_return, 0) << "the saves waited until the loads stopped";
  int not_run = 0;
  if (held.ok()) {
    for (const absl::Status& s : *held) {
      if (s.ok()) continue;
      EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
      ++not_run;
    }
  } else {
    EXPECT_TRUE(absl::IsDeadlineExceeded(held.status())) << held.status();
    not_run = kSaves;
  }
  EXPECT_GT(not_run, 0) << "every save ran while the loads kept coming";
  EXPECT_EQ(failed_loads.load(), 0);
  EXPECT_TRUE(AllOk(host.Move(1, info.tier, saves)));
  EXPECT_EQ(host.stats()->failed_saves, 0u);
}

TEST_F(KvDiskHostTest, ANodeWithoutADirectoryOpensNoTier) {
  KvDiskHost host(KvDiskTierOptions{});
  EXPECT_FALSE(host.enabled());
  EXPECT_TRUE(absl::IsFailedPrecondition(host.Open(1, store_.get(), kBlockTokens, "m").status()));
  EXPECT_FALSE(host.stats().has_value());
}

}  // namespace
}  // namespace strata
