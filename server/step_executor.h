// A compute node as the scheduler sees it: something that runs step plans in the order it
// gets them, and reports each result asynchronously.
#ifndef STRATA_SERVER_STEP_EXECUTOR_H_
#define STRATA_SERVER_STEP_EXECUTOR_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "common/protocol/step.h"

namespace strata {

// Receives the result of a submitted plan; called on an executor thread.
using StepResultSink = std::function<void(StepResult)>;

// The result an executor gives a plan it could not run: step `step_id` failed with `error`,
// the node unreachable or not (StepResult::node_unreachable).
inline StepResult FailedStep(uint64_t step_id, absl::Status error, bool node_unreachable) {
  StepResult r;
  r.step_id = step_id;
  r.status = std::move(error);
  r.node_unreachable = node_unreachable;
  return r;
}

class StepExecutor {
 public:
  virtual ~StepExecutor() = default;
  virtual std::string name() const = 0;
  // Starts the plan, or queues it behind the ones already submitted (the scheduler holds at
  // most SchedulerConfig::max_plans_in_flight at once). Exactly one result comes back per
  // plan, in submission order, with `status` set if the node failed; a plan is never lost
  // silently. The plan is shared with the scheduler's in-flight record, which reads it when
  // the result comes back: neither side copies it, and neither may change it.
  virtual void Submit(std::shared_ptr<const StepPlan> plan, StepResultSink sink) = 0;
  // Whether the node can be reached now (a remote node: its connection is up, reconnecting
  // if need be). The scheduler stops counting a node whose steps failed as unreachable
  // until this turns true again. Thread-safe.
  virtual bool Reachable() { return true; }
  // The control plane declared the node dead (its heartbeats stopped): every plan it holds
  // fails now with `why`, the node unreachable, as if its connection had broken, rather
  // than at its step deadline. A hung node (SIGSTOP) keeps its connections open, so
  // nothing else ends those plans before then. Later plans connect again. Thread-safe.
  virtual void Abandon(const absl::Status& why) {}
};

}  // namespace strata

#endif  // STRATA_SERVER_STEP_EXECUTOR_H_
