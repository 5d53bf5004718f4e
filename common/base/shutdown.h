// Process shutdown on SIGINT/SIGTERM, for every strata binary.
//
// Call InstallShutdownHandlers() first thing in main(), before any thread starts: it blocks
// the signals in every thread and waits for them on a dedicated one. WaitForShutdown()
// returns once a signal arrived or RequestShutdown() was called (e.g. by a Shutdown RPC).
#ifndef STRATA_COMMON_BASE_SHUTDOWN_H_
#define STRATA_COMMON_BASE_SHUTDOWN_H_

#include "absl/time/time.h"

namespace strata {

void InstallShutdownHandlers();
void RequestShutdown();
void WaitForShutdown();
// Returns true if shutdown was requested within `timeout`.
bool WaitForShutdownFor(absl::Duration timeout);
bool ShutdownRequested();

}  // namespace strata

#endif  // STRATA_COMMON_BASE_SHUTDOWN_H_
