// A compute node in the scheduler's own process: a StepEngine run on a worker thread. Used
// by scheduler tests and benchmarks, which then exercise the real forward pass without
// gRPC in between. An engine with two lanes runs two plans at once (step_pipeline.h), as
// a compute node started with --pipelining=two does.
#ifndef STRATA_SERVER_TESTING_IN_PROCESS_EXECUTOR_H_
#define STRATA_SERVER_TESTING_IN_PROCESS_EXECUTOR_H_

#include <string>
#include <thread>

#include "compute_node/rotation.h"
#include "compute_node/step_engine.h"
#include "compute_node/step_pipeline.h"
#include "server/step_executor.h"

namespace strata {

class InProcessExecutor : public StepExecutor {
 public:
  // `engine` must outlive this executor.
  InProcessExecutor(std::string name, StepEngine* engine);
  // A replica of a rotation (compute_node/rotation.h): plans run by RunRotation, one lane
  // per batch slot. What `rotation` points to must outlive this executor.
  InProcessExecutor(std::string name, StepEngine* engine, RotationDriverOptions rotation);
  ~InProcessExecutor() override;

  std::string name() const override { return name_; }
  void Submit(std::shared_ptr<const StepPlan> plan, StepResultSink sink) override;

 private:
  std::string name_;
  StepEngine* engine_;
  PlanQueue queue_;
  std::thread thread_;
};

}  // namespace strata

#endif  // STRATA_SERVER_TESTING_IN_PROCESS_EXECUTOR_H_
