#include "compute_node/step_pipeline.h"

#include <vector>

#include "common/base/stopwatch.h"

namespace strata {

void PlanQueue::Push(QueuedPlan plan) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    plans_.push_back(std::move(plan));
  }
  cv_.notify_one();
}

void PlanQueue::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

std::optional<QueuedPlan> PlanQueue::Pop(bool wait) {
  std::unique_lock<std::mutex> lock(mu_);
  if (wait) cv_.wait(lock, [&] { return closed_ || !plans_.empty(); });
  if (plans_.empty()) return std::nullopt;
  QueuedPlan plan = std::move(plans_.front());
  plans_.pop_front();
  return plan;
}

bool PlanQueue::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

void RunPipeline(LaneEngine& engine, PlanQueue& queue, const PlanWaitObserver& on_wait) {
  struct Running {
    QueuedPlan queued;
    int lane = -1;  // while it runs
    std::optional<StepResult> result;
  };
  // Plans in the order they came; references stay valid as the deque grows at the back.
  std::deque<Running> order;
  const int lanes = engine.num_lanes();
  std::vector<bool> lane_busy(lanes, false);
  int busy = 0;
  uint64_t handed_on = 0;
  auto hand_on = [&] {
    while (!order.empty() && order.front().result) {
      Running& r = order.front();
      r.queued.done(std::move(*r.result));
      ++handed_on;
      order.pop_front();
    }
  };
  while (true) {
    // Fill the free lanes: wait for a plan only when nothing runs.
    for (int lane = 0; lane < lanes;) {
      if (lane_busy[lane]) {
        ++lane;
        continue;
      }
      const bool idle = busy == 0;
      if (idle) hand_on();  // nothing may sit behind a wait
      const Stopwatch waited;
      std::optional<QueuedPlan> next = queue.Pop(/*wait=*/idle);
      if (!next) {
        if (idle) return;  // closed, and everything has run and been handed on
        break;
      }
      // The wait before the first plan is no bubble between steps.
      if (idle && on_wait && handed_on > 0) on_wait(waited.ElapsedSeconds());
      order.push_back({std::move(*next)});
      Running& r = order.back();
      if (r.queued.answer) {
        r.result = std::move(r.queued.answer);
        continue;  // the lane is still free
      }
      if (std::optional<StepResult> at_once = engine.Begin(lane, r.queued.plan)) {
        r.result = std::move(at_once);
        continue;
      }
      r.lane = lane;
      lane_busy[lane] = true;
      ++busy;
    }
    hand_on();
    // One stage of every busy lane, oldest plan first.
    for (Running& r : order) {
      if (r.lane < 0) continue;
      if (engine.Advance(r.lane)) {
        r.result = engine.Finish(r.lane);
        lane_busy[r.lane] = false;
        --busy;
        r.lane = -1;
      }
    }
    hand_on();
  }
}

}  // namespace strata
