#include "common/base/mutex_flags.h"

#include "absl/flags/flag.h"
#include "absl/synchronization/mutex.h"

ABSL_FLAG(bool, mutex_deadlock_detection, false,
          "Run abseil's Mutex deadlock detector (abort on a lock-order cycle), as Debian's "
          "abseil does by default; off: a release build's behaviour");

namespace strata {

void ApplyMutexDeadlockDetectionFlag() {
  absl::SetMutexDeadlockDetectionMode(absl::GetFlag(FLAGS_mutex_deadlock_detection)
                                          ? absl::OnDeadlockCycle::kAbort
                                          : absl::OnDeadlockCycle::kIgnore);
}

}  // namespace strata
