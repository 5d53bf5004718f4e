// The wait policy as libgomp applies it: a child process started with the policy's
// environment runs parallel regions and then idles; its threads must stop burning CPU soon
// after (a bounded spin), where OMP_WAIT_POLICY=ACTIVE, the control, keeps them spinning.
#include "common/base/wait_policy.h"

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace strata {
namespace {

constexpr int kIdleMs = 300;

// Runs the probe with `env` (NAME=VALUE ..., on top of the test's environment less the
// OpenMP wait variables) and `args`, and returns the second figure it prints (after its
// thread count); -1 if it did not run.
double Probe(const std::vector<std::string>& env, const std::string& args) {
  std::string command = "env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT";
  for (const std::string& e : env) command += " " + e;
  command += " common/base/wait_policy_probe " + args;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return -1;
  int threads = 0;
  double figure = -1;
  if (std::fscanf(pipe, "%d %lf", &threads, &figure) != 2) figure = -1;
  pclose(pipe);
  return figure;
}

// CPU seconds the probe burnt while idle, started with `env`.
double IdleCpuSeconds(const std::vector<std::string>& env) {
  return Probe(env, std::to_string(kIdleMs));
}

TEST(WaitPolicyTest, EnvironmentFollowsTheCoreLayout) {
  const auto shared = OpenMpEnvironment(4, CoreShare::kShared);
  EXPECT_EQ(shared.at("OMP_NUM_THREADS"), "4");
  EXPECT_EQ(shared.at("GOMP_SPINCOUNT"), std::to_string(kSharedCoreSpinCount));
  EXPECT_EQ(shared.count("OMP_WAIT_POLICY"), 0u);  // it would override the spin count
  EXPECT_EQ(OpenMpEnvironment(4, CoreShare::kDedicated).at("GOMP_SPINCOUNT"),
            std::to_string(kDedicatedCoreSpinCount));
  EXPECT_LT(kSharedCoreSpinCount, kDedicatedCoreSpinCount);
  EXPECT_EQ(OpenMpEnvironment(0, CoreShare::kShared, 123).at("OMP_NUM_THREADS"), "1");
  EXPECT_EQ(OpenMpEnvironment(2, CoreShare::kShared, 123).at("GOMP_SPINCOUNT"), "123");
  EXPECT_EQ(OpenMpEnvironmentList(2, CoreShare::kShared, 7),
            (std::vector<std::string>{"GOMP_SPINCOUNT=7", "OMP_NUM_THREADS=2"}));
}

TEST(WaitPolicyTest, NoSpinWithoutBound) {
  // Two threads, on a machine with at least two cores (libgomp throttles the spin to 100
  // iterations when threads outnumber cores).
  for (CoreShare share : {CoreShare::kShared, CoreShare::kDedicated}) {
    const double idle = IdleCpuSeconds(OpenMpEnvironmentList(2, share));
    ASSERT_GE(idle, 0) << "the probe did not run";
    // A bounded spin costs a few milliseconds at most; a third of the idle time is far
    // above that and far below a thread spinning throughout.
    EXPECT_LT(idle, kIdleMs / 3 / 1000.0) << "GOMP_SPINCOUNT=" << SpinCountFor(share);
  }
  // The control: an unbounded spin burns a core for the whole idle time.
  const double active = IdleCpuSeconds({"OMP_NUM_THREADS=2", "OMP_WAIT_POLICY=ACTIVE"});
  EXPECT_GT(active, kIdleMs / 3 / 1000.0);
}

// Voluntary context switches of the probe's `teams` mode (`how`: own or kept), with as many
// OpenMP threads as cores, so that a second team makes the threads outnumber the cores.
long TeamSwitches(const std::string& how, int regions) {
  return static_cast<long>(
      Probe({"OMP_NUM_THREADS=" + std::to_string(std::thread::hardware_concurrency()),
             "GOMP_SPINCOUNT=" + std::to_string(kSharedCoreSpinCount)},
            "teams " + how + " " + std::to_string(regions)));
}

TEST(WaitPolicyTest, WorkOnItsOwnThreadLeavesNoTeamBehind) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "needs two cores";
  constexpr int kRegions = 2000;
  // Parallel regions with 20 us gaps, after another thread ran one through
  // OnOwnOpenMpThread: the team spins across the gaps, and hardly a thread sleeps.
  const long own = TeamSwitches("own", kRegions);
  ASSERT_GE(own, 0) << "the probe did not run";
  EXPECT_LT(own, kRegions / 10);
  // The control: the other thread stays alive with its team, the threads outnumber the
  // cores, libgomp cuts the spin to 100 iterations, and a thread sleeps in every gap.
  const long kept = TeamSwitches("kept", kRegions);
  EXPECT_GT(kept, kRegions / 2);
}

TEST(WaitPolicyTest, OnOwnOpenMpThreadReturnsWhatTheWorkReturns) {
  const std::thread::id caller = std::this_thread::get_id();
  EXPECT_NE(OnOwnOpenMpThread([] { return std::this_thread::get_id(); }), caller);
  auto moved = OnOwnOpenMpThread([] { return std::make_unique<int>(7); });
  ASSERT_NE(moved, nullptr);
  EXPECT_EQ(*moved, 7);
  int ran = 0;
  OnOwnOpenMpThread([&ran] { ran = 1; });
  EXPECT_EQ(ran, 1);
}

// A service thread's children are service threads; OnOwnOpenMpThread's thread and its whole
// OpenMP team are compute threads, and its caller stays what it was.
TEST(ThreadRoleTest, ServiceThreadsPassTheRoleOnAndComputeTeamsTakeTheirOwn) {
  const ThreadRole runner = CurrentThreadRole();
  bool set = false;
  ThreadRole child = ThreadRole::kCompute, caller_after = ThreadRole::kCompute;
  std::vector<ThreadRole> team(2, ThreadRole::kService);
  int team_size = 0;
  std::thread service([&] {
    set = SetThreadRole(ThreadRole::kService);
    if (!set) return;
    std::thread([&] { child = CurrentThreadRole(); }).join();
    OnOwnOpenMpThread(
        [&] {
#pragma omp parallel num_threads(2)
          {
            team[omp_get_thread_num()] = CurrentThreadRole();
#pragma omp single
            team_size = omp_get_num_threads();
          }
        },
        2);
    caller_after = CurrentThreadRole();
  });
  service.join();
  if (!set) GTEST_SKIP() << "the kernel refused SCHED_BATCH here";
  EXPECT_EQ(child, ThreadRole::kService);
  ASSERT_EQ(team_size, 2);
  EXPECT_EQ(team[0], ThreadRole::kCompute);
  EXPECT_EQ(team[1], ThreadRole::kCompute);
  EXPECT_EQ(caller_after, ThreadRole::kService);
  // Only that thread changed.
  EXPECT_EQ(CurrentThreadRole(), runner);
}

// A compute thread starting service threads under a ServiceThreadScope: they are service
// threads where the process's service threads yield, and the compute thread is a compute
// thread again after the scope; where they do not yield, nothing changes.
TEST(ThreadRoleTest, AServiceThreadScopeStartsServiceThreadsFromAComputeThread) {
  for (bool yield : {true, false}) {
    SetServiceThreadsYield(yield);
    ThreadRole started = ThreadRole::kCompute, inside = ThreadRole::kCompute,
               after = ThreadRole::kService;
    bool compute = false;
    OnOwnOpenMpThread([&] {
      compute = CurrentThreadRole() == ThreadRole::kCompute;
      {
        ServiceThreadScope scope;
        inside = CurrentThreadRole();
        std::thread([&] { started = CurrentThreadRole(); }).join();
      }
      after = CurrentThreadRole();
    });
    SetServiceThreadsYield(false);
    ASSERT_TRUE(compute);
    if (yield && inside != ThreadRole::kService) GTEST_SKIP() << "the kernel refused SCHED_BATCH";
    const ThreadRole want = yield ? ThreadRole::kService : ThreadRole::kCompute;
    EXPECT_EQ(inside, want) << "yield " << yield;
    EXPECT_EQ(started, want) << "yield " << yield;
    EXPECT_EQ(after, ThreadRole::kCompute) << "yield " << yield;
  }
}

}  // namespace
}  // namespace strata
