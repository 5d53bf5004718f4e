// Names for threads, as `top -H`, `perf` and /proc/PID/task/TID/comm show them. A thread
// that is not named shows its creator's name, so a process's threads would all read
// "server" or "grpcpp_sync_ser".
#ifndef STRATA_COMMON_BASE_THREAD_NAME_H_
#define STRATA_COMMON_BASE_THREAD_NAME_H_

#include <string>
#include <string_view>

namespace strata {

// Names the calling thread; Linux keeps the first 15 bytes. Threads it creates later start
// with the same name.
void SetCurrentThreadName(std::string_view name);

// The calling thread's name.
std::string CurrentThreadName();

}  // namespace strata

#endif  // STRATA_COMMON_BASE_THREAD_NAME_H_
