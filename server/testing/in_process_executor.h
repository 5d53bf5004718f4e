// A compute node in the scheduler's own process: a StepEngine run on a worker thread. Used
// by scheduler tests and benchmarks, which then exercise the real forward pass without
// gRPC in between.
#ifndef STRATA_SERVER_TESTING_IN_PROCESS_EXECUTOR_H_
#define STRATA_SERVER_TESTING_IN_PROCESS_EXECUTOR_H_

#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

#include "compute_node/step_engine.h"
#include "server/step_executor.h"

namespace strata {

class InProcessExecutor : public StepExecutor {
 public:
  // `engine` must outlive this executor.
  InProcessExecutor(std::string name, StepEngine* engine);
  ~InProcessExecutor() override;

  std::string name() const override { return name_; }
  void Submit(StepPlan plan, StepResultSink sink) override;

 private:
  void Run();

  std::string name_;
  StepEngine* engine_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<StepPlan, StepResultSink>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace strata

#endif  // STRATA_SERVER_TESTING_IN_PROCESS_EXECUTOR_H_
