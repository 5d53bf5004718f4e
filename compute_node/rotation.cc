#include "compute_node/rotation.h"

#include <algorithm>
#include <deque>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace strata {

void Wakeup::Notify() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_ = true;
  }
  cv_.notify_all();
}

void Wakeup::Wait(absl::Time deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  const absl::Duration left = deadline - absl::Now();
  if (!pending_ && left > absl::ZeroDuration()) {
    if (deadline == absl::InfiniteFuture()) {
      cv_.wait(lock, [&] { return pending_; });
    } else {
      cv_.wait_for(lock, absl::ToChronoNanoseconds(left), [&] { return pending_; });
    }
  }
  pending_ = false;
}

void RunRotation(StepEngine& engine, PlanQueue& queue, const RotationDriverOptions& options) {
  struct Running {
    QueuedPlan queued;
    int lane = -1;  // -1: answered without running
    std::optional<StepResult> result;
  };
  std::deque<Running> order;  // plans in the order they came
  std::vector<Running*> lane_run(engine.num_lanes(), nullptr);
  auto refuse = [](const StepPlan& plan, std::string why,
                   absl::StatusCode code = absl::StatusCode::kInvalidArgument) {
    StepResult r;
    r.step_id = plan.step_id;
    r.status = absl::Status(code, std::move(why));
    return r;
  };
  std::optional<QueuedPlan> carried;  // popped while checking for the end
  while (true) {
    if (options.stop != nullptr && options.stop->load()) {
      while (std::optional<QueuedPlan> next = queue.Pop(false)) {
        order.push_back({std::move(*next), -1, std::nullopt});
      }
      for (Running& run : order) {
        StepResult r;
        r.step_id = run.queued.plan.step_id;
        r.status = absl::CancelledError("the compute node is going away");
        if (run.queued.done) run.queued.done(run.result.has_value() ? std::move(*run.result) : r);
      }
      return;
    }
    // New plans start at once on their slot's lane.
    while (std::optional<QueuedPlan> next =
               carried.has_value() ? std::exchange(carried, std::nullopt) : queue.Pop(false)) {
      order.push_back({std::move(*next), -1, std::nullopt});
      Running& run = order.back();
      if (run.queued.answer.has_value()) {
        run.result = std::move(run.queued.answer);
        continue;
      }
      if (queue.aborted()) {
        StepResult r;
        r.step_id = run.queued.plan.step_id;
        r.status = absl::CancelledError("the plan stream closed before the plan ran");
        run.result = std::move(r);
        continue;
      }
      const StepPlan& plan = run.queued.plan;
      const int slot = plan.rotation.batch;
      if (!plan.rotation.active()) {
        run.result = refuse(plan,
                            "this compute node runs rotated plans only (--pipelining "
                            "rotational); the plan has no rotation");
        continue;
      }
      if (slot < 0 || slot >= engine.num_lanes()) {
        run.result = refuse(plan, absl::StrCat("batch slot ", slot, "; this node has ",
                                               engine.num_lanes(), " (--rotation_batches)"));
        continue;
      }
      if (lane_run[slot] != nullptr) {
        run.result = refuse(plan, absl::StrCat("batch slot ", slot, " still runs step ",
                                               lane_run[slot]->queued.plan.step_id));
        continue;
      }
      if (options.epoch != nullptr && plan.epoch != options.epoch->load()) {
        run.result = refuse(plan,
                            absl::StrCat("plan of epoch ", plan.epoch,
                                         " but the node is configured for ", options.epoch->load()),
                            absl::StatusCode::kFailedPrecondition);
        continue;
      }
      if (options.cached_epoch != nullptr && *options.cached_epoch != plan.epoch) {
        if (std::any_of(lane_run.begin(), lane_run.end(),
                        [](Running* r) { return r != nullptr; })) {
          run.result =
              refuse(plan, absl::StrCat("plans of epoch ", *options.cached_epoch, " still run"),
                     absl::StatusCode::kFailedPrecondition);
          continue;
        }
        engine.ForgetRequests();
        *options.cached_epoch = plan.epoch;
      }
      RotationRole role;
      role.batch = slot;
      role.replica = plan.rotation.replica;
      role.replicas = plan.rotation.replicas;
      role.exchange = options.exchange;
      role.handoff_timeout = options.handoff_timeout;
      if (std::optional<StepResult> done = engine.BeginRotated(slot, plan, role)) {
        run.result = std::move(done);
      } else {
        run.lane = slot;
        lane_run[slot] = &run;
      }
    }
    // Every lane whose next slice can run, oldest plan first.
    bool ran = false;
    for (Running& run : order) {
      if (run.result.has_value() || run.lane < 0 || !engine.RotationReady(run.lane)) continue;
      if (engine.AdvanceRotated(run.lane)) {
        run.result = engine.Finish(run.lane);
        lane_run[run.lane] = nullptr;
      }
      ran = true;
    }
    // Results in the order the plans came.
    while (!order.empty() && order.front().result.has_value()) {
      Running& front = order.front();
      if (options.on_result) options.on_result(*front.result);
      if (front.queued.done) front.queued.done(std::move(*front.result));
      order.pop_front();
    }
    if (order.empty() && queue.closed()) {
      carried = queue.Pop(/*wait=*/false);  // plans pushed just before the close still run
      if (!carried.has_value()) return;
      continue;
    }
    if (ran) continue;
    absl::Time deadline = absl::InfiniteFuture();
    for (size_t lane = 0; lane < lane_run.size(); ++lane) {
      if (lane_run[lane] != nullptr) {
        deadline = std::min(deadline, engine.RotationDeadline(static_cast<int>(lane)));
      }
    }
    options.wakeup->Wait(deadline);
  }
}

}  // namespace strata
