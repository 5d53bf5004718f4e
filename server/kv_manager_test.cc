#include "server/kv_manager.h"

#include <map>
#include <random>
#include <string>
#include <unordered_set>

#include "gtest/gtest.h"

namespace strata {
namespace {

constexpr int kBlock = 4;

// A simulated request: its tokens, its slot table and the cached blocks it holds.
struct Req {
  std::vector<int32_t> tokens;
  std::vector<int32_t> table;
  std::vector<uint64_t> held;
  int registered_blocks = 0;
};

// What the "memory node" wrote into each slot: (token, position) of the request that
// computed it. A prefix hit is correct only if the shared slots hold the same tokens at the
// same positions.
using SlotContents = std::map<int32_t, std::pair<int32_t, int32_t>>;

class PoolModel {
 public:
  explicit PoolModel(int64_t slots) : pool_(PoolIndex(0), slots, kBlock) {}

  // Admits `tokens` (prompt): prefix from the cache, the rest freshly allocated and
  // "computed". Returns false if it did not fit (nothing changed).
  bool Admit(const std::vector<int32_t>& tokens) {
    Req r;
    r.tokens = tokens;
    const std::vector<uint64_t> hashes = BlockHashes(tokens, kBlock, 42);
    const int max_blocks = static_cast<int>((tokens.size() - 1) / kBlock);
    const int64_t before = pool_.available();
    const int matched = pool_.Admit(tokens, hashes, max_blocks, tokens.size(), &r.table, &r.held);
    if (matched < 0) {
      EXPECT_EQ(pool_.available(), before) << "a failed admission changed the pool";
      return false;
    }
    r.registered_blocks = matched;
    hits_ += matched;
    // Shared KV must be what this request would have computed; fresh slots get its tokens.
    for (size_t p = 0; p < r.table.size(); ++p) {
      if (p < static_cast<size_t>(matched) * kBlock) {
        const auto& [token, position] = contents_.at(r.table[p]);
        EXPECT_EQ(token, tokens[p]);
        EXPECT_EQ(position, static_cast<int32_t>(p));
      } else {
        contents_[r.table[p]] = {tokens[p], static_cast<int32_t>(p)};
      }
    }
    Register(r);
    reqs_.push_back(std::move(r));
    return true;
  }

  bool Extend(size_t i, int32_t token) {
    Req& r = reqs_[i];
    std::vector<int32_t> slot;
    if (!pool_.Allocate(1, &slot)) return false;
    contents_[slot[0]] = {token, static_cast<int32_t>(r.table.size())};
    r.table.push_back(slot[0]);
    r.tokens.push_back(token);
    Register(r);
    return true;
  }

  void Share(size_t i) {
    Req copy = reqs_[i];
    pool_.Ref(copy.table);
    for (uint64_t h : copy.held) pool_.HoldBlock(h);
    reqs_.push_back(std::move(copy));
  }

  void Finish(size_t i) {
    for (uint64_t h : reqs_[i].held) pool_.DropBlock(h);
    pool_.Unref(reqs_[i].table);
    reqs_.erase(reqs_.begin() + i);
  }

  bool Check() const {
    std::vector<int32_t> refs;
    for (const Req& r : reqs_) refs.insert(refs.end(), r.table.begin(), r.table.end());
    return pool_.CheckInvariants(refs);
  }

  KvPool pool_;
  std::vector<Req> reqs_;
  SlotContents contents_;
  int64_t hits_ = 0;

 private:
  // Records newly completed full blocks in the prefix cache.
  void Register(Req& r) {
    const std::vector<uint64_t> hashes = BlockHashes(r.tokens, kBlock, 42);
    for (int b = r.registered_blocks; b < static_cast<int>(hashes.size()); ++b) {
      if (pool_.InsertBlock(hashes[b], r.tokens.data() + b * kBlock, r.table.data() + b * kBlock)) {
        r.held.push_back(hashes[b]);
      }
    }
    r.registered_blocks = static_cast<int>(hashes.size());
  }
};

// Random admissions (over a few shared prefixes, so that the cache gets hits), extensions,
// n > 1 shares and finishes against the model, checking the invariants after each.
// `finishes` of every 10 operations (at most 7) finish a request. Returns the most slots
// idle blocks held at once.
int64_t RandomOperations(std::mt19937& rng, int64_t slots, int num_prefixes, int prefix_tokens,
                         int max_extra, int ops, int finishes) {
  PoolModel m(slots);
  std::vector<std::vector<int32_t>> prefixes;
  for (int i = 0; i < num_prefixes; ++i) {
    std::vector<int32_t> p;
    for (int k = 0; k < prefix_tokens; ++k) p.push_back(rng() % 50);
    prefixes.push_back(p);
  }
  int64_t most_idle = 0;
  for (int op = 0; op < ops; ++op) {
    const int kind = rng() % 10;
    if (kind < 3 || m.reqs_.empty()) {
      std::vector<int32_t> tokens = prefixes[rng() % prefixes.size()];
      tokens.resize(rng() % prefix_tokens + 1);
      const int extra = rng() % (max_extra + 1);
      for (int k = 0; k < extra; ++k) tokens.push_back(rng() % 50);
      m.Admit(tokens);
    } else if (kind < 9 - finishes) {
      m.Extend(rng() % m.reqs_.size(), rng() % 50);
    } else if (kind < 10 - finishes) {
      m.Share(rng() % m.reqs_.size());
    } else {
      m.Finish(rng() % m.reqs_.size());
    }
    EXPECT_TRUE(m.Check()) << "op " << op;
    if (testing::Test::HasFailure()) return most_idle;
    most_idle = std::max(most_idle, m.pool_.Stats().reclaimable_slots);
  }
  while (!m.reqs_.empty()) m.Finish(0);
  EXPECT_TRUE(m.Check());
  // Nothing leaks: every slot is free or held only by an idle cached block.
  const PoolStats s = m.pool_.Stats();
  EXPECT_EQ(s.free_slots + s.reclaimable_slots, s.total_slots);
  EXPECT_EQ(s.used_slots, 0);
  EXPECT_GT(m.hits_, 0) << "the workload should produce prefix hits";
  EXPECT_GT(m.pool_.evicted_blocks(), 0) << "the workload should fill the pool";
  // And all of it can be allocated again.
  std::vector<int32_t> all;
  EXPECT_TRUE(m.pool_.Allocate(s.total_slots, &all));
  return most_idle;
}

TEST(KvPool, RandomOperationsAgainstAModel) {
  std::mt19937 rng(1);
  for (int round = 0; round < 20 && !HasFailure(); ++round) {
    RandomOperations(rng, 200, 4, 12, 8, 2000, 2);
  }
}

TEST(KvPool, RandomOperationsWithTheCacheFullAgainstAModel) {
  // A pool large enough, and prompts varied enough, that idle blocks hold the 16
  // stretches' worth of slots from which new runs start in stretches of blocks due for
  // eviction.
  std::mt19937 rng(2);
  for (int round = 0; round < 4 && !HasFailure(); ++round) {
    const int64_t most_idle = RandomOperations(rng, 2048, 64, 48, 24, 6000, 4);
    EXPECT_GE(most_idle, 16 * KvPool::kRunSlots) << "round " << round;
  }
}

TEST(KvPool, AllocationIsAllOrNothingAndReusesFromTheStartOfTheNewestFreeRun) {
  KvPool pool(PoolIndex(0), 8, 4);  // no whole stretch of 64 slots
  std::vector<int32_t> a, b;
  ASSERT_TRUE(pool.Allocate(3, &a));
  EXPECT_EQ(a, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_FALSE(pool.Allocate(6, &b));
  EXPECT_TRUE(b.empty());
  pool.Unref(a);
  ASSERT_TRUE(pool.Allocate(2, &b));
  EXPECT_EQ(b, (std::vector<int32_t>{0, 1})) << "the newest free slot (2), from its run's start";
  EXPECT_TRUE(pool.CheckInvariants(b));
}

// Each tile (64 positions) of a sequence is one run of slots, from the slot at the tile's
// offset: whole runs for attention to read.
void ExpectWholeTiles(const std::vector<int32_t>& table, const std::string& what) {
  constexpr int kRun = KvPool::kRunSlots;
  for (size_t p = 0; p < table.size(); ++p) {
    EXPECT_EQ(table[p] % kRun, static_cast<int32_t>(p % kRun)) << what << ", position " << p;
    if (p % kRun != 0) EXPECT_EQ(table[p], table[p - 1] + 1) << what << ", position " << p;
  }
}

TEST(KvPool, SequencesDecodingTogetherEachKeepWholeTiles) {
  // Eight sequences with prompts of different lengths, then 300 decode steps in which each
  // takes one slot in turn, as the scheduler's steps allocate. A free list alone would
  // interleave their slots token by token.
  KvPool pool(PoolIndex(0), 8192, 16);
  std::vector<std::vector<int32_t>> tables(8);
  for (size_t i = 0; i < tables.size(); ++i) {
    ASSERT_TRUE(pool.Allocate(static_cast<int64_t>(37 * i + 5), &tables[i]));
  }
  for (int step = 0; step < 300; ++step) {
    for (auto& table : tables) ASSERT_TRUE(pool.Allocate(1, &table));
  }
  std::vector<int32_t> refs;
  for (size_t i = 0; i < tables.size(); ++i) {
    ExpectWholeTiles(tables[i], "sequence " + std::to_string(i));
    refs.insert(refs.end(), tables[i].begin(), tables[i].end());
  }
  EXPECT_TRUE(pool.CheckInvariants(refs));

  // A sequence that finished gives its stretches back whole, and the next one starts there.
  pool.Unref(tables[3]);
  std::vector<int32_t> next;
  ASSERT_TRUE(pool.Allocate(100, &next));
  ExpectWholeTiles(next, "the sequence after one that finished");
}

// A pool whose every slot an idle cached block holds: request r's four blocks of 16 fill
// stretch r. They went idle request by request (the least recently used first), or with
// every request's last block after all the others' (`last_blocks_late`).
struct FullOfIdleBlocks {
  static constexpr int kRequests = 24;  // more than the 16 stretches the ledger asks for
  KvPool pool;
  std::vector<std::vector<int32_t>> tokens;  // each request's 64 tokens
  explicit FullOfIdleBlocks(KvEviction policy = KvEviction::kLru, bool last_blocks_late = false)
      : pool(PoolIndex(0), 64 * kRequests, 16, policy) {
    std::vector<std::vector<int32_t>> tables;
    for (int r = 0; r < kRequests; ++r) {
      std::vector<int32_t> t(64);
      for (int i = 0; i < 64; ++i) t[i] = 1000 * r + i;
      std::vector<int32_t> table;
      EXPECT_TRUE(pool.Allocate(64, &table));
      EXPECT_EQ(table.front(), 64 * r);
      const std::vector<uint64_t> hashes = Hashes(t);
      for (int b = 0; b < 4; ++b) {
        EXPECT_TRUE(pool.InsertBlock(hashes[b], t.data() + 16 * b, table.data() + 16 * b));
      }
      tokens.push_back(std::move(t));
      tables.push_back(std::move(table));
    }
    for (int phase = 0; phase < 2; ++phase) {
      for (int r = 0; r < kRequests; ++r) {
        const std::vector<uint64_t> hashes = Hashes(tokens[r]);
        for (int b = 0; b < 4; ++b) {
          if ((last_blocks_late && b == 3) == (phase == 1)) pool.DropBlock(hashes[b]);
        }
        if (phase == 1) pool.Unref(tables[r]);
      }
    }
  }
  static std::vector<uint64_t> Hashes(const std::vector<int32_t>& t) {
    return BlockHashes(t, 16, 0);
  }
  // How many of request r's blocks are still cached.
  int Cached(int r) const { return pool.MatchLength(tokens[r], Hashes(tokens[r]), 4); }
};

TEST(KvPool, WithTheCacheFullSequencesEvictWholeStretchesInThePolicysOrder) {
  FullOfIdleBlocks full;
  ASSERT_EQ(full.pool.Stats().free_slots, 0);
  std::vector<std::vector<int32_t>> tables(2);
  for (int step = 0; step < 150; ++step) {
    for (auto& table : tables) ASSERT_TRUE(full.pool.Allocate(1, &table));
  }
  for (size_t i = 0; i < tables.size(); ++i) {
    ExpectWholeTiles(tables[i], "sequence " + std::to_string(i));
  }
  // Six tiles took six stretches: the six least recently used requests' blocks went, and
  // no other.
  for (int r = 0; r < FullOfIdleBlocks::kRequests; ++r) {
    EXPECT_EQ(full.Cached(r), r < 6 ? 0 : 4) << r;
  }
  EXPECT_EQ(full.pool.evicted_blocks(), 6 * 4);
  std::vector<int32_t> refs = tables[0];
  refs.insert(refs.end(), tables[1].begin(), tables[1].end());
  EXPECT_TRUE(full.pool.CheckInvariants(refs));
}

TEST(KvPool, AStretchIsFreedForARunOnlyFromTheBlocksNextInTheEvictionOrder) {
  // Every stretch holds a block that 24 others would be evicted before: freeing a whole
  // stretch would jump the order, so the least recently used block alone goes.
  FullOfIdleBlocks full(KvEviction::kLru, /*last_blocks_late=*/true);
  std::vector<int32_t> table;
  ASSERT_TRUE(full.pool.Allocate(1, &table));
  EXPECT_EQ(full.Cached(0), 0) << "its first block was the least recently used";
  for (int r = 1; r < FullOfIdleBlocks::kRequests; ++r) EXPECT_EQ(full.Cached(r), 4) << r;
  EXPECT_EQ(full.pool.evicted_blocks(), 1);
  EXPECT_TRUE(full.pool.CheckInvariants(table));
}

TEST(KvPool, AStretchWithABlockTheLookaheadWindowNeedsIsNotFreedForARun) {
  FullOfIdleBlocks full(KvEviction::kSchedulerAware);
  full.pool.SetLookahead({FullOfIdleBlocks::Hashes(full.tokens[0])[2]});
  std::vector<int32_t> table;
  ASSERT_TRUE(full.pool.Allocate(10, &table));
  EXPECT_EQ(table.front(), 64) << "stretch 0 holds a protected block; stretch 1 is next";
  EXPECT_EQ(full.Cached(0), 4);
  EXPECT_EQ(full.Cached(1), 0);
  EXPECT_TRUE(full.pool.CheckInvariants(table));
}

TEST(KvPool, ASmallCacheIsNotEvictedForARun) {
  // Eight requests' blocks cached (fewer than the 16 stretches' worth the ledger asks for)
  // and 128 free slots in runs of 16 over the pool, no stretch wholly free: a new sequence
  // takes free slots, and every cached prompt stays.
  KvPool pool(PoolIndex(0), 64 * 9, 16);
  std::vector<std::vector<int32_t>> tokens;
  std::vector<int32_t> scattered;
  for (int r = 0; r < 8; ++r) {
    std::vector<int32_t> t(64);
    for (int i = 0; i < 64; ++i) t[i] = 1000 * r + i;
    std::vector<int32_t> table;
    ASSERT_TRUE(pool.Allocate(64, &table));  // stretch r
    const std::vector<uint64_t> hashes = FullOfIdleBlocks::Hashes(t);
    for (int b = 0; b < 3; ++b) {
      ASSERT_TRUE(pool.InsertBlock(hashes[b], t.data() + 16 * b, table.data() + 16 * b));
      pool.DropBlock(hashes[b]);
    }
    // Slots 48-55 free now, 56-63 once the test lets them go.
    scattered.insert(scattered.end(), table.begin() + 56, table.end());
    table.resize(56);
    pool.Unref(table);
    tokens.push_back(std::move(t));
  }
  std::vector<int32_t> rest;
  ASSERT_TRUE(pool.Allocate(64, &rest));  // the last stretch
  const int64_t evicted = pool.evicted_blocks();
  pool.Unref(scattered);
  std::vector<int32_t> table;
  ASSERT_TRUE(pool.Allocate(100, &table));
  EXPECT_EQ(pool.evicted_blocks(), evicted);
  for (const auto& t : tokens) EXPECT_EQ(pool.MatchLength(t, FullOfIdleBlocks::Hashes(t), 3), 3);
  table.insert(table.end(), rest.begin(), rest.end());
  EXPECT_TRUE(pool.CheckInvariants(table));
}

TEST(KvPool, ARunDoesNotGrowIntoAStretchAnotherRunStartedIn) {
  KvPool pool(PoolIndex(0), 192, 16);  // stretches [0, 64), [64, 128), [128, 192)
  std::vector<int32_t> a, b;
  ASSERT_TRUE(pool.Allocate(60, &a));  // 0..59
  ASSERT_TRUE(pool.Allocate(10, &b));  // a stretch of its own: 64..73
  EXPECT_EQ(b.front(), 64);
  ASSERT_TRUE(pool.Allocate(10, &a));  // 60..63, then a new stretch at offset 0
  EXPECT_EQ(a[63], 63);
  EXPECT_EQ(a[64], 128);
  ExpectWholeTiles(a, "a");
  ExpectWholeTiles(b, "b");
  std::vector<int32_t> refs = a;
  refs.insert(refs.end(), b.begin(), b.end());
  EXPECT_TRUE(pool.CheckInvariants(refs));
}

TEST(KvPool, WithoutAWholeFreeStretchSlotsComeFromTheNewestFreeRunUpward) {
  KvPool pool(PoolIndex(0), 128, 16);
  std::vector<int32_t> all;
  ASSERT_TRUE(pool.Allocate(128, &all));
  // Free 10..29 and 100..103: no stretch is wholly free.
  std::vector<int32_t> freed(all.begin() + 10, all.begin() + 30);
  const std::vector<int32_t> later(all.begin() + 100, all.begin() + 104);
  pool.Unref(freed);
  pool.Unref(later);
  std::vector<int32_t> b;
  ASSERT_TRUE(pool.Allocate(6, &b));  // the newest free slot is 103: its run starts at 100
  EXPECT_EQ(b, (std::vector<int32_t>{100, 101, 102, 103, 10, 11}));
  std::vector<int32_t> refs(all.begin(), all.begin() + 10);
  refs.insert(refs.end(), all.begin() + 30, all.begin() + 100);
  refs.insert(refs.end(), all.begin() + 104, all.end());
  refs.insert(refs.end(), b.begin(), b.end());
  EXPECT_TRUE(pool.CheckInvariants(refs));
}

TEST(KvPool, ABlockReadAheadLandsAtItsTileOffset) {
  // A block read ahead from disk for positions 48..63 (Scheduler::OrderPrefetch), then a
  // table that takes it as its last prefix block and grows: every position sits at its
  // offset in a tile, and the tiles after the block are whole runs.
  KvPool pool(PoolIndex(0), 256, 16);
  std::vector<int32_t> block;
  ASSERT_TRUE(pool.Allocate(16, &block, 48));
  for (int i = 0; i < 16; ++i) EXPECT_EQ(block[i], 48 + i);
  std::vector<int32_t> table;
  ASSERT_TRUE(pool.Allocate(48, &table));  // positions 0..47
  pool.Ref(block);
  table.insert(table.end(), block.begin(), block.end());
  pool.Unref(block);  // the loader's reference, now the table's
  ASSERT_TRUE(pool.Allocate(70, &table));
  for (size_t p = 0; p < table.size(); ++p) {
    EXPECT_EQ(table[p] % KvPool::kRunSlots, static_cast<int32_t>(p % KvPool::kRunSlots)) << p;
  }
  for (size_t p = 65; p < table.size(); ++p) EXPECT_EQ(table[p], table[p - 1] + 1) << p;
  EXPECT_TRUE(pool.CheckInvariants(table));
}

TEST(KvPool, IdleCachedBlocksAreReclaimedLruFirst) {
  KvPool pool(PoolIndex(0), 8, 4);
  std::vector<int32_t> t1 = {1, 2, 3, 4}, t2 = {5, 6, 7, 8};
  std::vector<int32_t> s1, s2;
  ASSERT_TRUE(pool.Allocate(4, &s1));
  ASSERT_TRUE(pool.Allocate(4, &s2));
  const uint64_t h1 = BlockHashes(t1, 4, 0)[0], h2 = BlockHashes(t2, 4, 0)[0];
  ASSERT_TRUE(pool.InsertBlock(h1, t1.data(), s1.data()));
  ASSERT_TRUE(pool.InsertBlock(h2, t2.data(), s2.data()));
  pool.DropBlock(h1);
  pool.Unref(s1);
  pool.DropBlock(h2);
  pool.Unref(s2);
  EXPECT_EQ(pool.Stats().reclaimable_slots, 8);
  EXPECT_EQ(pool.available(), 8);
  // Touch block 1 (a hit), so block 2 becomes the LRU victim.
  std::vector<int32_t> hit;
  pool.TakePrefix({h1}, 1, &hit);
  EXPECT_EQ(hit, s1);
  std::vector<int32_t> fresh;
  ASSERT_TRUE(pool.Allocate(4, &fresh));
  EXPECT_EQ(pool.evicted_blocks(), 1);
  EXPECT_EQ(pool.MatchLength(t2, {h2}, 1), 0) << "block 2 was evicted";
  EXPECT_EQ(pool.MatchLength(t1, {h1}, 1), 1) << "block 1 is held, not evictable";
  EXPECT_FALSE(pool.Allocate(1, &fresh));
}

// Each eviction policy against a direct model of it: blocks are cached, used again at
// random, and a random look-ahead set is named; then allocations evict one block at a time,
// and the block gone must be the one the model picks (LRU: least recently idle; FIFO:
// first cached; scheduler-aware: least recently idle outside the look-ahead, else LRU).
TEST(KvPool, EvictionPoliciesEvictInTheirOrder) {
  for (const KvEviction policy :
       {KvEviction::kLru, KvEviction::kFifo, KvEviction::kSchedulerAware}) {
    std::mt19937 rng(7);
    for (int round = 0; round < 20; ++round) {
      const int n = 12;
      KvPool pool(PoolIndex(0), n * 4, 4, policy);
      struct Model {
        std::vector<int32_t> tokens;
        uint64_t hash;
        int64_t cached, idle_since;
        bool gone = false;
      };
      std::vector<Model> blocks;
      int64_t tick = 0;
      for (int b = 0; b < n; ++b) {
        Model m;
        m.tokens = {100 * b + 1, 100 * b + 2, 100 * b + 3, round};
        m.hash = BlockHashes(m.tokens, 4, 0)[0];
        std::vector<int32_t> slots;
        ASSERT_TRUE(pool.Allocate(4, &slots));
        ASSERT_TRUE(pool.InsertBlock(m.hash, m.tokens.data(), slots.data()));
        m.cached = ++tick;
        pool.DropBlock(m.hash);
        pool.Unref(slots);
        m.idle_since = ++tick;
        blocks.push_back(m);
      }
      // Hits: a request takes a block and lets it go again.
      for (int i = 0; i < 20; ++i) {
        Model& m = blocks[rng() % n];
        std::vector<int32_t> table;
        pool.TakePrefix({m.hash}, 1, &table);
        pool.DropBlock(m.hash);
        pool.Unref(table);
        m.idle_since = ++tick;
      }
      std::unordered_set<uint64_t> lookahead;
      for (const Model& m : blocks) {
        if (rng() % 3 == 0) lookahead.insert(m.hash);
      }
      pool.SetLookahead(lookahead);
      int64_t protected_slots = 4 * static_cast<int64_t>(lookahead.size());
      EXPECT_EQ(pool.AvailableOutsideLookahead(), n * 4 - protected_slots);
      std::vector<int32_t> taken;
      for (int e = 0; e < n; ++e) {
        const Model* want = nullptr;
        for (const Model& m : blocks) {
          if (m.gone) continue;
          auto before = [&](const Model& a, const Model& b) {
            if (policy == KvEviction::kFifo) return a.cached < b.cached;
            if (policy == KvEviction::kSchedulerAware &&
                lookahead.count(a.hash) != lookahead.count(b.hash)) {
              return lookahead.count(a.hash) < lookahead.count(b.hash);
            }
            return a.idle_since < b.idle_since;
          };
          if (want == nullptr || before(m, *want)) want = &m;
        }
        ASSERT_TRUE(pool.Allocate(4, &taken));
        for (Model& m : blocks) {
          const bool cached = pool.MatchLength(m.tokens, {m.hash}, 1) == 1;
          if (!m.gone && !cached) {
            EXPECT_EQ(&m, want) << AbslUnparseFlag(policy) << " round " << round << " eviction "
                                << e;
            m.gone = true;
          }
        }
      }
      EXPECT_TRUE(pool.CheckInvariants(taken));
    }
  }
}

TEST(KvPool, EvictionPolicyFlags) {
  for (const char* name : {"lru", "fifo", "scheduler-aware"}) {
    KvEviction e;
    std::string error;
    ASSERT_TRUE(AbslParseFlag(name, &e, &error)) << name;
    EXPECT_EQ(AbslUnparseFlag(e), name);
  }
  KvEviction e;
  std::string error;
  EXPECT_FALSE(AbslParseFlag("mru", &e, &error));
  EXPECT_FALSE(error.empty());
}

TEST(KvPool, HashCollisionIsAMiss) {
  KvPool pool(PoolIndex(0), 8, 2);
  std::vector<int32_t> slots;
  ASSERT_TRUE(pool.Allocate(2, &slots));
  const std::vector<int32_t> real = {1, 2};
  ASSERT_TRUE(pool.InsertBlock(777, real.data(), slots.data()));
  // Same (forged) hash, different tokens: no match.
  EXPECT_EQ(pool.MatchLength({9, 9}, {777}, 1), 0);
  EXPECT_EQ(pool.MatchLength({1, 2}, {777}, 1), 1);
}

TEST(BlockHashes, ChainedOverPrefix) {
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<int32_t> b = a;
  b[1] = 99;  // differs in block 0: every later hash differs too
  const auto ha = BlockHashes(a, 4, 0), hb = BlockHashes(b, 4, 0);
  ASSERT_EQ(ha.size(), 2u);
  EXPECT_NE(ha[0], hb[0]);
  EXPECT_NE(ha[1], hb[1]);
  std::vector<int32_t> c = a;
  c[6] = 99;  // differs in block 1 only
  const auto hc = BlockHashes(c, 4, 0);
  EXPECT_EQ(ha[0], hc[0]);
  EXPECT_NE(ha[1], hc[1]);
  EXPECT_NE(BlockHashes(a, 4, 1)[0], ha[0]) << "the salt separates models";
  EXPECT_EQ(BlockHashes({1, 2, 3}, 4, 0).size(), 0u);
}

}  // namespace
}  // namespace strata
