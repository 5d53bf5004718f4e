// The results a step executor hands its sinks, collected in the order the sinks ran, for
// tests of executors (data_plane_executor_test, grpc_executor_test).
#ifndef STRATA_SERVER_TESTING_STEP_RESULTS_H_
#define STRATA_SERVER_TESTING_STEP_RESULTS_H_

#include <condition_variable>
#include <mutex>
#include <vector>

#include "absl/time/time.h"
#include "server/step_executor.h"

namespace strata::testing {

class StepResults {
 public:
  StepResultSink Sink() {
    return [this](StepResult r) {
      std::lock_guard<std::mutex> lock(mu_);
      results_.push_back(std::move(r));
      cv_.notify_all();
    };
  }
  // True once `n` results have come; false if `timeout` passed first.
  bool WaitFor(size_t n, absl::Duration timeout = absl::Seconds(20)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                        [&] { return results_.size() >= n; });
  }
  std::vector<StepResult> Take() {
    std::lock_guard<std::mutex> lock(mu_);
    return results_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<StepResult> results_;
};

}  // namespace strata::testing

#endif  // STRATA_SERVER_TESTING_STEP_RESULTS_H_
