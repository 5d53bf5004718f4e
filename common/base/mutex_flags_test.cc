#include "common/base/mutex_flags.h"

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

ABSL_DECLARE_FLAG(bool, mutex_deadlock_detection);

namespace strata {
namespace {

// Takes a then b, then b then a: an order that could deadlock between two threads, though
// on one it never does.
void InvertLockOrder() {
  absl::Mutex a, b;
  {
    absl::MutexLock la(&a);
    absl::MutexLock lb(&b);
  }
  {
    absl::MutexLock lb(&b);
    absl::MutexLock la(&a);
  }
}

TEST(MutexFlagsDeathTest, WithDetectionALockOrderCycleAbortsTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  absl::SetFlag(&FLAGS_mutex_deadlock_detection, true);
  ApplyMutexDeadlockDetectionFlag();
  EXPECT_DEATH(InvertLockOrder(), "[Dd]eadlock");
}

TEST(MutexFlags, TheBinariesDefaultLetsACycleThrough) {
  absl::SetFlag(&FLAGS_mutex_deadlock_detection, false);  // the flag's default
  ApplyMutexDeadlockDetectionFlag();
  InvertLockOrder();  // would abort with detection on (the test above)
  SUCCEED();
}

}  // namespace
}  // namespace strata
