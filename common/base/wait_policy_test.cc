// The wait policy as libgomp applies it: a child process started with the policy's
// environment runs parallel regions and then idles; its threads must stop burning CPU soon
// after (a bounded spin), where OMP_WAIT_POLICY=ACTIVE, the control, keeps them spinning.
#include "common/base/wait_policy.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "gtest/gtest.h"

namespace strata {
namespace {

constexpr int kIdleMs = 300;

// CPU seconds the probe burnt while idle, started with `env` (NAME=VALUE ...).
double IdleCpuSeconds(const std::vector<std::string>& env) {
  std::string command = "env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT";
  for (const std::string& e : env) command += " " + e;
  command += " common/base/wait_policy_probe " + std::to_string(kIdleMs);
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return -1;
  int threads = 0;
  double seconds = -1;
  if (std::fscanf(pipe, "%d %lf", &threads, &seconds) != 2) seconds = -1;
  pclose(pipe);
  return seconds;
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

}  // namespace
}  // namespace strata
