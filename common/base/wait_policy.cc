#include "common/base/wait_policy.h"

#include <sched.h>

#include <atomic>
#include <string>

namespace strata {

bool SetThreadRole(ThreadRole role) {
  sched_param param{};
  // On Linux, pid 0 is the calling thread alone.
  return sched_setscheduler(0, role == ThreadRole::kService ? SCHED_BATCH : SCHED_OTHER, &param) ==
         0;
}

ThreadRole CurrentThreadRole() {
  return sched_getscheduler(0) == SCHED_BATCH ? ThreadRole::kService : ThreadRole::kCompute;
}

namespace {
std::atomic<bool> service_threads_yield{false};
}  // namespace

void SetServiceThreadsYield(bool yield) { service_threads_yield.store(yield); }
bool ServiceThreadsYield() { return service_threads_yield.load(); }

ServiceThreadScope::ServiceThreadScope() : before_(CurrentThreadRole()) {
  if (ServiceThreadsYield() && before_ != ThreadRole::kService) {
    changed_ = SetThreadRole(ThreadRole::kService);
  }
}

ServiceThreadScope::~ServiceThreadScope() {
  if (changed_) SetThreadRole(before_);
}

int64_t SpinCountFor(CoreShare share) {
  return share == CoreShare::kDedicated ? kDedicatedCoreSpinCount : kSharedCoreSpinCount;
}

std::map<std::string, std::string> OpenMpEnvironment(int threads, CoreShare share,
                                                     int64_t spin_count) {
  const int64_t spins = spin_count >= 0 ? spin_count : SpinCountFor(share);
  return {{"OMP_NUM_THREADS", std::to_string(threads < 1 ? 1 : threads)},
          {"GOMP_SPINCOUNT", std::to_string(spins)}};
}

std::vector<std::string> OpenMpEnvironmentList(int threads, CoreShare share, int64_t spin_count) {
  std::vector<std::string> out;
  for (const auto& [name, value] : OpenMpEnvironment(threads, share, spin_count)) {
    out.push_back(name + "=" + value);
  }
  return out;
}

}  // namespace strata
