#include "server/testing/in_process_executor.h"

namespace strata {

InProcessExecutor::InProcessExecutor(std::string name, StepEngine* engine)
    : name_(std::move(name)), engine_(engine), thread_([this] { RunPipeline(*engine_, queue_); }) {}

InProcessExecutor::~InProcessExecutor() {
  queue_.Close();
  thread_.join();
}

void InProcessExecutor::Submit(StepPlan plan, StepResultSink sink) {
  queue_.Push({std::move(plan), std::nullopt, std::move(sink)});
}

}  // namespace strata
