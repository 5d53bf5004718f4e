// The scheduler's ledger of disk extents: saves, lookups, loads, eviction of the least
// recently used ready block, pinning while a block is read, failed writes and failed reads
// (dropped, extent freed), the TTL, hash collisions as misses; and random operations
// against a plain model of which blocks are where, with the ledger's invariants checked
// after each.
#include "server/disk_ledger.h"

#include <map>
#include <random>
#include <set>

#include "gtest/gtest.h"

namespace strata {
namespace {

constexpr int kBlock = 4;

std::vector<int32_t> Tokens(int blocks, int seed) {
  std::vector<int32_t> t;
  for (int i = 0; i < blocks * kBlock; ++i) t.push_back(seed * 1000 + i);
  return t;
}

const absl::Time t0 = absl::FromUnixSeconds(1000);

TEST(DiskLedgerTest, SaveMatchLoad) {
  DiskLedger ledger(3, kBlock, absl::Hours(1));
  const auto tokens = Tokens(3, 1);
  const std::vector<uint64_t> hashes = {11, 12, 13};
  auto e0 = ledger.BeginSave(11, tokens.data(), t0);
  auto e1 = ledger.BeginSave(12, tokens.data() + kBlock, t0);
  ASSERT_TRUE(e0 && e1);
  EXPECT_NE(*e0, *e1);
  EXPECT_FALSE(ledger.BeginSave(11, tokens.data(), t0)) << "saved twice";
  EXPECT_EQ(ledger.Match(tokens, hashes, 0, 3), 0) << "a block being written is not a hit";
  ledger.SaveDone(11, true, t0);
  ledger.SaveDone(12, true, t0);
  EXPECT_EQ(ledger.Match(tokens, hashes, 0, 3), 2);
  EXPECT_EQ(ledger.Match(tokens, hashes, 1, 3), 1);
  EXPECT_EQ(ledger.Match(tokens, hashes, 0, 1), 1);
  // Another prefix with the same hashes (a collision): a miss.
  EXPECT_EQ(ledger.Match(Tokens(3, 2), hashes, 0, 3), 0);
  auto read = ledger.BeginLoad(11, t0);
  ASSERT_TRUE(read);
  EXPECT_EQ(*read, *e0);
  // Two requests sharing the prefix read it at once; it is ready again when both are done.
  EXPECT_TRUE(ledger.BeginLoad(11, t0));
  EXPECT_EQ(ledger.Match(tokens, hashes, 0, 3), 2) << "a block being read is still a hit";
  EXPECT_FALSE(ledger.LoadDone(11, absl::OkStatus(), t0));
  EXPECT_EQ(ledger.Stats().reading, 1);
  EXPECT_FALSE(ledger.LoadDone(11, absl::OkStatus(), t0));
  EXPECT_EQ(ledger.Stats().reading, 0);
  EXPECT_TRUE(ledger.CheckInvariants());
  EXPECT_EQ(ledger.Stats().ready, 2);
  EXPECT_EQ(ledger.Stats().free, 1);
}

TEST(DiskLedgerTest, EvictsTheLeastRecentlyUsedReadyBlockNeverAPinnedOne) {
  DiskLedger ledger(2, kBlock, absl::Hours(1));
  const auto a = Tokens(1, 1), b = Tokens(1, 2), c = Tokens(1, 3), d = Tokens(1, 4);
  ASSERT_TRUE(ledger.BeginSave(1, a.data(), t0));
  ledger.SaveDone(1, true, t0);
  ASSERT_TRUE(ledger.BeginSave(2, b.data(), t0));
  ledger.SaveDone(2, true, t0 + absl::Seconds(1));
  // Block 1 is used again: block 2 is now the least recently used.
  ASSERT_TRUE(ledger.BeginLoad(1, t0 + absl::Seconds(2)));
  ledger.LoadDone(1, absl::OkStatus(), t0 + absl::Seconds(2));
  ASSERT_TRUE(ledger.BeginSave(3, c.data(), t0 + absl::Seconds(3)));
  EXPECT_EQ(ledger.Stats().evicted, 1);
  EXPECT_EQ(ledger.Match(b, {2}, 0, 1), 0) << "block 2 should have been evicted";
  EXPECT_EQ(ledger.Match(a, {1}, 0, 1), 1);
  // While block 1 is read and block 3 written, nothing can be evicted.
  ASSERT_TRUE(ledger.BeginLoad(1, t0 + absl::Seconds(4)));
  EXPECT_FALSE(ledger.BeginSave(4, d.data(), t0 + absl::Seconds(4)));
  EXPECT_TRUE(ledger.CheckInvariants());
}

// Scheduler-aware: the block the look-ahead window needs is passed over for the next least
// recently used; with every ready block in the window, LRU decides again.
TEST(DiskLedgerTest, SchedulerAwareEvictionPassesOverTheLookaheadWindow) {
  DiskLedger ledger(3, kBlock, absl::Hours(1));
  const auto a = Tokens(1, 1), b = Tokens(1, 2), c = Tokens(1, 3), d = Tokens(1, 4),
             e = Tokens(1, 5);
  for (const auto& [hash, tokens, at] :
       {std::tuple{1u, &a, 0}, std::tuple{2u, &b, 1}, std::tuple{3u, &c, 2}}) {
    ASSERT_TRUE(ledger.BeginSave(hash, tokens->data(), t0 + absl::Seconds(at)));
    ledger.SaveDone(hash, true, t0 + absl::Seconds(at));
  }
  ledger.SetLookahead({1, 3});
  ASSERT_TRUE(ledger.BeginSave(4, d.data(), t0 + absl::Seconds(5)));
  EXPECT_EQ(ledger.Match(a, {1}, 0, 1), 1) << "the window's block was evicted";
  EXPECT_EQ(ledger.Match(b, {2}, 0, 1), 0) << "block 2, outside the window, should have gone";
  ledger.SaveDone(4, true, t0 + absl::Seconds(5));
  ledger.SetLookahead({1, 3, 4});
  ASSERT_TRUE(ledger.BeginSave(5, e.data(), t0 + absl::Seconds(6)));
  EXPECT_EQ(ledger.Match(a, {1}, 0, 1), 0) << "all in the window: the LRU block goes";
  EXPECT_TRUE(ledger.CheckInvariants());
}

// A load that did not run in time, was cancelled, or lost its node says nothing about the
// block's bytes: it stays on disk, ready, and the next request loads it. Only bad or
// missing bytes drop it (it used to be dropped, its extent punched, for any failure).
TEST(DiskLedgerTest, OnlyALoadThatFoundTheBytesBadDropsTheBlock) {
  DiskLedger ledger(4, kBlock, absl::Hours(1));
  const auto a = Tokens(1, 1);
  ASSERT_TRUE(ledger.BeginSave(1, a.data(), t0));
  ledger.SaveDone(1, true, t0);
  for (const absl::Status& late :
       {absl::DeadlineExceededError("the caller gave up"), absl::CancelledError("stopped"),
        absl::UnavailableError("node gone"), absl::FailedPreconditionError("another tier"),
        absl::AbortedError("not read"), absl::ResourceExhaustedError("no memory for I/O")}) {
    ASSERT_TRUE(ledger.BeginLoad(1, t0)) << late;
    EXPECT_FALSE(ledger.LoadDone(1, late, t0)) << late << " punched the block";
    EXPECT_EQ(ledger.Match(a, {1}, 0, 1), 1) << late << " dropped the block";
  }
  EXPECT_EQ(ledger.Stats().failed_reads, 0);
  for (const absl::Status& bad :
       {absl::DataLossError("checksum"), absl::NotFoundError("gone"), absl::InternalError("EIO")}) {
    const auto b = Tokens(1, 2);
    ASSERT_TRUE(ledger.BeginSave(2, b.data(), t0));
    ledger.SaveDone(2, true, t0);
    ASSERT_TRUE(ledger.BeginLoad(2, t0));
    const auto punched = ledger.LoadDone(2, bad, t0);
    EXPECT_TRUE(punched) << bad;
    EXPECT_EQ(ledger.Match(b, {2}, 0, 1), 0) << bad;
    if (punched) ledger.PunchDone(*punched);
  }
  EXPECT_EQ(ledger.Stats().failed_reads, 3);
}

TEST(DiskLedgerTest, FailuresFreeTheirExtents) {
  DiskLedger ledger(2, kBlock, absl::Hours(1));
  const auto a = Tokens(1, 1), b = Tokens(1, 2);
  auto ea = ledger.BeginSave(1, a.data(), t0);
  ASSERT_TRUE(ea);
  ledger.SaveDone(1, false, t0);  // a full disk: not on disk
  EXPECT_EQ(ledger.Match(a, {1}, 0, 1), 0);
  EXPECT_EQ(ledger.Stats().failed_writes, 1);
  EXPECT_EQ(ledger.Stats().free, 2);
  ASSERT_TRUE(ledger.BeginSave(2, b.data(), t0));
  ledger.SaveDone(2, true, t0);
  auto read = ledger.BeginLoad(2, t0);
  ASSERT_TRUE(read);
  const auto punched = ledger.LoadDone(2, absl::DataLossError("checksum"), t0);
  ASSERT_TRUE(punched);
  EXPECT_EQ(*punched, *read);
  EXPECT_EQ(ledger.Match(b, {2}, 0, 1), 0);
  EXPECT_EQ(ledger.Stats().failed_reads, 1);
  // Not reused before the node has punched it out (a new block there would be wiped).
  EXPECT_EQ(ledger.Stats().free, 1);
  EXPECT_EQ(ledger.Stats().punching, 1);
  const auto c = Tokens(1, 3), d = Tokens(1, 4);
  auto ec = ledger.BeginSave(3, c.data(), t0);
  ASSERT_TRUE(ec);
  EXPECT_NE(*ec, *punched);
  EXPECT_FALSE(ledger.BeginSave(4, d.data(), t0)) << "took an extent not yet punched";
  ledger.PunchDone(*punched);
  auto ed = ledger.BeginSave(4, d.data(), t0);
  ASSERT_TRUE(ed);
  EXPECT_EQ(*ed, *punched);
  EXPECT_TRUE(ledger.CheckInvariants());
}

TEST(DiskLedgerTest, IdleBlocksExpire) {
  DiskLedger ledger(4, kBlock, absl::Minutes(60));
  const auto a = Tokens(1, 1), b = Tokens(1, 2);
  ASSERT_TRUE(ledger.BeginSave(1, a.data(), t0));
  ledger.SaveDone(1, true, t0);
  ASSERT_TRUE(ledger.BeginSave(2, b.data(), t0 + absl::Minutes(30)));
  ledger.SaveDone(2, true, t0 + absl::Minutes(30));
  EXPECT_TRUE(ledger.Expire(t0 + absl::Minutes(59)).empty());
  const auto gone = ledger.Expire(t0 + absl::Minutes(61));
  EXPECT_EQ(gone.size(), 1u);
  EXPECT_EQ(ledger.Stats().punching, 1);
  EXPECT_EQ(ledger.Match(a, {1}, 0, 1), 0);
  EXPECT_EQ(ledger.Match(b, {2}, 0, 1), 1);
  EXPECT_EQ(ledger.Stats().expired, 1);
  EXPECT_TRUE(ledger.CheckInvariants());
}

// Random saves, completions, loads and expiry against a plain model.
TEST(DiskLedgerTest, RandomOperationsKeepTheLedgerConsistent) {
  std::mt19937 rng(17);
  DiskLedger ledger(8, kBlock, absl::Seconds(50));
  std::map<uint64_t, std::vector<int32_t>> tokens_of;
  std::set<uint64_t> writing;
  std::multiset<uint64_t> reading;  // one entry per load in flight
  std::vector<int64_t> to_punch;
  absl::Time now = t0;
  for (int step = 0; step < 5000; ++step) {
    now += absl::Seconds(1);
    const uint64_t hash = 1 + rng() % 24;
    if (!tokens_of.count(hash)) tokens_of[hash] = Tokens(1, static_cast<int>(hash));
    const auto& t = tokens_of[hash];
    switch (rng() % 6) {
      case 0:
        if (ledger.BeginSave(hash, t.data(), now)) writing.insert(hash);
        break;
      case 1:
        if (!writing.empty()) {
          auto it = std::next(writing.begin(), rng() % writing.size());
          ledger.SaveDone(*it, rng() % 8 != 0, now);
          writing.erase(it);
        }
        break;
      case 2:
        if (ledger.BeginLoad(hash, now)) {
          EXPECT_EQ(ledger.Match(t, {hash}, 0, 1), 1);
          reading.insert(hash);
        }
        break;
      case 3:
        if (!reading.empty()) {
          auto it = std::next(reading.begin(), rng() % reading.size());
          if (auto punch = ledger.LoadDone(
                  *it, rng() % 10 != 0 ? absl::OkStatus() : absl::DataLossError("checksum"), now))
            to_punch.push_back(*punch);
          reading.erase(it);
        }
        break;
      case 4:
        for (int64_t e : ledger.Expire(now)) to_punch.push_back(e);
        break;
      case 5:
        if (!to_punch.empty()) {
          ledger.PunchDone(to_punch.back());
          to_punch.pop_back();
        }
        break;
    }
    ASSERT_TRUE(ledger.CheckInvariants()) << "step " << step;
    const DiskLedgerStats s = ledger.Stats();
    ASSERT_EQ(s.writing, static_cast<int64_t>(writing.size()));
    ASSERT_LE(s.reading, static_cast<int64_t>(reading.size()));
    ASSERT_EQ(s.punching, static_cast<int64_t>(to_punch.size()));
    ASSERT_EQ(s.free + s.writing + s.ready + s.reading + s.punching, 8);
  }
  EXPECT_GT(ledger.Stats().evicted, 0);
  EXPECT_GT(ledger.Stats().expired, 0);
}

}  // namespace
}  // namespace strata
