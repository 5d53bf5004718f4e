#include "compute_node/step_pipeline.h"

#include <algorithm>
#include <vector>

#include "absl/time/clock.h"
#include "common/base/stopwatch.h"

namespace strata {

void PlanQueue::Push(QueuedPlan plan) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    plan.arrived = absl::Now();
    plans_.push_back(std::move(plan));
  }
  cv_.notify_one();
  if (on_change_) on_change_();
}

void PlanQueue::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
  if (on_change_) on_change_();
}

std::optional<QueuedPlan> PlanQueue::Pop(bool wait) {
  std::unique_lock<std::mutex> lock(mu_);
  if (wait && !ReadyLocked() && poll_ && spin_ > absl::ZeroDuration()) {
    poller_ = std::this_thread::get_id();
    lock.unlock();
    // The transport's handlers, run here by the poll, push the plan (taking the lock).
    const bool ready = poll_(
        [this] {
          std::lock_guard<std::mutex> held(mu_);
          return ReadyLocked();
        },
        absl::Now() + spin_);
    lock.lock();
    poller_ = std::thread::id();
    if (ready) ++polled_;
  }
  if (wait) cv_.wait(lock, [&] { return ReadyLocked(); });
  if (plans_.empty()) return std::nullopt;
  QueuedPlan plan = std::move(plans_.front());
  plans_.pop_front();
  return plan;
}

void PlanQueue::Abort() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    aborted_ = true;
  }
  cv_.notify_all();
  if (on_change_) on_change_();
}

uint64_t PlanQueue::polled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return polled_;
}

bool PlanQueue::PollingOn(std::thread::id id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return poller_ == id;
}

bool PlanQueue::aborted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return aborted_;
}

bool PlanQueue::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

namespace {

// Whether a plan reads a token that another plan in flight may still be sampling.
bool NamesLastSampledToken(const StepPlan& plan) {
  for (const SequenceChunk& c : plan.chunks) {
    for (int32_t t : c.tokens) {
      if (t == kLastSampledToken) return true;
    }
  }
  return false;
}

}  // namespace

void RunPipeline(LaneEngine& engine, PlanQueue& queue, const PlanWaitObserver& on_wait) {
  struct Running {
    QueuedPlan queued;
    std::optional<StepResult> result;
    std::optional<int64_t> slack_us;  // started idle: StepTiming::plan_slack_us
  };
  // Plans in the order they came; references stay valid as the deque grows at the back and
  // shrinks at the front (a running plan is never at the front with a result).
  std::deque<Running> order;
  constexpr int kMaxLanes = 2;
  std::vector<Running*> lane_run(kMaxLanes, nullptr);  // the plan each lane runs
  auto busy = [&] { return std::count(lane_run.begin(), lane_run.end(), nullptr) < kMaxLanes; };
  uint64_t handed_on = 0;
  std::optional<QueuedPlan> held;  // a plan that must not overlap, waiting for idle lanes
  // When the last busy lane finished, until a plan starts: the node is free and waits.
  std::optional<absl::Time> free_since;
  auto hand_on = [&] {
    while (!order.empty() && order.front().result) {
      Running& r = order.front();
      if (r.slack_us) r.result->timing.plan_slack_us = r.slack_us;
      r.queued.done(std::move(*r.result));
      ++handed_on;
      order.pop_front();
    }
  };
  // Starts queued plans on free lanes; waits for one only when `may_wait` and nothing runs.
  // Returns false once the queue is closed and drained and nothing runs.
  auto fill = [&](bool may_wait) {
    while (true) {
      // With nothing running lane 0 is free, and the engine is not asked anything: a queue
      // closed while idle ends the pipeline without touching it. Otherwise the lane count is
      // read each time: a node learns its mode when it is configured.
      int lane = 0;
      if (busy()) {
        const int lanes = std::min(kMaxLanes, engine.num_lanes());
        while (lane < lanes && lane_run[lane] != nullptr) ++lane;
        if (lane == lanes) return true;
      }
      const bool idle = !busy();
      std::optional<QueuedPlan> next;
      if (held) {
        if (!idle) return true;
        next = std::move(held);
        held.reset();
      } else {
        if (idle) hand_on();  // nothing may sit behind a wait
        const Stopwatch waited;
        next = queue.Pop(/*wait=*/may_wait && idle);
        if (!next) return !(idle && queue.closed());
        // The wait before the first plan is no bubble between steps.
        if (may_wait && idle && on_wait && handed_on > 0) on_wait(waited.ElapsedSeconds());
      }
      if (!idle && !next->answer && NamesLastSampledToken(next->plan)) {
        held = std::move(next);
        return true;
      }
      order.push_back({std::move(*next)});
      Running& r = order.back();
      if (idle && free_since) {
        const absl::Time now = absl::Now();
        r.slack_us = absl::ToInt64Microseconds(
            r.queued.arrived <= *free_since ? *free_since - r.queued.arrived : *free_since - now);
        free_since.reset();
      }
      if (r.queued.answer) {
        r.result = std::move(r.queued.answer);
      } else if (queue.aborted()) {
        StepResult cancelled;
        cancelled.step_id = r.queued.plan.step_id;
        cancelled.status = absl::CancelledError("the scheduler's stream closed");
        r.result = std::move(cancelled);
      } else if (std::optional<StepResult> at_once = engine.Begin(lane, r.queued.plan)) {
        r.result = std::move(at_once);
      } else {
        lane_run[lane] = &r;
      }
      if (r.result && !busy()) free_since = absl::Now();  // done at once: still free
    }
  };
  while (true) {
    if (!fill(/*may_wait=*/true)) {
      hand_on();
      return;
    }
    hand_on();
    if (!busy()) continue;
    // One stage of every busy lane, oldest plan first. A lane that finishes hands its result
    // on and takes the next plan before the next lane's stage.
    std::vector<int> turn;
    for (const Running& r : order) {
      for (int lane = 0; lane < kMaxLanes; ++lane) {
        if (lane_run[lane] == &r) turn.push_back(lane);
      }
    }
    for (int lane : turn) {
      Running* r = lane_run[lane];
      if (r == nullptr || !engine.Advance(lane)) continue;
      r->result = engine.Finish(lane);
      lane_run[lane] = nullptr;
      if (!busy()) free_since = absl::Now();
      hand_on();
      fill(/*may_wait=*/false);
    }
  }
}

}  // namespace strata
