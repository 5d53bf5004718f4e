// Rotational pipelining on real engines, real memory servers and the in-process transport:
// R compute replicas, each with a context exchange, one lane per batch slot and the
// rotation driver on its own thread, run n = R + 1 batches side by side. The sampled tokens
// must be bit-identical to one engine that runs the same plans whole (pipelining off), for
// greedy and seeded sampling, n = 3 and n = 4. A replica that dies mid-rotation fails the
// batches in flight with an error that names it, within the hand-off deadline, and the
// survivors then run the same sequences again from their tokens, again bit-identical.
#include "compute_node/rotation.h"

#include <atomic>
#include <future>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/base/logging.h"
#include "compute_node/model_runner.h"
#include "compute_node/remote_attention.h"
#include "compute_node/testing/generated_weights.h"
#include "gtest/gtest.h"
#include "memory_node/memory_server.h"

namespace strata {
namespace {

constexpr uint64_t kEpoch = 5;
constexpr int kPools = 2;
constexpr int kSeqsPerBatch = 3;
constexpr int kPromptLen = 9;
constexpr int kSteps = 6;  // the prefill, then decodes
constexpr int kMaxPositions = 64;

std::atomic<int> instance{0};

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

RemoteAttentionOptions LaneOptions(uint64_t endpoint, std::function<void()> on_settled,
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
StepPlan MakePlan(uint64_t step_id, std::vector<Sequence>& batch, bool prefill, bool greedy) {
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

std::vector<std::vector<Sequence>> MakeBatches(int batches, uint32_t seed) {
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
std::map<uint64_t, std::vector<int32_t>> Drive(std::vector<std::vector<Sequence>>& batches,
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

class RotationTest : public ::testing::TestWithParam<std::tuple<int, bool>> {
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

  // Defined below, with the tests that use it.
  using FaultyShare = std::function<std::function<void()>(StepPlan& plan, MemoryPools& pools)>;
  static Failures RunWithAFaultyShare(const FaultyShare& fault);

  static ModelWeights* weights_;
};

ModelWeights* RotationTest::weights_ = nullptr;

// Broadcasts a plan to `replicas` (each copy naming its receiver) and returns the result
// of the replica that samples, with the others' failures folded in: their errors, and the
// sequences that failed alone on any of them (whose tokens are then dropped), as the
// scheduler's RotationGroup combines them.
StepResult Broadcast(std::vector<Replica*> replicas, int batch, const StepPlan& plan, int layers,
                     std::vector<absl::Status>* every_error = nullptr,
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
std::vector<std::unique_ptr<Replica>> MakeReplicas(const ModelRunner& runner,
                                                   const MemoryPools& pools, int batches,
                                                   absl::Duration deadline = kDeadline) {
  std::vector<std::unique_ptr<Replica>> replicas;
  for (int r = 0; r < batches - 1; ++r) {
    replicas.push_back(std::make_unique<Replica>(runner, pools, batches, deadline));
  }
  return replicas;
}

// The replicas as Broadcast takes them.
std::vector<Replica*> Pointers(const std::vector<std::unique_ptr<Replica>>& replicas) {
  std::vector<Replica*> out;
  for (const auto& r : replicas) out.push_back(r.get());
  return out;
}

TEST_P(RotationTest, BitIdenticalToPipeliningOff) {
  const auto [batches, greedy] = GetParam();
  const auto expected = Reference(batches, greedy);

  ModelRunner runner(weights_, kMaxPositions);
  MemoryPools pools(runner.config());
  std::vector<std::unique_ptr<Replica>> replicas = MakeReplicas(runner, pools, batches);
  const std::vector<Replica*> all = Pointers(replicas);
  std::atomic<uint64_t> ids{1};
  std::vector<absl::Status> errors;
  auto b = MakeBatches(batches, 11);
  const int layers = static_cast<int>(runner.config().num_layers);
  const auto got = Drive(
      b, [&](int batch, StepPlan plan) { return Broadcast(all, batch, plan, layers); }, greedy, ids,
      &errors);
  for (const absl::Status& e : errors) ASSERT_TRUE(e.ok()) << e;
  ASSERT_EQ(got.size(), expected.size());
  for (const auto& [id, tokens] : expected) {
    EXPECT_EQ(got.at(id), tokens) << "sequence " << id;
    EXPECT_EQ(tokens.size(), static_cast<size_t>(kPromptLen + kSteps));
  }
  // Contexts really moved, and answers really came before their plans some of the time or
  // not; nothing was rejected.
  uint64_t moved = 0;
  for (auto& r : replicas) {
    const ContextExchangeStats s = r->exchange->stats();
    moved += s.received;
    EXPECT_EQ(s.rejected, 0u);
    EXPECT_EQ(s.stale, 0u);
  }
  // Each step of each batch hands its context on once per slice boundary (L of them).
  EXPECT_EQ(moved, static_cast<uint64_t>(batches * kSteps * layers));
  for (auto& r : replicas) r->Stop();
}

INSTANTIATE_TEST_SUITE_P(BatchesAndSampling, RotationTest,
                         ::testing::Combine(::testing::Values(3, 4),
                                            ::testing::Values(true, false)),
                         [](const auto& info) {
                           return absl::StrCat("n", std::get<0>(info.param),
                                               std::get<1>(info.param) ? "_greedy" : "_seeded");
                         });

// A plan of another epoch (a scheduler that configured the node before, or after, the one
// whose stream runs) is refused by every replica, as the node's other paths refuse it, and
// touches nothing: the batch's next steps, of the right epoch, still match pipelining off.
// (Rotated plans used to run whatever their epoch: a stale scheduler's release of its
// sequence ids, which the new scheduler reuses, dropped the new one's slot tables.)
TEST_F(RotationTest, APlanOfAnotherEpochIsRefusedAndChangesNothing) {
  const int batches = 3;
  const auto expected = Reference(batches, /*greedy=*/true);
  ModelRunner runner(weights_, kMaxPositions);
  MemoryPools pools(runner.config());
  std::vector<std::unique_ptr<Replica>> replicas = MakeReplicas(runner, pools, batches);
  const std::vector<Replica*> all = Pointers(replicas);
  const int layers = static_cast<int>(runner.config().num_layers);
  std::atomic<uint64_t> ids{1};
  std::vector<absl::Status> errors, foreign_errors;
  auto b = MakeBatches(batches, 11);
  std::vector<std::vector<Sequence>> first = {b[0]};
  int step = 0;
  const auto got = Drive(
      first,
      [&](int batch, StepPlan plan) {
        if (++step == 3) {
          StepPlan foreign = plan;
          foreign.step_id = ids++;
          foreign.epoch = kEpoch + 1;
          for (const SequenceChunk& c : plan.chunks)
            foreign.releases.push_back({c.request_id, c.pool});
          const StepResult refused = Broadcast(all, batch, foreign, layers, &foreign_errors);
          EXPECT_EQ(refused.status.code(), absl::StatusCode::kFailedPrecondition) << refused.status;
          EXPECT_EQ(foreign_errors.size(), all.size()) << "a replica ran the foreign plan";
          for (const absl::Status& e : foreign_errors) {
            EXPECT_TRUE(absl::StrContains(e.message(), "epoch")) << e;
          }
        }
        return Broadcast(all, batch, plan, layers);
      },
      true, ids, &errors);
  for (const absl::Status& e : errors) ASSERT_TRUE(e.ok()) << e;
  EXPECT_GE(step, 3);
  for (const Sequence& s : b[0]) {
    EXPECT_EQ(got.at(s.id.value()), expected.at(s.id.value())) << "sequence " << s.id.value();
  }
  // A new scheduler configures the replicas: its plans name sequence ids the old one used,
  // and find none of the old one's requests cached (a decode needs its own setup first).
  for (Replica* r : all) r->epoch.store(kEpoch + 1);
  StepPlan next = MakePlan(ids++, first[0], /*prefill=*/false, /*greedy=*/true);
  next.epoch = kEpoch + 1;
  const StepResult fresh = Broadcast(all, 0, next, layers);
  EXPECT_EQ(fresh.status.code(), absl::StatusCode::kInvalidArgument) << fresh.status;
  EXPECT_TRUE(absl::StrContains(fresh.status.message(), "before its setup")) << fresh.status;
  for (auto& r : replicas) r->Stop();
}

// A fault in a memory node's share of batch 1's third step, on 4 batches and 3 replicas
// whose deadlines are a minute, far past the bound checked here: no batch may fail whole, no
// replica give up a step, and nobody wait for a deadline. `fault` may change that plan
// (before it goes to the replicas) and returns what to do once it has reached every replica
// but the last (or nothing). Returns the sequences that failed alone, each once; every
// other sequence must run all its steps, bit-identical to pipelining off.
Failures RotationTest::RunWithAFaultyShare(const FaultyShare& fault) {
  const int batches = 4;
  const auto expected = Reference(batches, /*greedy=*/true);
  ModelRunner runner(weights_, kMaxPositions);
  MemoryPools pools(runner.config());
  std::vector<std::unique_ptr<Replica>> replicas =
      MakeReplicas(runner, pools, batches, absl::Seconds(60));
  const std::vector<Replica*> three = Pointers(replicas);
  const int layers = static_cast<int>(runner.config().num_layers);
  std::atomic<uint64_t> ids{1};
  auto b = MakeBatches(batches, 11);
  std::atomic<int> plans{0};
  std::vector<absl::Status> errors, replica_errors;
  Failures failed;
  const absl::Time start = absl::Now();
  const auto got = Drive(
      b,
      [&](int batch, StepPlan plan) {
        std::function<void()> after_submit;
        if (batch == 1 && ++plans == 3) after_submit = fault(plan, pools);
        return Broadcast(three, batch, plan, layers, &replica_errors, after_submit);
      },
      true, ids, &errors, &failed);
  EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "a replica waited for its deadline";
  for (const absl::Status& e : errors) EXPECT_TRUE(e.ok()) << "a batch failed whole: " << e;
  for (const absl::Status& e : replica_errors) ADD_FAILURE() << "a replica gave up a step: " << e;
  std::set<SequenceId> once;
  for (const auto& [id, why] : failed) {
    EXPECT_TRUE(once.insert(id).second) << "sequence " << id.value() << " failed twice";
  }
  for (const auto& [id, tokens] : expected) {
    if (once.count(SequenceId(id))) continue;
    EXPECT_EQ(got.at(id), tokens) << "sequence " << id;
  }
  EXPECT_LT(once.size(), expected.size());
  for (auto& r : replicas) r->Stop();
  return failed;
}

// A memory node dies mid-rotation. Its sequences fail alone: the replica whose slice finds
// it dead zeroes their rows and names its pool in the context it hands on, so that the
// replicas after it expect no answers from it; the batch's other sequences go on in the
// same step, bit-identical to pipelining off, and no step fails whole. (Rotated steps used
// to fail whole, every sequence of the batch then recomputed.)
TEST_F(RotationTest, ADeadMemoryNodeFailsOnlyItsSequencesAndTheRotatedStepGoesOn) {
  absl::Mutex kill_mu;
  const Failures failed = RunWithAFaultyShare([&](StepPlan&, MemoryPools& pools) {
    return [&] {
      absl::MutexLock lock(&kill_mu);
      pools.servers[1].reset();  // its connections close with it
    };
  });
  // Only the dead pool's sequences failed, saying which pool; batch 1's all did.
  std::set<uint64_t> failed_ids;
  for (const auto& [id, why] : failed) {
    failed_ids.insert(id.value());
    EXPECT_EQ(id.value() % kPools, 1u) << "sequence " << id.value() << " of a live pool failed";
    EXPECT_TRUE(absl::IsUnavailable(why)) << why;
    EXPECT_TRUE(absl::StrContains(why.message(), "pool 1")) << why;
  }
  for (uint64_t id = 1 + kSeqsPerBatch; id <= 2 * kSeqsPerBatch; ++id) {
    if (id % kPools == 1) {
      EXPECT_TRUE(failed_ids.count(id)) << "sequence " << id << " of batch 1";
    }
  }
}

// A memory node that refuses its share of a rotated step (a slot outside its store) stays
// up, and answers the layers' frames with its error, to the replica of the first slice that
// waits for it. That replica names the pool in the context it hands on; the replicas after
// it expect nothing of the pool for that step (it is sent nothing more, so without the name
// they would wait for their deadline). Only the sequence whose share was refused fails.
TEST_F(RotationTest, AMemoryNodeThatRefusesItsShareFailsOnlyItsSequences) {
  // Batch 1 holds sequences 4, 5 and 6; 5 is the one on pool 1.
  const SequenceId refused(5);
  ASSERT_EQ(MakeBatches(4, 11)[1][1].id, refused);
  ASSERT_EQ(MakeBatches(4, 11)[1][1].pool, PoolIndex(1));
  const Failures failed = RunWithAFaultyShare([&](StepPlan& plan, MemoryPools&) {
    for (SlotAssignment& a : plan.assignments) {
      if (a.request_id == refused) a.slots = {int32_t{1} << 20};
    }
    return std::function<void()>();
  });
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].first, refused);
  EXPECT_TRUE(absl::StrContains(failed[0].second.message(), "pool 1")) << failed[0].second;
}

// A memory node that hangs (it takes frames and answers none) under rotational pipelining:
// the replica whose slice waits for its answers gives up on them at the layer deadline,
// fails its rows alone and names its pool in the context it hands on. The replicas after
// stop expecting it, and their deadline on that context (HandoffTimeout: twice the layer's)
// outlasts the wait, so the step goes on for the batch's other sequences. Only the sequence
// placed there fails; every other one matches pipelining off.
TEST_F(RotationTest, AHungMemoryNodeFailsOnlyItsSequencesAtTheLayerDeadline) {
  const int batches = 3;
  const auto expected = Reference(batches, /*greedy=*/true);
  ModelRunner runner(weights_, kMaxPositions);
  MemoryPools pools(runner.config());
  // A third pool, whose node takes the frames and answers none.
  auto hung = transport::Transport::Create({transport::Backend::kInproc});
  ASSERT_TRUE(hung.ok()) << hung.status();
  auto hung_address = (*hung)->Listen(absl::StrCat("rotation-test-hung-", ++instance));
  ASSERT_TRUE(hung_address.ok()) << hung_address.status();
  pools.addresses.push_back({PoolIndex(2), "memory-hung", *hung_address});
  std::vector<std::unique_ptr<Replica>> replicas =
      MakeReplicas(runner, pools, batches, absl::Milliseconds(300));
  const std::vector<Replica*> all = Pointers(replicas);
  const int layers = static_cast<int>(runner.config().num_layers);
  std::atomic<uint64_t> ids{1};
  auto b = MakeBatches(batches, 11);
  const SequenceId placed_there = b[1][1].id;
  b[1][1].pool = PoolIndex(2);
  std::vector<absl::Status> errors, replica_errors;
  Failures failed;
  const auto got = Drive(
      b,
      [&](int batch, StepPlan plan) {
        return Broadcast(all, batch, plan, layers, &replica_errors);
      },
      true, ids, &errors, &failed);
  for (const absl::Status& e : errors) EXPECT_TRUE(e.ok()) << "a batch failed whole: " << e;
  for (const absl::Status& e : replica_errors) ADD_FAILURE() << "a replica gave up a step: " << e;
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].first, placed_there);
  EXPECT_TRUE(absl::StrContains(failed[0].second.message(), "pool 2")) << failed[0].second;
  for (const auto& [id, tokens] : expected) {
    if (id == placed_there.value()) continue;
    EXPECT_EQ(got.at(id), tokens) << "sequence " << id;
  }
  for (auto& r : replicas) r->Stop();
}

// How replica 2 of three is lost mid-rotation.
enum class Loss {
  kDies,   // its process ends: its connections close
  kHangs,  // it stops (SIGSTOP): its connections stay open, and the scheduler declares it
           // dead (its heartbeats lapse) and tells the others (ContextExchange::Depart)
};

// Replica 2 is lost at batch 2's second step, with plans of other batches in flight. Every
// batch stops with an error naming it, and no survivor waits for its hand-off deadline (two
// minutes here): a lane that needs the lost replica's context learns that it will not come
// (its connection closed, or the declaration); a dead one cannot be handed a context. Then
// the two survivors run every sequence again, to the tokens of pipelining off.
void LoseAReplica(ModelWeights* weights, const std::map<uint64_t, std::vector<int32_t>>& expected,
                  Loss loss) {
  const int batches = 4;
  ModelRunner runner(weights, kMaxPositions);
  MemoryPools pools(runner.config());
  std::vector<std::unique_ptr<Replica>> replicas =
      MakeReplicas(runner, pools, batches, absl::Seconds(60));
  const int layers = static_cast<int>(runner.config().num_layers);
  std::atomic<uint64_t> ids{1};
  auto b = MakeBatches(batches, 11);
  const std::string lost_address = replicas[2]->exchange->address();
  std::atomic<int> plans{0};
  std::atomic<bool> lost{false};
  absl::Mutex lose_mu;
  std::thread declare;  // the control plane, once the hung replica's heartbeats lapse
  std::vector<absl::Status> errors, replica_errors;
  const absl::Time start = absl::Now();
  Drive(
      b,
      [&](int batch, StepPlan plan) {
        const std::vector<Replica*> three = Pointers(replicas);
        if (batch == 2 && ++plans == 2) {
          // Batch 2's steps start on replica 2 (slice 0 runs on replica batch mod 3): it is
          // lost once its second step has reached the others, so that they wait for a
          // context it never hands over.
          return Broadcast(three, batch, plan, layers, &replica_errors, [&] {
            absl::MutexLock lock(&lose_mu);
            if (loss == Loss::kDies) {
              replicas[2]->Kill();
            } else {
              replicas[2]->Hang();
            }
            lost = true;
            if (loss == Loss::kHangs) {
              // Every step sent to it so far has an id below `ids`: plans built from now on
              // do not go to it (`lost`).
              const uint64_t through = ids.load() - 1;
              declare = std::thread([&, through] {
                absl::SleepFor(absl::Milliseconds(300));
                for (int r = 0; r < 2; ++r) replicas[r]->exchange->Depart(lost_address, through);
              });
            }
          });
        }
        if (lost) {
          // What the group sees: the lost replica's stream is gone, or it was removed.
          StepResult r;
          r.step_id = plan.step_id;
          r.status = absl::UnavailableError("compute replica lost");
          return r;
        }
        return Broadcast(three, batch, plan, layers, &replica_errors);
      },
      true, ids, &errors);
  if (declare.joinable()) declare.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "a batch hung";
  int failed = 0, named = 0;
  for (const absl::Status& e : errors) {
    failed += !e.ok();
    named += absl::StrContains(e.message(), lost_address) ||
             absl::StrContains(e.message(), "going away");
  }
  EXPECT_EQ(failed, batches) << "every batch was stopped by the lost replica";
  EXPECT_GT(named, 0) << "no error says which replica failed";
  // The survivors' lanes that needed the lost replica failed naming it: one waiting for its
  // context finds it gone, one handing a context to a dead one cannot reach it; none waited
  // for its deadline.
  int named_by_survivors = 0;
  for (const absl::Status& e : replica_errors) {
    LOG(INFO) << "replica error: " << e;
    EXPECT_FALSE(absl::StrContains(e.message(), "did not hand over")) << e;
    named_by_survivors += absl::StrContains(e.message(), lost_address) && absl::IsUnavailable(e) &&
                          (absl::StrContains(e.message(), "is gone") ||
                           (loss == Loss::kDies && absl::StrContains(e.message(), "cannot reach")));
  }
  EXPECT_GT(named_by_survivors, 0) << "no survivor said which replica it lost";
  // The two survivors: every sequence again from the prompt (its history so far is what the
  // scheduler would resend; recomputing from the prompt gives the same tokens).
  std::vector<Replica*> two = {replicas[0].get(), replicas[1].get()};
  auto again = MakeBatches(batches, 11);
  std::vector<absl::Status> errors2;
  const auto got = Drive(
      again, [&](int batch, StepPlan plan) { return Broadcast(two, batch, plan, layers); }, true,
      ids, &errors2);
  for (const absl::Status& e : errors2) ASSERT_TRUE(e.ok()) << e;
  for (const auto& [id, tokens] : expected) EXPECT_EQ(got.at(id), tokens) << "sequence " << id;
  replicas[0]->Stop();
  replicas[1]->Stop();
}

// A replica dies while every batch is mid-rotation: the batches in flight fail at once
// with an error naming it, none hangs, and the two survivors then run every sequence again
// from its tokens (setups with the history), bit-identical to pipelining off. A survivor
// that waits for the dead one's context learns that it is gone from its connection's end,
// not from its hand-off deadline: the deadlines here are a minute, far past the test's
// bound.
TEST_F(RotationTest, DeadReplicaFailsItsBatchesAndTheSurvivorsGoOn) {
  LoseAReplica(weights_, Reference(4, /*greedy=*/true), Loss::kDies);
}

// A replica that hangs keeps its connections to the others open: they learn that its
// contexts will not come from the scheduler's declaration (ComputeConfig's departed
// replicas), not at their hand-off deadline.
TEST_F(RotationTest, HungReplicaIsGivenUpWhenTheSchedulerDeclaresItDead) {
  LoseAReplica(weights_, Reference(4, /*greedy=*/true), Loss::kHangs);
}

// A replica that hangs right after it handed its context over, with its layer frames still
// queued on it (UCX had not sent them when the process stopped): the next replica has the
// context but not the answers those frames asked the memory nodes for. Once the scheduler
// declares the hung replica dead, that lane gives up at once, not at the layer deadline (a
// minute here).
TEST_F(RotationTest, AContextFromAReplicaDeclaredDeadIsNotWaitedOnForItsAnswers) {
  const int batches = 4;
  ModelRunner runner(weights_, kMaxPositions);
  MemoryPools pools(runner.config());
  std::vector<std::unique_ptr<Replica>> replicas =
      MakeReplicas(runner, pools, batches, absl::Seconds(60));
  const int layers = static_cast<int>(runner.config().num_layers);
  auto b = MakeBatches(batches, 11);
  // Batch 2's slice 0 runs on replica 2 (batch mod 3), which hangs before the plan: the test
  // hands its context of slice 1 to replica 0 in its place, and sends no layer frame.
  replicas[2]->Hang();
  const StepPlan plan = MakePlan(1, b[2], /*prefill=*/true, /*greedy=*/true);
  int64_t rows = 0;
  for (const SequenceChunk& c : plan.chunks) rows += static_cast<int64_t>(c.tokens.size());
  const std::vector<float> x(rows * runner.config().hidden_size, 0.5f);
  const std::string hung = replicas[2]->address;
  std::thread declare;
  std::vector<absl::Status> replica_errors;
  const absl::Time start = absl::Now();
  const StepResult r = Broadcast(Pointers(replicas), 2, plan, layers, &replica_errors, [&] {
    ASSERT_TRUE(
        replicas[2]->exchange->Send(replicas[0]->address, plan.step_id, 1, 2, x.data(), rows).ok());
    declare = std::thread([&] {
      absl::SleepFor(absl::Milliseconds(300));  // the context is there
      for (int i = 0; i < 2; ++i) replicas[i]->exchange->Depart(hung, plan.step_id);
    });
  });
  declare.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "a lane waited for the layer deadline";
  EXPECT_FALSE(r.status.ok());
  bool gave_up = false;
  for (const absl::Status& e : replica_errors) {
    LOG(INFO) << "replica error: " << e;
    EXPECT_FALSE(absl::StrContains(e.message(), "no answer for layer")) << e;
    gave_up = gave_up || (absl::StrContains(e.message(), hung) &&
                          absl::StrContains(e.message(), "answers of layer 0"));
  }
  EXPECT_TRUE(gave_up) << "no replica gave up the answers the hung one had asked for";
  replicas[0]->Stop();
  replicas[1]->Stop();
}

}  // namespace
}  // namespace strata
