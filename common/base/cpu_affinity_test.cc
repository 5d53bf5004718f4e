#include "common/base/cpu_affinity.h"

#include <omp.h>
#include <sched.h>

#include <thread>

#include "gtest/gtest.h"

namespace strata {
namespace {

TEST(CpuListTest, ParsesSinglesAndRanges) {
  auto cpus = ParseCpuList("6,0-3,2");
  ASSERT_TRUE(cpus.ok()) << cpus.status();
  EXPECT_EQ(*cpus, (std::vector<int>{0, 1, 2, 3, 6}));
  EXPECT_EQ(FormatCpuList(*cpus), "0-3,6");
  EXPECT_EQ(FormatCpuList({1, 3, 4, 5, 9}), "1,3-5,9");
  EXPECT_EQ(FormatCpuList({}), "");
}

TEST(CpuListTest, RefusesMalformedLists) {
  for (const char* bad :
       {"", ",", "1,", "a", "1-", "-3", "3-1", "1.5", "2 ", "99999", "1--2", "0x1"}) {
    EXPECT_FALSE(ParseCpuList(bad).ok()) << "\"" << bad << "\"";
  }
}

TEST(CpuListTest, RoundTrips) {
  for (const char* list : {"0", "0-1", "0,2,4", "1-3,7-8,12"}) {
    auto cpus = ParseCpuList(list);
    ASSERT_TRUE(cpus.ok());
    EXPECT_EQ(FormatCpuList(*cpus), list);
  }
}

TEST(SplitCpusTest, DisjointAndCovering) {
  const std::vector<int> cpus = {0, 1, 2, 3, 4};
  auto parts = SplitCpus(cpus, 2);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0], (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(parts[1], (std::vector<int>{1, 3}));
  // More parts than cores: each part still gets one, shared round-robin.
  parts = SplitCpus({4, 5}, 3);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0], (std::vector<int>{4}));
  EXPECT_EQ(parts[1], (std::vector<int>{5}));
  EXPECT_EQ(parts[2], (std::vector<int>{4}));
  EXPECT_TRUE(SplitCpus(cpus, 0).empty());
}

TEST(CorePartitionTest, AcceptsDisjointListsAndRefusesTheRest) {
  const std::vector<int> allowed = {0, 1, 2, 3};
  auto ok = ParseCorePartition("0", "1-3", allowed);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->compute, (std::vector<int>{0}));
  EXPECT_EQ(ok->memory, (std::vector<int>{1, 2, 3}));
  struct Bad {
    const char* compute;
    const char* memory;
    const char* says;
  };
  for (const Bad& bad : {Bad{"0-1", "1-2", "overlap at core 1"}, Bad{"", "1", "--compute_cpus"},
                         Bad{"0", "", "--memory_cpus"}, Bad{"0", "4", "core 4 is not on"},
                         Bad{"0,x", "1", "--compute_cpus"}}) {
    auto got = ParseCorePartition(bad.compute, bad.memory, allowed);
    ASSERT_FALSE(got.ok()) << bad.compute << " / " << bad.memory;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(got.status().message()).find(bad.says), std::string::npos)
        << got.status();
  }
}

TEST(PinTest, PinsThisThreadAndItsChildren) {
  const std::vector<int> allowed = AllowedCpus();
  ASSERT_FALSE(allowed.empty());
  // Run in a thread of its own so the test's main thread keeps its mask.
  std::thread([&] {
    const std::string one = std::to_string(allowed.back());
    ASSERT_TRUE(PinProcessToCpus(one).ok());
    EXPECT_EQ(AllowedCpus(), std::vector<int>{allowed.back()});
    std::vector<int> seen_by_child;
    std::thread([&] { seen_by_child = AllowedCpus(); }).join();
    EXPECT_EQ(seen_by_child, std::vector<int>{allowed.back()});
    // A core outside the mask is refused, and the mask stays as it was.
    const absl::Status refused = PinProcessToCpus(std::to_string(CPU_SETSIZE - 1));
    EXPECT_FALSE(refused.ok());
    EXPECT_NE(refused.message().find("not available"), absl::string_view::npos);
    EXPECT_EQ(AllowedCpus(), std::vector<int>{allowed.back()});
  }).join();
  EXPECT_EQ(AllowedCpus(), allowed);
}

TEST(PinTest, CpuFlagsSizeOpenMpTeam) {
  const std::vector<int> allowed = AllowedCpus();
  std::thread([&] {
    ASSERT_TRUE(ApplyCpuFlags(std::to_string(allowed.front()), 0).ok());
    EXPECT_EQ(omp_get_max_threads(), 1);
    int team = 0;
#pragma omp parallel
    {
#pragma omp single
      team = omp_get_num_threads();
    }
    EXPECT_EQ(team, 1);
    ASSERT_TRUE(ApplyCpuFlags("", 3).ok());  // --threads alone still applies
    EXPECT_EQ(omp_get_max_threads(), 3);
    EXPECT_FALSE(ApplyCpuFlags("1-0", 0).ok());
  }).join();
}

}  // namespace
}  // namespace strata
