// The world of the rotation tests (rotation_test.cc, rotation_replica_loss_test.cc): real
// engines, real memory servers and the in-process transport. R compute replicas, each with
// a context exchange, one lane per batch slot and the rotation driver on its own thread,
// take the plans of n = R + 1 batches that the tests broadcast as the scheduler's
// RotationGroup does, and a reference engine runs the same plans whole (pipelining off).
// Test-only.
#ifndef STRATA_COMPUTE_NODE_ROTATION_TEST_HARNESS_H_
#define STRATA_COMPUTE_NODE_ROTATION_TEST_HARNESS_H_

#include <atomic>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "compute_node/context_exchange.h"
#include "compute_node/model_runner.h"
#include "compute_node/remote_attention.h"
#include "compute_node/rotation.h"
#include "compute_node/step_engine.h"
#include "compute_node/testing/generated_weights.h"
#include "gtest/gtest.h"
#include "memory_node/memory_server.h"

namespace strata::rotation_testing {

constexpr uint64_t kEpoch = 5;
constexpr int kPools = 2;
constexpr int kSeqsPerBatch = 3;
constexpr int kPromptLen = 9;
constexpr int kSteps = 6;  // the prefill, then decodes
constexpr int kMaxPositions = 64;

inline std::atomic<int> instance{0};

// The memory nodes of one run (each run gets fresh ones: the KV starts empty).
struct MemoryPools {
  std::vector<std::unique_ptr<MemoryServer>> servers;
  std::vector<MemoryNodeAddress> addresses;

  explicit MemoryPools(const ModelConfig& c) {
    for (int p = 0; p < kPools; ++p) {
      MemoryServerOptions o;
      o.transport.backend = transport::Backend::kInproc;
      o.data_address = absl::StrCat("rotation-test-memory-", ++instance);
      o.prefault_kv = false;
      auto server = MemoryServer::Create(o);
      EXPECT_TRUE(server.ok()) << server.status();
      MemoryConfig mc;
      mc.epoch = kEpoch;
      mc.pool = PoolIndex(p);
      mc.model.name = "tiny-gqa";
      mc.model.num_layers = c.num_layers;
      mc.model.num_heads = c.num_heads;
      mc.model.num_kv_heads = c.num_kv_heads;
      mc.model.head_dim = c.head_dim;
      mc.model.kv_dtype = "bf16";
      mc.num_slots = 64 * kMaxPositions;
      EXPECT_TRUE((*server)->Configure(mc).ok());
      addresses.push_back({PoolIndex(p), absl::StrCat("memory-", p), (*server)->data_address()});
      servers.push_back(std::move(*server));
    }
  }
};

// The layer and hand-off deadline of the tests' lanes and replicas.
constexpr absl::Duration kDeadline = absl::Seconds(2);

inline RemoteAttentionOptions LaneOptions(uint64_t endpoint, std::function<void()> on_settled,
                                          absl::Duration deadline = kDeadline) {
  RemoteAttentionOptions o;
  o.transport.backend = transport::Backend::kInproc;
  o.prefill_policy = PrefillPolicy::kMemory;
  o.layer_timeout = deadline;
  o.endpoint = endpoint;
  o.on_settled = std::move(on_settled);
  return o;
}

// One compute replica of the rotation: its exchange, lanes, engine and driver thread.
struct Replica {
  Wakeup wakeup;
  std::unique_ptr<ContextExchange> exchange;
  // The exchange's address, kept: Kill() frees the exchange while other batches' plans may
  // still be naming this replica.
  std::string address;
  std::unique_ptr<StepEngine> engine;  // goes after the lanes, whose answers land in it
  std::vector<std::unique_ptr<RemoteAttention>> lanes;
  PlanQueue queue;
  std::thread driver;

  Replica(const ModelRunner& runner, const MemoryPools& pools, int batches,
          absl::Duration deadline = kDeadline) {
    ContextExchangeOptions o;
    o.transport.backend = transport::Backend::kInproc;
    o.listen_address = absl::StrCat("rotation-test-replica-", ++instance);
    o.hidden = runner.config().hidden_size;
    o.on_arrival = [this] { wakeup.Notify(); };
    auto e = ContextExchange::Create(o);
    EXPECT_TRUE(e.ok()) << e.status();
    exchange = std::move(*e);
    exchange->SetEpoch(kEpoch);
    address = exchange->address();
    std::vector<AttentionBackend*> backends;
    for (int j = 0; j < batches; ++j) {
      auto lane = RemoteAttention::Create(
          runner.config(),
          LaneOptions(
              RotationEndpoint(exchange->address(), j), [this] { wakeup.Notify(); }, deadline));
      EXPECT_TRUE(lane.ok()) << lane.status();
      (*lane)->SetMemoryNodes(kEpoch, pools.addresses);
      (*lane)->ConnectAll();
      backends.push_back(lane->get());
      lanes.push_back(std::move(*lane));
    }
    engine = std::make_unique<StepEngine>(&runner, backends, StepEngineOptions{256, kMaxPositions});
    queue.SetOnChange([this] { wakeup.Notify(); });
    RotationDriverOptions d;
    d.exchange = exchange.get();
    d.wakeup = &wakeup;
    d.handoff_timeout = HandoffTimeout(deadline);
    d.stop = &killed;
    d.epoch = &epoch;
    d.cached_epoch = &cached_epoch;
    driver = std::thread([this, d] { RunRotation(*engine, queue, d); });
  }
  void Stop() {
    if (!driver.joinable()) return;
    queue.Close();
    driver.join();
  }
  // Queues a plan; a dead replica answers at once, as a broken stream would.
  void Submit(QueuedPlan plan) {
    absl::MutexLock lock(&kill_mu);
    if (killed) {
      StepResult r;
      r.step_id = plan.plan.step_id;
      r.status = absl::UnavailableError("the compute replica is gone");
      plan.done(std::move(r));
      return;
    }
    queue.Push(std::move(plan));
  }
  // Stops, as a process does on SIGSTOP: it runs nothing more and answers nothing (its plans
  // are answered Cancelled here, as its executor fails them once the scheduler removes it),
  // and its connections stay open.
  void Hang() {
    {
      absl::MutexLock lock(&kill_mu);
      killed = true;
    }
    wakeup.Notify();
    driver.join();
  }
  // Dies at once, as a process would: plans in flight are dropped, connections close.
  void Kill() {
    {
      absl::MutexLock lock(&kill_mu);
      killed = true;
    }
    wakeup.Notify();
    driver.join();
    // The lanes' transports close before the engine whose buffers their answers land in.
    for (auto& lane : lanes) lane->AbandonStep();
    lanes.clear();
    engine.reset();
    exchange.reset();
  }
  absl::Mutex kill_mu;
  std::atomic<bool> killed{false};
  std::atomic<uint64_t> epoch{kEpoch};  // as Configure sets it
  uint64_t cached_epoch = kEpoch;       // the driver's
  ~Replica() { Stop(); }
};

struct Sequence {
  SequenceId id;
  PoolIndex pool;
  std::vector<int32_t> tokens;  // prompt, then outputs
  int32_t first_slot = 0;
};

// The plan of one step of `batch`'s sequences: their whole history at once when `prefill`
// (with setups), else one decode row each.
inline StepPlan MakePlan(uint64_t step_id, std::vector<Sequence>& batch, bool prefill,
                         bool greedy) {
  StepPlan plan;
  plan.step_id = step_id;
  plan.epoch = kEpoch;
  // Rows grouped by pool, as the attention side expects.
  std::vector<Sequence*> order;
  for (Sequence& s : batch) order.push_back(&s);
  std::stable_sort(order.begin(), order.end(),
                   [](const Sequence* a, const Sequence* b) { return a->pool < b->pool; });
  for (Sequence* s : order) {
    const int32_t n = static_cast<int32_t>(s->tokens.size());
    SequenceChunk c;
    c.request_id = s->id;
    c.pool = s->pool;
    SlotAssignment a;
    a.request_id = s->id;
    a.pool = s->pool;
    if (prefill) {
      RequestSetup setup;
      setup.request_id = s->id;
      setup.prompt_len = kPromptLen;
      setup.history = s->tokens;
      if (!greedy) {
        setup.sampling.temperature = 0.8f;
        setup.sampling.seed = 1000 + s->id.value();
        setup.sampling.frequency_penalty = 0.3f;
      } else {
        setup.sampling.temperature = 0.0f;
      }
      plan.setups.push_back(setup);
      plan.releases.push_back({s->id, s->pool});
      c.start_position = 0;
      c.tokens = s->tokens;
      a.start = 0;
      for (int32_t p = 0; p < n; ++p) a.slots.push_back(s->first_slot + p);
    } else {
      c.start_position = n - 1;
      c.tokens = {s->tokens.back()};
      a.start = n - 1;
      a.slots = {s->first_slot + n - 1};
    }
    c.samples.push_back({s->id, 0, n - kPromptLen, {}});
    plan.assignments.push_back(a);
    plan.chunks.push_back(c);
  }
  return plan;
}

inline std::vector<std::vector<Sequence>> MakeBatches(int batches, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<Sequence>> out(batches);
  uint64_t id = 1;
  for (int j = 0; j < batches; ++j) {
    for (int i = 0; i < kSeqsPerBatch; ++i) {
      Sequence s;
      s.id = SequenceId(id);
      s.pool = PoolIndex(static_cast<int>(id % kPools));
      s.first_slot = static_cast<int32_t>(id * kMaxPositions);
      for (int t = 0; t < kPromptLen; ++t) s.tokens.push_back(3 + rng() % 250);
      out[j].push_back(s);
      ++id;
    }
  }
  return out;
}

// Runs one plan and returns its result (blocking): the engine under test.
using RunPlan = std::function<StepResult(int batch, StepPlan plan)>;

// Every batch on its own thread: kSteps steps from `from_step` on, with a re-prefill first.
// Returns each sequence's tokens, and the first error of each batch (OK: none). A sequence
// that fails alone (result.failed: its memory node died) leaves its batch, as the scheduler
// moves it elsewhere; it is added to `failed` and the rest of the batch goes on.
using Failures = std::vector<std::pair<SequenceId, absl::Status>>;
inline std::map<uint64_t, std::vector<int32_t>> Drive(std::vector<std::vector<Sequence>>& batches,
                                                      const RunPlan& run, bool greedy,
                                                      std::atomic<uint64_t>& step_ids,
                                                      std::vector<absl::Status>* errors,
                                                      Failures* failed = nullptr) {
  errors->assign(batches.size(), absl::OkStatus());
  absl::Mutex failed_mu;
  std::vector<std::thread> threads;
  for (size_t j = 0; j < batches.size(); ++j) {
    threads.emplace_back([&, j] {
      for (int step = 0; step < kSteps && !batches[j].empty(); ++step) {
        StepResult r =
            run(static_cast<int>(j), MakePlan(step_ids++, batches[j], step == 0, greedy));
        if (!r.status.ok()) {
          (*errors)[j] = r.status;
          return;
        }
        for (const auto& [id, why] : r.failed) {
          EXPECT_NE(failed, nullptr) << "sequence " << id.value() << " failed: " << why;
          if (failed != nullptr) {
            absl::MutexLock lock(&failed_mu);
            failed->emplace_back(id, why);
          }
          std::erase_if(batches[j], [id = id](const Sequence& s) { return s.id == id; });
        }
        EXPECT_EQ(r.tokens.size(), batches[j].size());
        for (const SampledToken& t : r.tokens) {
          for (Sequence& s : batches[j]) {
            if (s.id == t.request_id) s.tokens.push_back(t.token);
          }
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::map<uint64_t, std::vector<int32_t>> out;
  for (const auto& batch : batches) {
    for (const Sequence& s : batch) out[s.id.value()] = s.tokens;
  }
  return out;
}

class RotationFixture : public ::testing::TestWithParam<std::tuple<int, bool>> {
 protected:
  static void SetUpTestSuite() {
    auto weights = GenerateAndLoadWeights("tiny-gqa", "rotation_model");
    ASSERT_TRUE(weights.ok()) << weights.status();
    weights_ = weights->release();
  }
  static void TearDownTestSuite() { delete weights_; }

  // Pipelining off: one engine runs each plan whole, one at a time.
  static std::map<uint64_t, std::vector<int32_t>> Reference(int batches, bool greedy) {
    ModelRunner runner(weights_, kMaxPositions);
    MemoryPools pools(runner.config());
    auto remote = RemoteAttention::Create(runner.config(), LaneOptions(0, {}));
    EXPECT_TRUE(remote.ok());
    (*remote)->SetMemoryNodes(kEpoch, pools.addresses);
    StepEngine engine(&runner, remote->get(), StepEngineOptions{256, kMaxPositions});
    absl::Mutex mu;
    std::atomic<uint64_t> ids{1};
    std::vector<absl::Status> errors;
    auto b = MakeBatches(batches, 11);
    auto out = Drive(
        b,
        [&](int, StepPlan plan) {
          absl::MutexLock lock(&mu);
          return engine.Execute(plan);
        },
        greedy, ids, &errors);
    for (const absl::Status& e : errors) EXPECT_TRUE(e.ok()) << e;
    return out;
  }

  static inline ModelWeights* weights_ = nullptr;
};

// Broadcasts a plan to `replicas` (each copy naming its receiver) and returns the result
// of the replica that samples, with the others' failures folded in: their errors, and the
// sequences that failed alone on any of them (whose tokens are then dropped), as the
// scheduler's RotationGroup combines them.
inline StepResult Broadcast(std::vector<Replica*> replicas, int batch, const StepPlan& plan,
                            int layers, std::vector<absl::Status>* every_error = nullptr,
                            const std::function<void()>& after_submit = {}) {
  std::vector<std::string> addresses;
  for (Replica* r : replicas) addresses.push_back(r->address);
  std::vector<std::future<StepResult>> results;
  for (size_t i = 0; i < replicas.size(); ++i) {
    auto promise = std::make_shared<std::promise<StepResult>>();
    results.push_back(promise->get_future());
    StepPlan copy = plan;
    copy.rotation.batch = batch;
    copy.rotation.replica = static_cast<int32_t>(i);
    copy.rotation.replicas = addresses;
    // `after_submit` runs once the plan has reached every replica but the last.
    if (i + 1 == replicas.size() && after_submit) after_submit();
    replicas[i]->Submit(
        {std::move(copy), std::nullopt, [promise](StepResult r) { promise->set_value(r); }});
  }
  const size_t sampler = (batch + layers) % replicas.size();
  StepResult out;
  Failures failed;
  for (size_t i = 0; i < results.size(); ++i) {
    StepResult r = results[i].get();
    EXPECT_EQ(r.step_id, plan.step_id);
    if (every_error != nullptr && !r.status.ok()) {
      static absl::Mutex mu(absl::kConstInit);
      absl::MutexLock lock(&mu);
      every_error->push_back(r.status);
    }
    if (i != sampler) {
      EXPECT_TRUE(r.tokens.empty() || !r.status.ok()) << "replica " << i << " sampled";
    }
    for (auto& failure : r.failed) failed.push_back(std::move(failure));
    if (i == sampler) {
      absl::Status keep = out.status;
      out = std::move(r);
      if (!keep.ok()) out.status = keep;
    } else if (!r.status.ok() && out.status.ok()) {
      out.status = r.status;
    }
  }
  out.failed.clear();
  for (auto& [id, why] : failed) {
    const bool known = std::any_of(out.failed.begin(), out.failed.end(),
                                   [id = id](const auto& f) { return f.first == id; });
    if (!known) out.failed.emplace_back(id, std::move(why));
  }
  std::erase_if(out.tokens, [&](const SampledToken& t) {
    return std::any_of(out.failed.begin(), out.failed.end(),
                       [&](const auto& f) { return f.first == t.request_id; });
  });
  return out;
}

// The n - 1 replicas of a rotation of `batches` batches, with `deadline` as their layer
// deadline (and HandoffTimeout of it as their hand-off deadline).
inline std::vector<std::unique_ptr<Replica>> MakeReplicas(const ModelRunner& runner,
                                                          const MemoryPools& pools, int batches,
                                                          absl::Duration deadline = kDeadline) {
  std::vector<std::unique_ptr<Replica>> replicas;
  for (int r = 0; r < batches - 1; ++r) {
    replicas.push_back(std::make_unique<Replica>(runner, pools, batches, deadline));
  }
  return replicas;
}

// The replicas as Broadcast takes them.
inline std::vector<Replica*> Pointers(const std::vector<std::unique_ptr<Replica>>& replicas) {
  std::vector<Replica*> out;
  for (const auto& r : replicas) out.push_back(r.get());
  return out;
}

}  // namespace strata::rotation_testing

#endif  // STRATA_COMPUTE_NODE_ROTATION_TEST_HARNESS_H_
