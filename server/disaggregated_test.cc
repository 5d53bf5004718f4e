// Attention offloading in one process: the scheduler, compute engines with remote attention
// and real memory servers, connected by a real transport (in-process queues, or UCX over
// loopback TCP). Greedy outputs must be bit-identical to co-located attention for every
// topology, policy and mini-batching, and a memory node that dies mid-generation only
// moves its requests.
#include <fcntl.h>
#include <sys/mount.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <random>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/logging.h"
#include "compute_node/attention_backend.h"
#include "compute_node/context_exchange.h"
#include "compute_node/model_runner.h"
#include "compute_node/model_weights.h"
#include "compute_node/remote_attention.h"
#include "compute_node/rotation.h"
#include "compute_node/step_engine.h"
#include "compute_node/testing/generated_weights.h"
#include "gtest/gtest.h"
#include "memory_node/kv_disk_host.h"
#include "memory_node/memory_server.h"
#include "server/rotation_group.h"
#include "server/scheduler.h"
#include "server/testing/in_process_executor.h"
#include "server/testing/in_process_kv_mover.h"

namespace strata {
namespace {

struct Outcome {
  std::vector<int32_t> tokens;
  std::map<uint32_t, std::vector<int32_t>> by_sample;  // n > 1: each sample's tokens
  absl::Status error;
  bool done = false;
  int64_t cached_prompt_tokens = 0;
};

struct Topology {
  int memory_nodes = 0;  // 0: co-located
  int compute_nodes = 1;
  std::string backend = "inproc";
  std::string prefill_policy = "split";
  int minibatches = 2;
  // Plans a compute node holds at once; above 1, steps carry at most 4 sequences so that a
  // second plan has sequences of its own.
  int plans_in_flight = 1;
  // Asynchronous scheduling (two plans in flight, the second naming the tokens the first
  // samples).
  bool async = false;
  // Two batches in flight (--pipelining=two): the engine has two lanes.
  bool two = false;
  // Fixed staggered pipelining (--pipelining=fixed): one plan per compute node, starts
  // staggered across compute nodes.
  bool fixed = false;
  // Rotational pipelining (--pipelining=rotational): n = compute_nodes + 1 batches rotate
  // over the compute nodes, which form one rotation group.
  bool rotational = false;
  // Rotational: the last this many compute nodes join the group inactive (JoinLate).
  int late_replicas = 0;
  // A disk tier under each KV pool (each memory node's, or in co-located mode each compute
  // node's own cache), in its own subdirectory of this (empty: none).
  std::string disk_dir;
  uint64_t disk_budget_bytes = 64ull << 20;
  absl::Duration disk_ttl = absl::Hours(1);
  // How long each batch of loads takes at least (a slow disk), and how long the scheduler's
  // side waits for one (as GrpcKvMover's load deadline).
  absl::Duration disk_load_delay = absl::ZeroDuration();
  absl::Duration disk_load_deadline = absl::InfiniteDuration();
  bool disk_load_when_faster = true;  // SchedulerConfig::disk_load_when_faster
};

std::string Name(const Topology& t) {
  return absl::StrCat(t.memory_nodes, "mem_", t.compute_nodes, "cmp_", t.backend, "_",
                      t.prefill_policy, "_mb", t.minibatches, "_k", t.plans_in_flight,
                      t.async ? "_async" : "", t.two ? "_two" : "", t.fixed ? "_fixed" : "",
                      t.rotational ? "_rotational" : "");
}

int instance = 0;

class Deployment {
 public:
  Deployment(const ModelWeights* weights, const Topology& t, int64_t slots_per_pool)
      : weights_(weights), topology_(t) {
    SchedulerConfig config;
    config.max_model_len = 1024;
    config.max_num_batched_tokens = 256;
    config.max_prefill_tokens = 256;
    config.prefill_chunk_tokens = 64;
    config.max_num_seqs = t.plans_in_flight > 1 && !t.async && !t.two ? 4 : 16;
    config.max_plans_in_flight =
        t.async || t.two ? std::max(t.plans_in_flight, 2) : t.plans_in_flight;
    config.async_scheduling = t.async;
    if (t.two) config.pipelining = Pipelining::kTwo;
    if (t.fixed) config.pipelining = Pipelining::kFixed;
    if (t.rotational) {
      config.pipelining = Pipelining::kRotational;
      config.max_plans_in_flight = t.compute_nodes + 1;
      config.max_num_seqs = 16;
      group_ = std::make_shared<RotationGroup>(config.max_plans_in_flight,
                                               static_cast<int>(weights->config.num_layers));
    }
    config.block_tokens = 16;
    config.disk_ttl = t.disk_ttl;
    config.disk_load_when_faster = t.disk_load_when_faster;
    config.vocab_size = static_cast<int32_t>(weights->config.vocab_size);
    config.epoch = 42;
    scheduler_ = std::make_unique<Scheduler>(config, nullptr);
    const ModelConfig& c = weights->config;
    transport::TransportConfig tc;
    std::string error;
    CHECK(AbslParseFlag(t.backend, &tc.backend, &error)) << error;
    if (t.backend == "ucx") tc.ucx_options = {{"TLS", "tcp"}, {"NET_DEVICES", "lo"}};
    std::vector<MemoryNodeAddress> addresses;
    for (int i = 0; i < t.memory_nodes; ++i) {
      MemoryServerOptions options;
      options.transport = tc;
      options.data_address =
          t.backend == "inproc" ? absl::StrCat("memory-", ++instance) : "127.0.0.1:0";
      options.prefault_kv = false;
      if (!t.disk_dir.empty()) {
        options.disk.dir = absl::StrCat(t.disk_dir, "/memory-", i);
        options.disk.budget_bytes = t.disk_budget_bytes;
        options.disk.staging_bytes = 4 << 20;
        options.disk.allow_buffered = true;  // a test's tmpfs
      }
      auto server = MemoryServer::Create(options);
      EXPECT_TRUE(server.ok()) << server.status();
      MemoryConfig mc;
      mc.epoch = 42;
      mc.pool = PoolIndex(i);
      mc.model.name = "tiny";
      mc.model.num_layers = c.num_layers;
      mc.model.num_heads = c.num_heads;
      mc.model.num_kv_heads = c.num_kv_heads;
      mc.model.head_dim = c.head_dim;
      mc.model.kv_dtype = "bf16";
      mc.num_slots = slots_per_pool;
      mc.disk_block_tokens = t.disk_dir.empty() ? 0 : config.block_tokens;
      auto ack = (*server)->Configure(mc);
      EXPECT_TRUE(ack.ok()) << ack.status();
      addresses.push_back({PoolIndex(i), absl::StrCat("memory-", i), (*server)->data_address()});
      const PoolIndex pool = scheduler_->AddPool(absl::StrCat("memory-", i), slots_per_pool);
      if (!t.disk_dir.empty()) {
        EXPECT_GT(ack->disk.extents, 0u) << "no disk tier";
        scheduler_->SetPoolDisk(
            pool, static_cast<int64_t>(ack->disk.extents),
            std::make_shared<InProcessKvMover>(
                [server = server->get(), tier = ack->disk.tier, delay = t.disk_load_delay,
                 wait = t.disk_load_deadline](std::span<const KvMove> moves) {
                  absl::Time deadline = absl::InfiniteFuture();
                  if (!moves.empty() && moves[0].kind == KvMove::Kind::kLoad) {
                    deadline = absl::Now() + wait;
                    absl::SleepFor(delay);
                  }
                  return server->MoveKv(42, tier, moves, deadline);
                }));
      }
      memory_.push_back(std::move(*server));
    }
    for (int i = 0; i < t.compute_nodes; ++i) {
      auto runner = std::make_unique<ModelRunner>(weights, config.max_model_len);
      std::vector<AttentionBackend*> lanes;
      std::optional<PoolIndex> local_pool;
      if (t.memory_nodes == 0) {
        auto local = std::move(*LocalAttention::Create(c, slots_per_pool, false));
        LocalAttention* cache = local.get();
        attention_.push_back(std::move(local));
        lanes.push_back(attention_.back().get());
        local_pool = scheduler_->AddPool(absl::StrCat("local-", i), slots_per_pool);
        if (!t.disk_dir.empty()) {
          // The disk tier under the compute node's own cache, as ComputeNode opens it.
          KvDiskTierOptions options;
          options.dir = absl::StrCat(t.disk_dir, "/compute-", i);
          options.budget_bytes = t.disk_budget_bytes;
          options.staging_bytes = 4 << 20;
          options.allow_buffered = true;  // a test's tmpfs
          local_disks_.push_back(std::make_unique<KvDiskHost>(options));
          KvDiskHost* host = local_disks_.back().get();
          auto tier = host->Open(42, &cache->engine().mutable_store(), config.block_tokens,
                                 "tiny co-located");
          EXPECT_TRUE(tier.ok()) << tier.status();
          if (tier.ok()) {
            scheduler_->SetPoolDisk(*local_pool, static_cast<int64_t>(tier->extents),
                                    std::make_shared<InProcessKvMover>(
                                        [host, id = tier->tier](std::span<const KvMove> moves) {
                                          return host->Move(42, id, moves);
                                        }));
          }
        }
      } else if (t.rotational) {
        // A replica: its context exchange and one routed lane per batch slot.
        wakeups_.push_back(std::make_unique<Wakeup>());
        Wakeup* wakeup = wakeups_.back().get();
        ContextExchangeOptions eo;
        eo.transport = tc;
        eo.listen_address =
            t.backend == "inproc" ? absl::StrCat("replica-", ++instance) : "127.0.0.1:0";
        eo.hidden = c.hidden_size;
        eo.on_arrival = [wakeup] { wakeup->Notify(); };
        auto exchange = ContextExchange::Create(eo);
        EXPECT_TRUE(exchange.ok()) << exchange.status();
        (*exchange)->SetEpoch(42);
        for (int slot = 0; slot < config.max_plans_in_flight; ++slot) {
          RemoteAttentionOptions options;
          options.transport = tc;
          options.prefill_policy = PrefillPolicy::kMemory;
          options.minibatches = t.minibatches;
          options.min_minibatch_rows = 1;
          options.layer_timeout = absl::Seconds(20);
          options.endpoint = RotationEndpoint((*exchange)->address(), slot);
          options.on_settled = [wakeup] { wakeup->Notify(); };
          auto remote = RemoteAttention::Create(c, options);
          EXPECT_TRUE(remote.ok()) << remote.status();
          (*remote)->SetMemoryNodes(42, addresses);
          (*remote)->ConnectAll();
          attention_.push_back(std::move(*remote));
          lanes.push_back(attention_.back().get());
        }
        exchanges_.push_back(std::move(*exchange));
      } else {
        RemoteAttentionOptions options;
        options.transport = tc;
        CHECK(AbslParseFlag(t.prefill_policy, &options.prefill_policy, &error)) << error;
        options.minibatches = t.minibatches;
        options.min_minibatch_rows = 1;  // small test batches still split
        options.layer_timeout = absl::Seconds(20);
        // Each lane has a data plane of its own, as on a compute node.
        for (int lane = 0; lane < (t.two ? 2 : 1); ++lane) {
          auto remote = RemoteAttention::Create(c, options);
          EXPECT_TRUE(remote.ok()) << remote.status();
          (*remote)->SetMemoryNodes(42, addresses);
          attention_.push_back(std::move(*remote));
          lanes.push_back(attention_.back().get());
        }
      }
      auto engine = std::make_unique<StepEngine>(
          runner.get(), lanes,
          StepEngineOptions{config.max_num_batched_tokens, config.max_model_len});
      if (t.rotational) {
        RotationDriverOptions rotation;
        rotation.exchange = exchanges_.back().get();
        rotation.wakeup = wakeups_.back().get();
        rotation.handoff_timeout = absl::Seconds(20);
        const bool late = i >= t.compute_nodes - t.late_replicas;
        group_->AddReplica(absl::StrCat("compute-", i), exchanges_.back()->address(),
                           std::make_shared<InProcessExecutor>(absl::StrCat("compute-", i),
                                                               engine.get(), rotation),
                           /*active=*/!late);
        if (late) late_.push_back(absl::StrCat("compute-", i));
      } else {
        scheduler_->AddExecutor(
            std::make_unique<InProcessExecutor>(absl::StrCat("compute-", i), engine.get()),
            local_pool);
      }
      runners_.push_back(std::move(runner));
      engines_.push_back(std::move(engine));
    }
    if (group_ != nullptr) group_index_ = scheduler_->AddExecutor(ForwardTo(group_), std::nullopt);
    scheduler_->SetObserver(observer_);
    scheduler_->Start();
  }
  ~Deployment() {
    scheduler_->Stop();
    scheduler_.reset();  // executors first: their threads use the wakeups and exchanges
    group_.reset();
    memory_.clear();
  }
  // Rotational: the late replicas join now, as the control plane has one join (the
  // scheduler resends the running requests' set-ups, then the group activates them).
  void JoinLate() {
    for (const std::string& name : late_) {
      std::shared_ptr<RotationGroup> group = group_;
      scheduler_->ResendSetups(group_index_, [group, name] { group->ActivateReplica(name); });
    }
  }
  uint64_t StepsOf(int compute_node) const { return engines_[compute_node]->steps_executed(); }
  // Contexts handed between replicas (rotational), and frames the exchanges refused.
  uint64_t ContextsMoved() const {
    uint64_t n = 0;
    for (const auto& e : exchanges_) n += e->stats().received;
    return n;
  }
  uint64_t ContextsRefused() const {
    uint64_t n = 0;
    for (const auto& e : exchanges_) n += e->stats().rejected + e->stats().stale;
    return n;
  }

  std::shared_ptr<Outcome> Submit(GenerateRequest req) {
    auto outcome = std::make_shared<Outcome>();
    auto id = scheduler_->Submit(std::move(req), [this, outcome](const RequestUpdate& u) {
      std::lock_guard<std::mutex> lock(mu_);
      for (const SequenceUpdate& s : u.sequences) {
        outcome->tokens.insert(outcome->tokens.end(), s.tokens.begin(), s.tokens.end());
        auto& sample = outcome->by_sample[s.index];
        sample.insert(sample.end(), s.tokens.begin(), s.tokens.end());
      }
      outcome->cached_prompt_tokens = u.cached_prompt_tokens;
      if (u.finished) {
        outcome->done = true;
        outcome->error = u.error;
        cv_.notify_all();
      }
    });
    EXPECT_TRUE(id.ok()) << id.status();
    return outcome;
  }

  bool Wait(const std::vector<std::shared_ptr<Outcome>>& outcomes) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoNanoseconds(absl::Seconds(240)), [&] {
      for (const auto& o : outcomes) {
        if (!o->done) return false;
      }
      return true;
    });
  }

  Scheduler& scheduler() { return *scheduler_; }
  std::vector<std::unique_ptr<MemoryServer>>& memory() { return memory_; }
  // The first KV pool's disk tier: memory node 0's, or co-located, compute node 0's.
  const KvDiskHost& disk() const {
    return memory_.empty() ? *local_disks_.front() : memory_.front()->disk();
  }
  // Steps that began while another lane's step ran, over every compute node.
  uint64_t OverlappedSteps() const {
    uint64_t n = 0;
    for (const auto& e : engines_) n += e->overlapped_steps();
    return n;
  }
  SchedulerObserver observer_;

 private:
  const ModelWeights* weights_;
  Topology topology_;
  std::unique_ptr<Scheduler> scheduler_;
  std::vector<std::unique_ptr<MemoryServer>> memory_;
  std::vector<std::unique_ptr<ModelRunner>> runners_;
  std::vector<std::unique_ptr<AttentionBackend>> attention_;
  std::vector<std::unique_ptr<KvDiskHost>> local_disks_;  // co-located: over attention_'s
  std::vector<std::unique_ptr<StepEngine>> engines_;
  std::vector<std::unique_ptr<Wakeup>> wakeups_;
  std::vector<std::unique_ptr<ContextExchange>> exchanges_;
  std::shared_ptr<RotationGroup> group_;
  int group_index_ = -1;
  std::vector<std::string> late_;
  std::mutex mu_;
  std::condition_variable cv_;
};

class DisaggregatedTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto weights = GenerateAndLoadWeights("tiny-gqa", "disaggregated_model");
    ASSERT_TRUE(weights.ok()) << weights.status();
    weights_ = weights->release();
  }
  static void TearDownTestSuite() { delete weights_; }

  static std::vector<int32_t> Prompt(int n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> p;
    for (int i = 0; i < n; ++i) p.push_back(3 + rng() % 31000);
    return p;
  }

  // Mixed prompt lengths (within one tile, across tiles, many chunks), two requests that
  // share a 150-token prefix (prefix reuse: the second starts mid-tile), and n = 2.
  static std::vector<GenerateRequest> Workload() {
    std::vector<GenerateRequest> out;
    const std::vector<int> lengths = {5, 63, 64, 65, 129, 300, 17};
    for (size_t i = 0; i < lengths.size(); ++i) {
      GenerateRequest r;
      r.prompt_tokens = Prompt(lengths[i], 10 + i);
      r.sampling.temperature = 0.0f;
      r.max_tokens = 14;
      r.ignore_eos = true;
      out.push_back(r);
    }
    std::vector<int32_t> shared = Prompt(150, 99);
    for (int i = 0; i < 2; ++i) {
      GenerateRequest r;
      r.prompt_tokens = shared;
      const auto tail = Prompt(20 + 30 * i, 200 + i);
      r.prompt_tokens.insert(r.prompt_tokens.end(), tail.begin(), tail.end());
      r.sampling.temperature = 0.0f;
      r.max_tokens = 10;
      r.ignore_eos = true;
      out.push_back(r);
    }
    return out;
  }

  static std::vector<std::vector<int32_t>> Run(const Topology& t,
                                               const std::vector<GenerateRequest>& requests) {
    Deployment d(weights_, t, 2048);
    std::vector<std::shared_ptr<Outcome>> outcomes;
    // All but the last at once; the last shares a prefix with the one before it and comes
    // once that one is done, so that it starts from cached KV in the middle of a tile.
    for (size_t i = 0; i + 1 < requests.size(); ++i) outcomes.push_back(d.Submit(requests[i]));
    EXPECT_TRUE(d.Wait(outcomes)) << Name(t) << ": requests did not finish";
    outcomes.push_back(d.Submit(requests.back()));
    EXPECT_TRUE(d.Wait(outcomes)) << Name(t) << ": requests did not finish";
    EXPECT_GE(outcomes.back()->cached_prompt_tokens, 144) << Name(t) << ": no prefix reuse";
    // Two batches in flight really ran side by side, and only then.
    if (t.two) {
      EXPECT_GT(d.OverlappedSteps(), 5u) << Name(t) << ": the lanes never overlapped";
    } else if (t.rotational) {
      EXPECT_GT(d.ContextsMoved(), 20u) << Name(t) << ": no context moved between replicas";
      EXPECT_EQ(d.ContextsRefused(), 0u) << Name(t);
    } else {
      EXPECT_EQ(d.OverlappedSteps(), 0u) << Name(t);
    }
    std::vector<std::vector<int32_t>> tokens;
    for (const auto& o : outcomes) {
      EXPECT_TRUE(o->error.ok()) << Name(t) << ": " << o->error;
      tokens.push_back(o->tokens);
    }
    return tokens;
  }

  static ModelWeights* weights_;
};

ModelWeights* DisaggregatedTest::weights_ = nullptr;

TEST_F(DisaggregatedTest, GreedyOutputsAreBitIdenticalToCoLocated) {
  const auto requests = Workload();
  const auto reference = Run(Topology{}, requests);
  for (const auto& tokens : reference) ASSERT_EQ(tokens.size() >= 10, true);
  std::vector<Topology> topologies = {
      {1, 1, "inproc", "split", 2},
      {2, 1, "inproc", "split", 2},
      {3, 1, "inproc", "split", 3},
      {2, 1, "inproc", "memory", 1},
      {2, 2, "inproc", "split", 2},
      {2, 1, "ucx", "split", 2},
      {0, 1, "inproc", "split", 2, 2},
      {2, 1, "inproc", "split", 2, 2},
      {2, 2, "inproc", "split", 2, 2},
      {0, 1, "inproc", "split", 2, 2, true},
      {2, 1, "inproc", "split", 2, 2, true},
      {2, 2, "inproc", "split", 2, 2, true},
      {2, 1, "ucx", "split", 2, 2, true},
      // Two batches in flight on each compute node.
      {1, 1, "inproc", "split", 2, 2, false, true},
      {2, 1, "inproc", "split", 2, 2, false, true},
      {2, 1, "inproc", "memory", 1, 2, false, true},
      {2, 2, "inproc", "split", 2, 2, false, true},
      {2, 1, "ucx", "split", 2, 2, false, true},
      // Fixed staggered pipelining: compute nodes sharing the memory nodes take turns.
      {2, 2, "inproc", "split", 2, 1, false, false, true},
      {1, 3, "inproc", "split", 2, 1, false, false, true},
      {2, 2, "ucx", "split", 2, 1, false, false, true},
      // Rotational pipelining: n = 3 and n = 4 batches over 2 and 3 replicas.
      {2, 2, "inproc", "memory", 2, 1, false, false, false, true},
      {1, 3, "inproc", "memory", 1, 1, false, false, false, true},
      {2, 3, "ucx", "memory", 2, 1, false, false, false, true},
  };
  for (const Topology& t : topologies) {
    const auto got = Run(t, requests);
    ASSERT_EQ(got.size(), reference.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i], reference[i]) << Name(t) << ", request " << i;
    }
  }
}

// Two batches in flight, and rotational pipelining (n = 3 over 2 replicas), against one
// batch, on what makes plans differ: seeded sampling with penalties and n = 2, stop tokens,
// and a pool small enough to preempt and recompute.
TEST_F(DisaggregatedTest, TwoBatchesAreBitIdenticalWithSamplesStopsAndPreemption) {
  std::vector<GenerateRequest> requests;
  for (int i = 0; i < 8; ++i) {
    GenerateRequest r;
    r.prompt_tokens = Prompt(20 + 37 * i, 500 + i);
    r.max_tokens = 24 + 3 * i;
    r.ignore_eos = true;
    if (i % 2 == 0) {
      r.sampling.temperature = 0.9f;
      r.sampling.frequency_penalty = 0.5f;
      r.sampling.seed = 900 + i;
      r.has_seed = true;
      r.n = 2;
    } else {
      r.sampling.temperature = 0.0f;
    }
    requests.push_back(r);
  }
  auto run = [&](const Topology& t, int64_t slots, int64_t* preemptions) {
    Deployment d(weights_, t, slots);
    std::vector<std::shared_ptr<Outcome>> outcomes;
    for (const GenerateRequest& r : requests) outcomes.push_back(d.Submit(r));
    EXPECT_TRUE(d.Wait(outcomes)) << Name(t);
    *preemptions = d.scheduler().Stats().num_preemptions_total;
    return outcomes;
  };
  // Stop tokens: each greedy request stops at the token it drew fifth in a free run.
  int64_t unused;
  const auto free_run = run(Topology{2, 1, "inproc", "split", 2, 1}, 4096, &unused);
  for (size_t i = 1; i < requests.size(); i += 2) {
    ASSERT_GE(free_run[i]->tokens.size(), 5u);
    requests[i].stop_token_ids = {free_run[i]->tokens[4]};
  }
  int64_t preempted_off = 0, preempted_two = 0, preempted_rotational = 0;
  const auto off = run(Topology{2, 1, "inproc", "split", 2, 1}, 400, &preempted_off);
  const auto two = run(Topology{2, 1, "inproc", "split", 2, 2, false, true}, 400, &preempted_two);
  const auto rotational = run(Topology{2, 2, "inproc", "memory", 2, 1, false, false, false, true},
                              400, &preempted_rotational);
  EXPECT_GT(preempted_off + preempted_two, 0) << "the pools never ran out";
  EXPECT_GT(preempted_rotational, 0) << "the pools never ran out under rotation";
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_TRUE(off[i]->error.ok()) << i << ": " << off[i]->error;
    EXPECT_TRUE(two[i]->error.ok()) << i << ": " << two[i]->error;
    EXPECT_TRUE(rotational[i]->error.ok()) << i << ": " << rotational[i]->error;
    EXPECT_EQ(two[i]->by_sample, off[i]->by_sample) << "request " << i;
    EXPECT_EQ(rotational[i]->by_sample, off[i]->by_sample) << "request " << i << ", rotational";
    EXPECT_EQ(off[i]->by_sample.size(), static_cast<size_t>(requests[i].n));
    if (i % 2 == 1) EXPECT_LE(off[i]->tokens.size(), 5u) << "request " << i << " did not stop";
  }
}

// A compute replica that joins a rotation while requests run: the scheduler sends their
// set-ups again (with their histories) before the group gives the replica plans, so no
// step fails, the new replica takes slices, and the output is the co-located one, seeded
// sampling with penalties and n = 2 included.
TEST_F(DisaggregatedTest, AReplicaJoiningARotationMidGenerationLosesNothing) {
  std::vector<GenerateRequest> requests;
  for (int i = 0; i < 6; ++i) {
    GenerateRequest r;
    r.prompt_tokens = Prompt(30 + 41 * i, 700 + i);
    r.max_tokens = 40;
    r.ignore_eos = true;
    if (i % 2 == 0) {
      r.sampling.temperature = 0.8f;
      r.sampling.frequency_penalty = 0.4f;
      r.sampling.seed = 70 + i;
      r.has_seed = true;
      r.n = 2;
    } else {
      r.sampling.temperature = 0.0f;
    }
    requests.push_back(r);
  }
  auto run = [&](const Topology& t, bool join) {
    Deployment d(weights_, t, 4096);
    std::mutex mu;
    int steps = 0, failed = 0;
    d.observer_.on_step = [&](const StepPlan&, const StepResult& r, absl::Duration) {
      std::lock_guard<std::mutex> lock(mu);
      ++steps;
      failed += !r.status.ok();
    };
    d.scheduler().SetObserver(d.observer_);
    std::vector<std::shared_ptr<Outcome>> outcomes;
    for (const GenerateRequest& r : requests) outcomes.push_back(d.Submit(r));
    if (join) {
      // Once decoding is under way.
      for (int i = 0; i < 2000; ++i) {
        {
          std::lock_guard<std::mutex> lock(mu);
          if (steps >= 30) break;
        }
        absl::SleepFor(absl::Milliseconds(2));
      }
      d.JoinLate();
    }
    EXPECT_TRUE(d.Wait(outcomes)) << Name(t);
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(failed, 0) << Name(t) << ": steps failed";
    if (join) EXPECT_GT(d.StepsOf(2), 0u) << "the replica that joined ran nothing";
    return outcomes;
  };
  const auto reference = run(Topology{}, false);
  Topology t{2, 3, "inproc", "memory", 2, 1, false, false, false, true};
  t.late_replicas = 1;
  const auto got = run(t, true);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_TRUE(got[i]->error.ok()) << i << ": " << got[i]->error;
    EXPECT_EQ(got[i]->by_sample, reference[i]->by_sample) << "request " << i;
    EXPECT_EQ(got[i]->by_sample.size(), static_cast<size_t>(requests[i].n));
  }
}

// Fixed staggered pipelining spaces step starts across compute nodes by the decode-step
// period over the number of nodes. The smoothed period is never below the shortest decode
// step seen so far, so no two starts may come closer than that over the node count. (With
// the stagger's gate removed, this test fails: the nodes then start together.)
TEST_F(DisaggregatedTest, FixedPipeliningStaggersTheComputeNodesStarts) {
  struct Step {
    absl::Time start, end;
    bool decode = false;  // every row decodes (what the stagger's period is made of)
  };
  const auto run = [&](bool fixed) {
    Topology t{1, 2, "inproc", "split", 1, 1, false, false, fixed};
    Deployment d(weights_, t, 4096);
    auto steps = std::make_shared<std::vector<Step>>();
    d.observer_.on_step = [steps](const StepPlan& plan, const StepResult&, absl::Duration wall) {
      const absl::Time now = absl::Now();
      bool decode = !plan.chunks.empty();
      for (const SequenceChunk& c : plan.chunks) decode = decode && c.tokens.size() == 1;
      steps->push_back({now - wall, now, decode});
    };
    d.scheduler().SetObserver(d.observer_);
    std::vector<std::shared_ptr<Outcome>> outcomes;
    for (int i = 0; i < 6; ++i) {
      GenerateRequest r;
      r.prompt_tokens = Prompt(40 + 10 * i, 300 + i);
      r.sampling.temperature = 0.0f;
      r.max_tokens = 24;
      r.ignore_eos = true;
      outcomes.push_back(d.Submit(r));
    }
    EXPECT_TRUE(d.Wait(outcomes));
    d.scheduler().Stop();
    return *steps;  // filled on the scheduler thread, which has stopped
  };
  // Counts consecutive starts closer than the bound (the shortest decode step finished
  // before the later start, over 2 nodes; 10% off for the observer's clock reading).
  const auto too_close = [](std::vector<Step> steps, int* checked) {
    std::sort(steps.begin(), steps.end(),
              [](const Step& a, const Step& b) { return a.start < b.start; });
    int close = 0;
    *checked = 0;
    for (size_t i = 1; i < steps.size(); ++i) {
      absl::Duration shortest = absl::InfiniteDuration();
      for (const Step& s : steps) {
        if (s.decode && s.end <= steps[i].start) shortest = std::min(shortest, s.end - s.start);
      }
      if (shortest == absl::InfiniteDuration()) continue;  // nothing measured yet
      ++*checked;
      if (steps[i].start - steps[i - 1].start < 0.9 * shortest / 2) ++close;
    }
    return close;
  };
  int checked = 0;
  const auto fixed = run(true);
  EXPECT_EQ(too_close(fixed, &checked), 0);
  EXPECT_GT(checked, 20);
}

TEST_F(DisaggregatedTest, ADeadMemoryNodeOnlyMovesItsRequests) {
  const auto requests = Workload();
  const auto reference = Run(Topology{}, requests);
  for (const Topology& t :
       {Topology{2, 1, "inproc", "split", 2, 1}, Topology{2, 1, "inproc", "split", 2, 2},
        Topology{2, 1, "inproc", "split", 2, 2, true},
        Topology{2, 1, "inproc", "split", 2, 2, false, true}}) {
    SCOPED_TRACE(Name(t));
    Deployment d(weights_, t, 2048);
    std::mutex mu;
    std::condition_variable cv;
    int steps = 0;
    d.observer_.on_step = [&](const StepPlan&, const StepResult&, absl::Duration) {
      std::lock_guard<std::mutex> lock(mu);
      ++steps;
      cv.notify_all();
    };
    d.scheduler().SetObserver(d.observer_);
    std::vector<std::shared_ptr<Outcome>> outcomes;
    for (const auto& r : requests) outcomes.push_back(d.Submit(r));
    {
      std::unique_lock<std::mutex> lock(mu);
      ASSERT_TRUE(cv.wait_for(lock, absl::ToChronoNanoseconds(absl::Seconds(60)),
                              [&] { return steps >= 6; }));
    }
    // Memory node 1 goes away mid-generation (its transport closes with it).
    d.memory()[1].reset();
    ASSERT_TRUE(d.Wait(outcomes));
    // Its requests were re-prefilled on memory node 0: every output is still exact.
    for (size_t i = 0; i < outcomes.size(); ++i) {
      EXPECT_TRUE(outcomes[i]->error.ok()) << "request " << i << ": " << outcomes[i]->error;
      EXPECT_EQ(outcomes[i]->tokens, reference[i]) << "request " << i;
    }
    const SchedulerStats stats = d.scheduler().Stats();
    ASSERT_EQ(stats.pools.size(), 2u);
    EXPECT_TRUE(stats.pools[0].alive);
    EXPECT_FALSE(stats.pools[1].alive);
    // And the scheduler keeps serving.
    auto later = d.Submit(requests[0]);
    ASSERT_TRUE(d.Wait({later}));
    EXPECT_EQ(later->tokens, reference[0]);
  }
}

TEST_F(DisaggregatedTest, LosingTheOnlyMemoryNodeFailsItsRequestsClearly) {
  for (const Topology& t :
       {Topology{1, 1, "inproc", "split", 1, 1}, Topology{1, 1, "inproc", "split", 1, 1, true},
        Topology{1, 1, "inproc", "split", 1, 2, false, true}}) {
    SCOPED_TRACE(Name(t));
    Deployment d(weights_, t, 2048);
    // Two requests, so that with two batches in flight both lanes hold one when it dies.
    std::vector<std::shared_ptr<Outcome>> outcomes;
    for (uint32_t seed : {3u, 4u}) {
      GenerateRequest r;
      r.prompt_tokens = Prompt(40, seed);
      r.sampling.temperature = 0.0f;
      r.max_tokens = 400;
      r.ignore_eos = true;
      outcomes.push_back(d.Submit(r));
    }
    for (int i = 0; i < 200 && outcomes[0]->tokens.size() < 3; ++i) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    d.memory()[0].reset();
    ASSERT_TRUE(d.Wait(outcomes));
    for (const auto& outcome : outcomes) {
      EXPECT_FALSE(outcome->error.ok());
      EXPECT_NE(std::string(outcome->error.message()).find("memory node"), std::string::npos)
          << outcome->error;
    }
  }
}

// The disk tier (AttentionStore's reuse across turns): a conversation's KV, saved to disk
// when its turn ends, is read back for its next turn after DRAM has been given to other
// requests, and the next turn's output is what a fresh run computes. Then the same with
// the blocks on disk corrupted (detected, never served, recomputed) and on a disk too full
// to hold them (not cached; nothing fails).
class DiskTierTest : public DisaggregatedTest {
 protected:
  // Turn 1 of a conversation, three other conversations that take the pool's DRAM (160
  // slots: ten blocks), then turn 2 (turn 1's prompt and output, and a new question).
  struct Turns {
    std::vector<int32_t> turn1_output, turn2_output;
    int64_t turn2_cached = 0;
    int64_t turn2_prefill_rows = 0;  // prompt rows computed for turn 2
    SchedulerStats stats;
    std::optional<KvDiskTierStats> disk;
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

TEST_F(DiskTierTest, ACorruptedBlockIsDetectedNeverServedAndRecomputed) {
  Topology t{1, 1};
  t.disk_dir = DiskDir("corrupt");
  const std::string blocks = t.disk_dir + "/memory-0/blocks";
  const Turns turns = Converse(t, [&] {
    // Flip a byte in every block's payload (past each extent's 4 KiB header).
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
  });
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
TEST_F(DiskTierTest, ATimeoutWhileLoadingEndsTheRequestWithoutComputingIt) {
  Topology t{1, 1};
  t.disk_dir = DiskDir("timeout");
  t.disk_load_delay = absl::Seconds(2);
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
  EXPECT_LE(after.prefill_rows_total - before.prefill_rows_total, 40);
}

// Preemption under a small pool: the preempted requests' blocks are saved, and they come
// back from disk when readmitted (swap, not recompute). Greedy and seeded output, n = 2
// included, is bit-identical to a pool that never runs out.
TEST_F(DiskTierTest, PreemptedRequestsComeBackFromDiskBitIdentical) {
  std::vector<GenerateRequest> requests;
  for (int i = 0; i < 8; ++i) {
    GenerateRequest r;
    r.prompt_tokens = Prompt(40 + 37 * i, 600 + i);
    r.max_tokens = 24 + 3 * i;
    r.ignore_eos = true;
    if (i % 2 == 0) {
      r.sampling.temperature = 0.9f;
      r.sampling.frequency_penalty = 0.5f;
      r.sampling.seed = 910 + i;
      r.has_seed = true;
      r.n = 2;
    } else {
      r.sampling.temperature = 0.0f;
    }
    requests.push_back(r);
  }
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
      auto first = d.Submit(Turn(Prompt(100, 8000 + conversation)));
      ASSERT_TRUE(d.Wait({first}));
      for (int i = 0; i < 3; ++i) {  // take the pool's DRAM
        auto other = d.Submit(Turn(Prompt(100, 8100 + 10 * conversation + i)));
        ASSERT_TRUE(d.Wait({other}));
      }
      std::vector<int32_t> prompt = Prompt(100, 8000 + conversation);
      prompt.insert(prompt.end(), first->tokens.begin(), first->tokens.end());
      auto second = d.Submit(Turn(prompt));
      ASSERT_TRUE(d.Wait({second}));
      EXPECT_TRUE(second->error.ok()) << second->error;
      Deployment fresh(weights_, Topology{1, 1}, 2048);
      auto reference = fresh.Submit(Turn(prompt));
      ASSERT_TRUE(fresh.Wait({reference}));
      EXPECT_EQ(second->tokens, reference->tokens) << "conversation " << conversation;
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
