#include "server/testing/in_process_executor.h"

namespace strata {

InProcessExecutor::InProcessExecutor(std::string name, StepEngine* engine)
    : name_(std::move(name)), engine_(engine), thread_([this] { RunPipeline(*engine_, queue_); }) {}

InProcessExecutor::InProcessExecutor(std::string name, StepEngine* engine,
                                     RotationDriverOptions rotation)
    : name_(std::move(name)), engine_(engine) {
  Wakeup* wakeup = rotation.wakeup;
  queue_.SetOnChange([wakeup] { wakeup->Notify(); });
  thread_ = std::thread([this, rotation] { RunRotation(*engine_, queue_, rotation); });
}

InProcessExecutor::~InProcessExecutor() {
  queue_.Close();
  thread_.join();
}

void InProcessExecutor::Submit(std::shared_ptr<const StepPlan> plan, StepResultSink sink) {
  queue_.Push({*plan, std::nullopt, std::move(sink)});  // the node's own copy, as over gRPC
}

}  // namespace strata
