// The disk tier under the KV pools, in one process (server/in_process_deployment.h):
// a conversation's next turn reads its history back from disk and computes what a fresh
// run computes, in disaggregated and co-located mode; corrupted blocks, a full disk, a slow
// disk, the TTL, a timeout while loading, preemption (a swap), and the load-or-recompute
// rule each degrade to recomputing and fail nothing. Layer-wise pre-loading computes the
// new tokens while the history loads, and a failed load voids what was computed over it.
#include <fcntl.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "server/in_process_deployment.h"

namespace strata {
namespace {

using namespace in_process;  // NOLINT: the harness's types

// The disk tier (AttentionStore's reuse across turns): a conversation's KV, saved to disk
// when its turn ends, is read back for its next turn after DRAM has been given to other
// requests, and the next turn's output is what a fresh run computes. Then the same with
// the blocks on disk corrupted (detected, never served, recomputed) and on a disk too full
// to hold them (not cached; nothing fails).
class DiskTierTest : public InProcessDeploymentTest {
 protected:
  // Turn 1 of a conversation, three other conversations that take the pool's DRAM (160
  // slots: ten blocks), then turn 2 (turn 1's prompt and output, and a new question).
  struct Turns {
    std::vector<int32_t> turn1_output, turn2_output;
    int64_t turn2_cached = 0;
    int64_t turn2_prefill_rows = 0;  // prompt rows computed for turn 2
    SchedulerStats stats;
    std::optional<KvDiskTierStats> disk;
    LoadGateStats gate;  // the first pool's node: layer-wise pre-loading
  };
  static GenerateRequest Turn(std::vector<int32_t> prompt) {
    GenerateRequest r;
    r.prompt_tokens = std::move(prompt);
    r.sampling.temperature = 0.0f;
    r.max_tokens = 8;
    r.ignore_eos = true;
    return r;
  }
  static std::vector<int32_t> Turn2Prompt(const std::vector<int32_t>& turn1_output) {
    std::vector<int32_t> p = Prompt(100, 7000);
    p.insert(p.end(), turn1_output.begin(), turn1_output.end());
    const auto question = Prompt(20, 7001);
    p.insert(p.end(), question.begin(), question.end());
    return p;
  }
  // `before_turn2` runs once the other conversations are done (with the disk directory).
  static Turns Converse(const Topology& t, const std::function<void()>& before_turn2) {
    Deployment d(weights_, t, 160);
    Turns out;
    auto first = d.Submit(Turn(Prompt(100, 7000)));
    EXPECT_TRUE(d.Wait({first}));
    out.turn1_output = first->tokens;
    std::vector<std::shared_ptr<Outcome>> others;
    for (int i = 0; i < 3; ++i) {
      others.push_back(d.Submit(Turn(Prompt(100, 7100 + i))));
      EXPECT_TRUE(d.Wait({others.back()}));
    }
    if (before_turn2) before_turn2();
    const int64_t rows_before = d.scheduler().Stats().prefill_rows_total;
    auto second = d.Submit(Turn(Turn2Prompt(out.turn1_output)));
    EXPECT_TRUE(d.Wait({second}));
    out.turn2_prefill_rows = d.scheduler().Stats().prefill_rows_total - rows_before;
    for (const auto& o : others) EXPECT_TRUE(o->error.ok()) << o->error;
    EXPECT_TRUE(first->error.ok()) << first->error;
    EXPECT_TRUE(second->error.ok()) << second->error;
    out.turn2_output = second->tokens;
    out.turn2_cached = second->cached_prompt_tokens;
    out.stats = d.scheduler().Stats();
    out.disk = d.disk().stats();
    out.gate = d.disk().gate().stats();
    return out;
  }
  // Turn 2 computed from nothing: a deployment that has seen nothing else.
  // The history's blocks had left DRAM: turn 2 read them back from disk and computed exactly
  // what a fresh run computes.
  static void ExpectTurn2FromDisk(const Turns& turns);
  static std::vector<int32_t> Fresh(const std::vector<int32_t>& turn1_output) {
    Deployment d(weights_, Topology{1, 1}, 2048);
    auto o = d.Submit(Turn(Turn2Prompt(turn1_output)));
    EXPECT_TRUE(d.Wait({o}));
    EXPECT_TRUE(o->error.ok()) << o->error;
    EXPECT_EQ(o->cached_prompt_tokens, 0);
    return o->tokens;
  }
  // A conversation's two turns, with three other prompts (seeds from `others`) between
  // them that take the pool's DRAM, so that the second turn finds its history on disk; its
  // output must equal a fresh run's.
  static void SecondTurnAfterDramMoves(Deployment& d, uint32_t seed, uint32_t others) {
    auto first = d.Submit(Turn(Prompt(100, seed)));
    ASSERT_TRUE(d.Wait({first}));
    for (uint32_t i = 0; i < 3; ++i) {
      auto other = d.Submit(Turn(Prompt(100, others + i)));
      ASSERT_TRUE(d.Wait({other}));
    }
    std::vector<int32_t> prompt = Prompt(100, seed);
    prompt.insert(prompt.end(), first->tokens.begin(), first->tokens.end());
    auto second = d.Submit(Turn(prompt));
    ASSERT_TRUE(d.Wait({second}));
    EXPECT_TRUE(second->error.ok()) << second->error;
    Deployment fresh(weights_, Topology{1, 1}, 2048);
    auto reference = fresh.Submit(Turn(prompt));
    ASSERT_TRUE(fresh.Wait({reference}));
    EXPECT_EQ(second->tokens, reference->tokens) << "the conversation of seed " << seed;
  }
  // Flips a byte in every block's payload in the file (past each extent's 4 KiB header).
  static void FlipEveryBlock(const std::string& blocks) {
    const int fd = open(blocks.c_str(), O_RDWR);
    ASSERT_GE(fd, 0) << blocks;
    const off_t size = lseek(fd, 0, SEEK_END);
    int flipped = 0;
    for (off_t at = 4096 + 64; at < size; at += 4096) {
      uint8_t b = 0;
      if (pread(fd, &b, 1, at) != 1 || b == 0) continue;  // holes read as zeros
      b ^= 0x5a;
      ASSERT_EQ(pwrite(fd, &b, 1, at), 1);
      ++flipped;
    }
    close(fd);
    ASSERT_GT(flipped, 0) << "nothing on disk to corrupt";
  }
  static std::string DiskDir(const std::string& name) {
    const char* tmp = std::getenv("TEST_TMPDIR");
    const std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/disk_tier_", name);
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    return dir;
  }
};

TEST_F(DiskTierTest, TheNextTurnReadsItsHistoryFromDiskAndMatchesAFreshRun) {
  Topology t{1, 1};
  t.disk_dir = DiskDir("reuse");
  ExpectTurn2FromDisk(Converse(t, nullptr));
}

// Co-located mode: the disk tier under the compute node's own cache.
TEST_F(DiskTierTest, CoLocatedTheNextTurnReadsItsHistoryFromDiskAndMatchesAFreshRun) {
  Topology t{0, 1};
  t.disk_dir = DiskDir("reuse_colocated");
  ExpectTurn2FromDisk(Converse(t, nullptr));
}

void DiskTierTest::ExpectTurn2FromDisk(const Turns& turns) {
  ASSERT_EQ(turns.turn2_output.size(), 8u);
  EXPECT_EQ(turns.turn2_output, Fresh(turns.turn1_output));
  // The history's blocks had left DRAM: they came back from disk (six full blocks of the
  // 100-token prompt; the tail and the output are recomputed).
  EXPECT_GT(turns.stats.dram_evicted_blocks_total, 0);
  EXPECT_GE(turns.stats.disk_hit_tokens_total, 96);
  EXPECT_GE(turns.turn2_cached, 96);
  // Only the rest of the prompt was computed (never a row before the loads were in).
  EXPECT_LE(turns.turn2_prefill_rows, 128 - 96);
  EXPECT_GE(turns.stats.disk_saved_blocks_total, 6);
  EXPECT_EQ(turns.stats.disk_failed_loads_total, 0);
  ASSERT_TRUE(turns.disk.has_value());
  EXPECT_GE(turns.disk->loads, 6u);
  EXPECT_EQ(turns.disk->checksum_failures, 0u);
  EXPECT_GT(turns.disk->bytes_read, 0u);
}

// Layer-wise pre-loading: on a slow disk (each batch of loads arrives 150 ms late), turn 2's
// new tokens compute while its history loads, each layer's attention waiting on the node
// for that layer, and the output is a fresh run's; without it the rows wait for the load.
TEST_F(DiskTierTest, LayerWiseTheNewTokensComputeWhileTheHistoryLoads) {
  for (const bool layerwise : {true, false}) {
    Topology t{1, 1};
    t.disk_dir = DiskDir(layerwise ? "layerwise" : "whole");
    t.disk_load_delay = absl::Milliseconds(150);
    t.disk_layerwise = layerwise;
    const Turns turns = Converse(t, nullptr);
    ExpectTurn2FromDisk(turns);
    if (layerwise) {
      EXPECT_EQ(turns.stats.disk_preloaded_requests_total, 1);
      EXPECT_EQ(turns.stats.disk_preload_failed_total, 0);
      // The chunk was out before its loads arrived: attention waited for the disk.
      EXPECT_GT(turns.gate.waited_layers, 0u);
      EXPECT_EQ(turns.gate.abandoned, 0u);
    } else {
      EXPECT_EQ(turns.stats.disk_preloaded_requests_total, 0);
      EXPECT_EQ(turns.gate.waited_layers + turns.gate.ready_layers, 0u);
    }
  }
}

// A block that fails its checksum under layer-wise pre-loading: the chunk that computed
// over it is void, the request is preempted and recomputes what is not cached, and its
// output is a fresh run's.
TEST_F(DiskTierTest, LayerWiseAFailedLoadVoidsTheChunkOverIt) {
  Topology t{1, 1};
  t.disk_dir = DiskDir("layerwise_corrupt");
  t.disk_load_delay = absl::Milliseconds(100);  // the chunk is out before the loads fail
  const std::string blocks = t.disk_dir + "/memory-0/blocks";
  // Every load of turn 2 fails.
  const Turns turns = Converse(t, [&] { FlipEveryBlock(blocks); });
  EXPECT_EQ(turns.turn2_output, Fresh(turns.turn1_output));
  EXPECT_GT(turns.stats.disk_failed_loads_total, 0);
  EXPECT_EQ(turns.stats.disk_preload_failed_total, 1) << "the chunk did not run over the loads";
  EXPECT_GT(turns.stats.num_preemptions_total, 0);
  EXPECT_EQ(turns.stats.planner_shortfalls_total, 0);
}

// Scheduler-aware placement (AttentionStore): while turn 2 waits in the queue (one
// sequence at a time, and another request runs), its history on disk is prefetched into
// DRAM, so its admission finds it there; under LRU it is read from disk at admission. The
// output is a fresh run's either way.
TEST_F(DiskTierTest, SchedulerAwarePrefetchesTheQueuedTurnsHistoryIntoDram) {
  // Scheduler-aware with its window, the same with an empty window, and LRU.
  for (const auto& [policy, window] :
       {std::pair{KvEviction::kSchedulerAware, 32}, std::pair{KvEviction::kSchedulerAware, 0},
        std::pair{KvEviction::kLru, 32}}) {
    SCOPED_TRACE(absl::StrCat(AbslUnparseFlag(policy), ", window ", window));
    Topology t{1, 1};
    t.disk_dir = DiskDir(absl::StrCat(AbslUnparseFlag(policy), window));
    t.kv_eviction = policy;
    t.lookahead_requests = window;
    t.max_num_seqs = 1;
    Deployment d(weights_, t, 160);
    auto first = d.Submit(Turn(Prompt(100, 7000)));
    ASSERT_TRUE(d.Wait({first}));
    for (int i = 0; i < 3; ++i) {  // take the pool's DRAM
      auto other = d.Submit(Turn(Prompt(100, 7100 + i)));
      ASSERT_TRUE(d.Wait({other}));
    }
    GenerateRequest long_one = Turn(Prompt(20, 7400));
    long_one.max_tokens = 40;           // 60 slots: the 96 the prefetch needs are left
    auto blocker = d.Submit(long_one);  // runs while turn 2 waits
    const SchedulerStats before = d.scheduler().Stats();
    auto second = d.Submit(Turn(Turn2Prompt(first->tokens)));
    ASSERT_TRUE(d.Wait({blocker, second}));
    EXPECT_TRUE(second->error.ok()) << second->error;
    EXPECT_EQ(second->tokens, Fresh(first->tokens)) << AbslUnparseFlag(policy);
    EXPECT_GE(second->cached_prompt_tokens, 96);
    auto last = d.Submit(Turn(Prompt(20, 7500)));  // statistics catch up meanwhile
    ASSERT_TRUE(d.Wait({last}));
    const SchedulerStats after = d.scheduler().Stats();
    const int64_t disk_hits = after.disk_hit_tokens_total - before.disk_hit_tokens_total;
    const int64_t prefetched =
        after.disk_prefetched_blocks_total - before.disk_prefetched_blocks_total;
    const int64_t outside =
        after.admission_loads_outside_window_total - before.admission_loads_outside_window_total;
    const int64_t in_window =
        after.admission_loads_prefetching_total - before.admission_loads_prefetching_total +
        after.admission_loads_not_prefetched_total - before.admission_loads_not_prefetched_total;
    if (policy == KvEviction::kSchedulerAware && window > 0) {
      EXPECT_GE(prefetched, 6) << "the queued turn's history was not prefetched";
      EXPECT_EQ(disk_hits, 0) << "turn 2 still read its history at admission";
      EXPECT_EQ(outside + in_window, 0);
    } else {
      EXPECT_EQ(prefetched, 0);
      EXPECT_GE(disk_hits, 96);
      // Only scheduler-aware placement says why DRAM missed: turn 2 was outside the window.
      EXPECT_EQ(outside, policy == KvEviction::kSchedulerAware ? disk_hits / 16 : 0);
      EXPECT_EQ(in_window, 0);
    }
  }
}

// Delayed write-back on fill (HILOS): a running request's blocks go to disk one by one as
// they fill during decode: the node's save count is seen between none and all of them.
TEST_F(DiskTierTest, SaveOnFillWritesEachBlockAsItFills) {
  Topology t{1, 1};
  t.disk_dir = DiskDir("save_on_fill");
  t.disk_save_on_fill = true;
  Deployment d(weights_, t, 2048);
  GenerateRequest long_one = Turn(Prompt(100, 7600));
  long_one.max_tokens = 600;
  auto o = d.Submit(long_one);
  std::vector<uint64_t> seen;
  for (int i = 0; i < 4000 && (seen.empty() || seen.back() < 30); ++i) {
    const std::optional<KvDiskTierStats> s = d.disk().stats();
    if (s) seen.push_back(s->saves);
    absl::SleepFor(absl::Milliseconds(2));
  }
  ASSERT_TRUE(d.Wait({o}));
  ASSERT_TRUE(o->error.ok()) << o->error;
  auto last = d.Submit(Turn(Prompt(20, 7700)));
  ASSERT_TRUE(d.Wait({last}));
  // 700 positions: 43 full blocks, each written once. The last saves may still be on their
  // way to the disk (on loaded cores they were, once in a full run of the suite).
  uint64_t final_saves = 0;
  for (int i = 0; i < 1000 && final_saves < 43; ++i) {
    final_saves = d.disk().stats()->saves;
    if (final_saves < 43) absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_GE(final_saves, 43u);
  bool progressive = false;
  for (uint64_t s : seen) progressive = progressive || (s >= 6 && s < 43);
  EXPECT_TRUE(progressive) << "the blocks were not written as they filled";
  EXPECT_EQ(d.scheduler().Stats().disk_failed_saves_total, 0);
}

TEST_F(DiskTierTest, ACorruptedBlockIsDetectedNeverServedAndRecomputed) {
  Topology t{1, 1};
  t.disk_dir = DiskDir("corrupt");
  const std::string blocks = t.disk_dir + "/memory-0/blocks";
  const Turns turns = Converse(t, [&] { FlipEveryBlock(blocks); });
  EXPECT_EQ(turns.turn2_output, Fresh(turns.turn1_output));
  EXPECT_GT(turns.stats.disk_failed_loads_total, 0);
  EXPECT_EQ(turns.stats.disk_hit_tokens_total, 0);
  ASSERT_TRUE(turns.disk.has_value());
  EXPECT_GT(turns.disk->checksum_failures, 0u);
}

// Persisted KV is user data: blocks idle past the TTL are deleted from the disk (punched
// out by the node), and the next turn is computed again.
TEST_F(DiskTierTest, BlocksIdlePastTheTtlAreDeleted) {
  Topology t{1, 1};
  t.disk_dir = DiskDir("ttl");
  t.disk_ttl = absl::Seconds(1);
  const Turns turns = Converse(t, [] { absl::SleepFor(absl::Seconds(3.5)); });
  EXPECT_EQ(turns.turn2_output, Fresh(turns.turn1_output));
  EXPECT_GT(turns.stats.disk_expired_blocks_total, 0);
  EXPECT_EQ(turns.stats.disk_hit_tokens_total, 0);
  ASSERT_TRUE(turns.disk.has_value());
  EXPECT_GT(turns.disk->drops, 0u);
}

// A request that times out while its prefix loads from a slow disk ends with the timeout as
// soon as the loads are back, without computing a row; the deployment goes on serving.
// With layer-wise pre-loading its new tokens may have computed meanwhile (their result is
// discarded with the request).
TEST_F(DiskTierTest, ATimeoutWhileLoadingEndsTheRequestWithoutComputingIt) {
  for (const bool layerwise : {false, true}) {
    Topology t{1, 1};
    t.disk_dir = DiskDir(layerwise ? "timeout_layerwise" : "timeout");
    t.disk_load_delay = absl::Seconds(2);
    t.disk_layerwise = layerwise;
    Deployment d(weights_, t, 160);
    auto first = d.Submit(Turn(Prompt(100, 7000)));
    ASSERT_TRUE(d.Wait({first}));
    for (int i = 0; i < 3; ++i) {
      auto other = d.Submit(Turn(Prompt(100, 7100 + i)));
      ASSERT_TRUE(d.Wait({other}));
    }
    const SchedulerStats before = d.scheduler().Stats();
    GenerateRequest turn2 = Turn(Turn2Prompt(first->tokens));
    turn2.timeout = absl::Milliseconds(500);
    auto second = d.Submit(std::move(turn2));
    ASSERT_TRUE(d.Wait({second}));
    EXPECT_TRUE(absl::IsDeadlineExceeded(second->error)) << second->error;
    // The deployment goes on (and its statistics, published after each batch, catch up).
    auto next = d.Submit(Turn(Prompt(40, 7200)));
    ASSERT_TRUE(d.Wait({next}));
    EXPECT_TRUE(next->error.ok()) << next->error;
    EXPECT_EQ(next->tokens.size(), 8u);
    const SchedulerStats after = d.scheduler().Stats();
    EXPECT_GT(after.disk_loaded_blocks_total + after.disk_failed_loads_total,
              before.disk_loaded_blocks_total + before.disk_failed_loads_total)
        << "it never loaded: the test did not test a timeout during loads";
    // Only the next request's 40 prompt rows were computed, none of the timed-out one's.
    if (!layerwise) EXPECT_LE(after.prefill_rows_total - before.prefill_rows_total, 40);
  }
}

// Preemption under a small pool: the preempted requests' blocks are saved, and they come
// back from disk when readmitted (swap, not recompute). Greedy and seeded output, n = 2
// included, is bit-identical to a pool that never runs out.
TEST_F(DiskTierTest, PreemptedRequestsComeBackFromDiskBitIdentical) {
  const std::vector<GenerateRequest> requests = MixedRequests(40, 600, 910);
  auto run = [&](const Topology& t, int64_t slots, SchedulerStats* stats) {
    Deployment d(weights_, t, slots);
    std::vector<std::shared_ptr<Outcome>> outcomes;
    for (const GenerateRequest& r : requests) outcomes.push_back(d.Submit(r));
    EXPECT_TRUE(d.Wait(outcomes));
    auto last = d.Submit(Turn(Prompt(20, 7300)));  // statistics catch up meanwhile
    EXPECT_TRUE(d.Wait({last}));
    *stats = d.scheduler().Stats();
    return outcomes;
  };
  SchedulerStats free_stats, tight_stats;
  const auto free_run = run(Topology{1, 1}, 4096, &free_stats);
  Topology t{1, 1};
  t.disk_dir = DiskDir("preempt");
  const auto tight = run(t, 400, &tight_stats);
  EXPECT_EQ(free_stats.num_preemptions_total, 0);
  EXPECT_GT(tight_stats.num_preemptions_total, 0) << "the pool never ran out";
  EXPECT_EQ(tight_stats.planner_shortfalls_total, 0);
  EXPECT_GT(tight_stats.disk_loaded_blocks_total, 0) << "no preempted request came back from disk";
  EXPECT_EQ(tight_stats.disk_failed_loads_total, 0);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_TRUE(tight[i]->error.ok()) << i << ": " << tight[i]->error;
    EXPECT_EQ(tight[i]->by_sample, free_run[i]->by_sample) << "request " << i;
    EXPECT_EQ(tight[i]->by_sample.size(), static_cast<size_t>(requests[i].n));
  }
}

// The swap-or-recompute rule (load_rule.h): once a pool has seen that its disk returns
// loads more slowly than prompts compute, a prefix found there is recomputed instead, with
// the same output; with the rule off it is always read.
TEST_F(DiskTierTest, APrefixOnADiskSlowerThanPrefillIsRecomputed) {
  for (const bool rule : {true, false}) {
    Topology t{1, 1};
    t.disk_dir = DiskDir(rule ? "rule_on" : "rule_off");
    t.disk_load_delay = absl::Milliseconds(400);  // per batch: far slower than tiny's prefill
    t.disk_load_when_faster = rule;
    Deployment d(weights_, t, 160);
    SchedulerStats stats;
    for (uint32_t conversation = 0; conversation < 2; ++conversation) {
      SecondTurnAfterDramMoves(d, 8000 + conversation, 8100 + 10 * conversation);
    }
    auto last = d.Submit(Turn(Prompt(20, 8200)));  // statistics catch up meanwhile
    ASSERT_TRUE(d.Wait({last}));
    stats = d.scheduler().Stats();
    // The first conversation's history is read (nothing measured yet) either way.
    EXPECT_GE(stats.disk_loaded_blocks_total, 6) << "rule " << rule;
    if (rule) {
      EXPECT_GE(stats.disk_recomputed_blocks_total, 6) << "the slow disk was read again";
      EXPECT_LT(stats.disk_loaded_blocks_total, 12);
    } else {
      EXPECT_EQ(stats.disk_recomputed_blocks_total, 0);
      EXPECT_GE(stats.disk_loaded_blocks_total, 12);
    }
  }
}

// A disk that stays slower than the load deadline: the swap-or-recompute rule learns from the
// batch that ran out of its deadline, and the next conversation's prefix is recomputed
// without waiting the deadline out on the disk again.
TEST_F(DiskTierTest, ALoadThatRanOutOfItsDeadlineTeachesTheRule) {
  Topology t{1, 1};
  t.disk_dir = DiskDir("late_rule");
  t.disk_load_delay = absl::Milliseconds(300);
  t.disk_load_deadline = absl::Milliseconds(100);
  t.disk_load_when_faster = true;
  Deployment d(weights_, t, 160);
  std::vector<int64_t> failed;
  for (uint32_t conversation = 0; conversation < 2; ++conversation) {
    SecondTurnAfterDramMoves(d, 8500 + conversation, 8600 + 10 * conversation);
    auto last = d.Submit(Turn(Prompt(20, 8700 + conversation)));  // statistics catch up
    ASSERT_TRUE(d.Wait({last}));
    failed.push_back(d.scheduler().Stats().disk_failed_loads_total);
  }
  EXPECT_GT(failed[0], 0) << "the first conversation's load was not late";
  EXPECT_EQ(failed[1], failed[0]) << "the second conversation waited on the slow disk again";
  EXPECT_GE(d.scheduler().Stats().disk_recomputed_blocks_total, 6);
}

// A disk slower than the load deadline: the loads fail unapplied, and the next turn is
// recomputed, equal to a fresh run, without an error.
TEST_F(DiskTierTest, ASlowDiskDegradesToRecomputingAndFailsNothing) {
  Topology t{1, 1};
  t.disk_dir = DiskDir("slow");
  t.disk_load_delay = absl::Milliseconds(300);
  t.disk_load_deadline = absl::Milliseconds(50);
  const Turns turns = Converse(t, nullptr);
  ASSERT_EQ(turns.turn2_output.size(), 8u);
  EXPECT_EQ(turns.turn2_output, Fresh(turns.turn1_output));
  EXPECT_GT(turns.stats.disk_failed_loads_total, 0);
  EXPECT_EQ(turns.stats.disk_hit_tokens_total, 0);
  EXPECT_EQ(turns.turn2_cached, 0);
  ASSERT_TRUE(turns.disk.has_value());
  EXPECT_EQ(turns.disk->bytes_read, 0u) << "the late loads ran";
  // Late says nothing about the blocks: they stay on disk (they used to be dropped, and
  // counted as failed reads).
  ASSERT_FALSE(turns.stats.pools.empty());
  ASSERT_TRUE(turns.stats.pools[0].has_disk);
  EXPECT_EQ(turns.stats.pools[0].disk.failed_reads, 0);
  EXPECT_EQ(turns.disk->drops, 0u) << "a late load punched its block";
}

TEST_F(DiskTierTest, AFullDiskDegradesToNotCachedAndFailsNothing) {
  const std::string dir = DiskDir("full");
  // A 48 KiB disk (a tmpfs this test mounts; root only) under a 64 MiB budget: the first
  // blocks fit, the rest fail with ENOSPC.
  if (mount("strata-disk-tier-test", dir.c_str(), "tmpfs", 0, "size=48k,mode=0700") != 0) {
    GTEST_SKIP() << "cannot mount a small tmpfs here: " << std::strerror(errno);
  }
  struct Unmount {
    std::string dir;
    ~Unmount() { umount2(dir.c_str(), MNT_DETACH); }
  } unmount{dir};
  Topology t{1, 1};
  t.disk_dir = dir;
  const Turns turns = Converse(t, nullptr);
  ASSERT_EQ(turns.turn2_output.size(), 8u);
  EXPECT_EQ(turns.turn2_output, Fresh(turns.turn1_output));
  EXPECT_GT(turns.stats.disk_failed_saves_total, 0);
  ASSERT_TRUE(turns.disk.has_value());
  EXPECT_GT(turns.disk->failed_saves, 0u);
}

}  // namespace
}  // namespace strata
