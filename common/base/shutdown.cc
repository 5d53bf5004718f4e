#include "common/base/shutdown.h"

#include <pthread.h>
#include <signal.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "common/base/logging.h"

namespace strata {
namespace {

std::mutex mu;
std::condition_variable cv;
bool requested = false;

}  // namespace

void InstallShutdownHandlers() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a closed socket is an error return, not a crash
  std::thread([set] {
    int sig = 0;
    sigwait(&set, &sig);
    LOG(INFO) << "received signal " << sig << ", shutting down";
    RequestShutdown();
  }).detach();
}

void RequestShutdown() {
  {
    std::lock_guard<std::mutex> lock(mu);
    requested = true;
  }
  cv.notify_all();
}

void WaitForShutdown() {
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [] { return requested; });
}

bool WaitForShutdownFor(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu);
  return cv.wait_for(lock, absl::ToChronoMilliseconds(timeout), [] { return requested; });
}

bool ShutdownRequested() {
  std::lock_guard<std::mutex> lock(mu);
  return requested;
}

}  // namespace strata
