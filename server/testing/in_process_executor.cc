#include "server/testing/in_process_executor.h"

namespace strata {

InProcessExecutor::InProcessExecutor(std::string name, StepEngine* engine)
    : name_(std::move(name)), engine_(engine), thread_([this] { Run(); }) {}

InProcessExecutor::~InProcessExecutor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void InProcessExecutor::Submit(StepPlan plan, StepResultSink sink) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.emplace_back(std::move(plan), std::move(sink));
  }
  cv_.notify_one();
}

void InProcessExecutor::Run() {
  while (true) {
    std::pair<StepPlan, StepResultSink> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    job.second(engine_->Execute(job.first));
  }
}

}  // namespace strata
