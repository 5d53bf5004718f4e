// Attention offloading in one process: the scheduler, compute engines with remote attention
// and real memory servers, connected by a real transport (in-process queues, or UCX over
// loopback TCP). Greedy outputs must be bit-identical to co-located attention for every
// topology, policy and mini-batching, and a memory node that dies mid-generation only
// moves its requests.
#include <set>

#include "server/in_process_deployment.h"

namespace strata {
namespace {

using namespace in_process;  // NOLINT: the harness's types

class DisaggregatedTest : public InProcessDeploymentTest {
 protected:
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
};

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
  std::vector<GenerateRequest> requests = MixedRequests(20, 500, 900);
  auto run = [&](const Topology& t, int64_t slots, int64_t* preemptions) {
    Deployment d(weights_, t, slots);
    std::vector<std::shared_ptr<Outcome>> outcomes;
    for (const GenerateRequest& r : requests) outcomes.push_back(d.Submit(r));
    EXPECT_TRUE(d.Wait(outcomes)) << Name(t);
    *preemptions = d.scheduler().Stats().num_preemptions_total;
    EXPECT_EQ(d.scheduler().Stats().planner_shortfalls_total, 0) << Name(t);
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
        Topology{2, 1, "inproc", "split", 2, 2, false, true},
        Topology{2, 2, "inproc", "memory", 2, 1, false, false, false, true}}) {
    SCOPED_TRACE(Name(t));
    Deployment d(weights_, t, 2048);
    std::mutex mu;
    std::condition_variable cv;
    int steps = 0;
    std::set<SequenceId> on_dead_pool;  // every sequence a plan ran on pool 1 before it died
    bool killed = false;
    // Asynchronous: a plan back held rows ahead (naming the token the plan before samples)
    // on both pools, as the plans in flight then do.
    bool ahead_on_both = false;
    d.observer_.on_step = [&](const StepPlan& plan, const StepResult&, absl::Duration) {
      std::lock_guard<std::mutex> lock(mu);
      ++steps;
      bool ahead[2] = {false, false};
      for (const SequenceChunk& c : plan.chunks) {
        if (!killed && c.pool == PoolIndex(1)) on_dead_pool.insert(c.request_id);
        if (c.tokens == std::vector<int32_t>{kLastSampledToken} && c.pool.value() < 2) {
          ahead[c.pool.value()] = true;
        }
      }
      ahead_on_both = ahead_on_both || (ahead[0] && ahead[1]);
      cv.notify_all();
    };
    d.scheduler().SetObserver(d.observer_);
    std::vector<std::shared_ptr<Outcome>> outcomes;
    for (const auto& r : requests) outcomes.push_back(d.Submit(r));
    int64_t preempted_before = 0;
    {
      std::unique_lock<std::mutex> lock(mu);
      ASSERT_TRUE(cv.wait_for(lock, absl::ToChronoNanoseconds(absl::Seconds(60)),
                              [&] { return steps >= 6 && (!t.async || ahead_on_both); }));
      killed = true;
      preempted_before = d.scheduler().Stats().num_preemptions_total;
    }
    // Memory node 1 goes away mid-generation (its transport closes with it).
    d.memory()[1].reset();
    ASSERT_TRUE(d.Wait(outcomes));
    // Only its own requests were moved (recomputed elsewhere): a plan ahead holding rows of
    // both pools refuses the dead pool's rows alone, not the others' (whose KV used to be
    // recomputed too), and a rotated step goes on for the live pool's rows (it used to fail
    // whole and move every request it held).
    EXPECT_LE(d.scheduler().Stats().num_preemptions_total - preempted_before,
              static_cast<int64_t>(on_dead_pool.size()));
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

}  // namespace
}  // namespace strata
