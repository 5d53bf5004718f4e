// The whole deployment in one process, for tests: the scheduler, compute engines (local
// attention, remote attention over a real transport, or a rotation group), real memory
// servers, and disk tiers under the KV pools, in the topology a test asks for; and a
// fixture with the generated weights and request helpers. Used by
// //server:disaggregated_test and //server:disk_tier_test.
#ifndef STRATA_SERVER_IN_PROCESS_DEPLOYMENT_H_
#define STRATA_SERVER_IN_PROCESS_DEPLOYMENT_H_

#include <algorithm>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/logging.h"
#include "common/model/model_config.h"
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

namespace strata::in_process {

struct Outcome {
  std::vector<int32_t> tokens;
  std::map<uint32_t, std::vector<int32_t>> by_sample;  // n > 1: each sample's tokens
  std::vector<float> logprobs;  // of `tokens`, when the request asked for logprobs
  std::vector<std::vector<std::pair<int32_t, float>>> top_logprobs;  // of each of `tokens`
  absl::Time first_token = absl::InfinitePast();  // when the first tokens arrived
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
  bool disk_load_when_faster = true;          // SchedulerConfig::disk_load_when_faster
  bool disk_layerwise = true;                 // SchedulerConfig::disk_layerwise
  KvEviction kv_eviction = KvEviction::kLru;  // SchedulerConfig::kv_eviction
  int lookahead_requests = 32;                // SchedulerConfig::lookahead_requests
  int max_num_seqs = 0;                       // 0: as the topology implies
  bool disk_save_on_fill = false;             // SchedulerConfig::disk_save_on_fill
  int64_t max_model_len = 1024;               // SchedulerConfig::max_model_len
  // SchedulerConfig::context_overflow (the scheduler is given the model's RoPE frequencies).
  ContextOverflow context_overflow = ContextOverflow::kError;
};

inline std::string Name(const Topology& t) {
  return absl::StrCat(t.memory_nodes, "mem_", t.compute_nodes, "cmp_", t.backend, "_",
                      t.prefill_policy, "_mb", t.minibatches, "_k", t.plans_in_flight,
                      t.async ? "_async" : "", t.two ? "_two" : "", t.fixed ? "_fixed" : "",
                      t.rotational ? "_rotational" : "");
}

inline int deployment_instance = 0;  // names in-process endpoints

// `n` token ids drawn from [3, 31003) with `seed`: the same ids for the same seed.
inline std::vector<int32_t> RandomPrompt(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(3 + rng() % 31000);
  return p;
}

// A greedy request for `max_tokens` tokens that ignores EOS, reporting `num_logprobs`
// top logprobs per token (0: the sampled token's only; -1: none).
inline GenerateRequest GreedyTurn(std::vector<int32_t> prompt, int max_tokens, int num_logprobs) {
  GenerateRequest r;
  r.prompt_tokens = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.sampling.num_logprobs = num_logprobs;
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return r;
}

class Deployment {
 public:
  Deployment(const ModelWeights* weights, const Topology& t, int64_t slots_per_pool)
      : weights_(weights), topology_(t) {
    SchedulerConfig config;
    config.max_model_len = t.max_model_len;
    config.context_overflow = t.context_overflow;
    config.rope_inv_freq = RopeInverseFrequencies(weights->config);
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
    config.disk_layerwise = t.disk_layerwise;
    config.kv_eviction = t.kv_eviction;
    config.lookahead_requests = t.lookahead_requests;
    config.disk_save_on_fill = t.disk_save_on_fill;
    if (t.max_num_seqs > 0) config.max_num_seqs = t.max_num_seqs;
    config.num_layers = static_cast<int>(weights->config.num_layers);
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
          t.backend == "inproc" ? absl::StrCat("memory-", ++deployment_instance) : "127.0.0.1:0";
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
      mc.max_step_rows = static_cast<uint64_t>(config.max_num_batched_tokens);
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
          cache->set_load_gate(&host->gate());
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
            t.backend == "inproc" ? absl::StrCat("replica-", ++deployment_instance) : "127.0.0.1:0";
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
    // The data planes and exchanges call into the wakeups until they are closed.
    engines_.clear();
    attention_.clear();
    exchanges_.clear();
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
      if (outcome->first_token == absl::InfinitePast() && !u.sequences.empty()) {
        outcome->first_token = absl::Now();
      }
      for (const SequenceUpdate& s : u.sequences) {
        outcome->tokens.insert(outcome->tokens.end(), s.tokens.begin(), s.tokens.end());
        for (const TokenLogprob& l : s.logprobs) {
          outcome->logprobs.push_back(l.logprob);
          outcome->top_logprobs.push_back(l.top);
        }
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

class InProcessDeploymentTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto weights = GenerateAndLoadWeights("tiny-gqa", "in_process_deployment_model");
    ASSERT_TRUE(weights.ok()) << weights.status();
    weights_ = weights->release();
  }
  static void TearDownTestSuite() { delete weights_; }

  static std::vector<int32_t> Prompt(int n, uint32_t seed) { return RandomPrompt(n, seed); }

  // Eight requests of growing prompts and lengths: odd ones greedy, even ones seeded with a
  // frequency penalty and n = 2 (prompt i: `first_len` + 37 i tokens, seeded `prompt_seed` + i).
  static std::vector<GenerateRequest> MixedRequests(int first_len, uint32_t prompt_seed,
                                                    uint64_t sampling_seed) {
    std::vector<GenerateRequest> requests;
    for (int i = 0; i < 8; ++i) {
      GenerateRequest r;
      r.prompt_tokens = Prompt(first_len + 37 * i, prompt_seed + i);
      r.max_tokens = 24 + 3 * i;
      r.ignore_eos = true;
      if (i % 2 == 0) {
        r.sampling.temperature = 0.9f;
        r.sampling.frequency_penalty = 0.5f;
        r.sampling.seed = sampling_seed + i;
        r.has_seed = true;
        r.n = 2;
      } else {
        r.sampling.temperature = 0.0f;
      }
      requests.push_back(r);
    }
    return requests;
  }

  inline static ModelWeights* weights_ = nullptr;
};

}  // namespace strata::in_process

#endif  // STRATA_SERVER_IN_PROCESS_DEPLOYMENT_H_
