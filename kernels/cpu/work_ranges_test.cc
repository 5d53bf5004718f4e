#include "kernels/cpu/work_ranges.h"

#include <omp.h>

#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace strata::kernels {
namespace {

std::vector<int64_t> Drain(WorkRanges& work, int id) {
  std::vector<int64_t> taken;
  for (int64_t item = work.Next(id); item >= 0; item = work.Next(id)) taken.push_back(item);
  return taken;
}

TEST(WorkRanges, SplitsAsScheduleStaticDoes) {
  WorkRanges work;
  work.Reset(10, 3);  // 4, 3, 3
  EXPECT_EQ(work.PeekFront(0), 0);
  EXPECT_EQ(work.PeekFront(1), 4);
  EXPECT_EQ(work.PeekFront(2), 7);
  EXPECT_EQ(work.PeekFront(3), -1);  // no range of its own
  EXPECT_EQ(work.Next(1), 4);
  EXPECT_EQ(work.PeekFront(1), 5);
}

TEST(WorkRanges, OwnItemsFrontFirstThenTheOthersFromTheBack) {
  WorkRanges work;
  work.Reset(10, 3);
  EXPECT_EQ(Drain(work, 0), (std::vector<int64_t>{0, 1, 2, 3, 6, 5, 4, 9, 8, 7}));
  EXPECT_EQ(work.Next(1), -1);
  EXPECT_EQ(work.Next(2), -1);
}

TEST(WorkRanges, OwnerAndThiefMeetWithoutOverlap) {
  WorkRanges work;
  work.Reset(6, 2);  // [0, 3) and [3, 6)
  EXPECT_EQ(work.Next(1), 3);
  EXPECT_EQ(work.Next(0), 0);
  EXPECT_EQ(work.Next(1), 4);
  EXPECT_EQ(work.Next(1), 5);
  EXPECT_EQ(work.Next(1), 2);  // its own is done: the back of range 0
  EXPECT_EQ(work.Next(0), 1);
  EXPECT_EQ(work.Next(0), -1);
  EXPECT_EQ(work.Next(1), -1);
  work.Reset(0, 2);
  EXPECT_EQ(work.Next(0), -1);
  work.Reset(1, 4);
  EXPECT_EQ(work.Next(3), 0);
  EXPECT_EQ(work.Next(0), -1);
}

// A team whose thread 0 starts late, as one the OS stopped: every item is taken exactly
// once, and the others take part of thread 0's range.
TEST(WorkRanges, ATeamTakesEveryItemOnceAndCoversALateThread) {
  for (const int ranges : {4, 2}) {  // 2: a team larger than the ranges
    constexpr int64_t kItems = 20000;
    WorkRanges work;
    work.Reset(kItems, ranges);
    std::vector<int> taken_by(kItems, -1);
    std::vector<int> counts(kItems, 0);
    int team = 0;
#pragma omp parallel num_threads(4)
    {
      const int id = omp_get_thread_num();
      if (id == 0) team = omp_get_num_threads();
      if (id == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      for (int64_t item = work.Next(id); item >= 0; item = work.Next(id)) {
        taken_by[item] = id;
#pragma omp atomic
        ++counts[item];
      }
    }
    int64_t of_range0_by_others = 0;
    for (int64_t i = 0; i < kItems; ++i) {
      ASSERT_EQ(counts[i], 1) << "item " << i << " with " << ranges << " ranges";
      if (i < kItems / ranges && taken_by[i] != 0) ++of_range0_by_others;
    }
    // Where the runtime gave fewer threads (a thread limit), nobody else was there to help.
    if (team > 1) EXPECT_GT(of_range0_by_others, 0) << ranges << " ranges";
  }
}

}  // namespace
}  // namespace strata::kernels
