// --mutex_deadlock_detection, for the server and the node binaries (compute_node,
// memory_node).
//
// Debian's abseil is built without NDEBUG, so its Mutex runs the debug build's deadlock
// detector in every process that links it: each acquisition made while another Mutex is
// held records the lock order in a process-wide graph under a global lock, and an order
// that could deadlock aborts the process. The binaries turn it off unless the flag asks
// for it, as a release build of abseil does: a serving process should not pay for it on
// every lock, nor die of a cycle that has not happened. Tests keep it: unit tests never
// call this, and the tests that start processes (tests/common/deployment.h) start them
// with the flag, through the launcher's --mutex_deadlock_detection.
#ifndef STRATA_COMMON_BASE_MUTEX_FLAGS_H_
#define STRATA_COMMON_BASE_MUTEX_FLAGS_H_

namespace strata {

// Call in main after the command line is parsed, before any thread starts.
void ApplyMutexDeadlockDetectionFlag();

}  // namespace strata

#endif  // STRATA_COMMON_BASE_MUTEX_FLAGS_H_
