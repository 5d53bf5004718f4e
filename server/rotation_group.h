// Rotational pipelining (common/protocol/pipelining.h, compute_node/rotation.h) as the
// scheduler sees it: one executor over the compute replicas of the rotation, holding n
// batches in flight (the scheduler's max_plans_in_flight).
//
// Each plan takes a free batch slot j and goes to every live replica, each copy naming the
// receiver's place (StepPlan::rotation: the slot, its index, every replica's context
// address). Slice k of the plan's layers runs on replica (j + k) mod R, so the replica of
// slice L (the number of layers) samples; the others answer with no tokens. The group's
// result is that replica's, with every replica's failed sequences and dead memory nodes
// folded in (their tokens dropped), or the first error any replica reports. Results come
// back in submission order, as the StepExecutor contract says.
//
// Replicas come and go (the control plane adds them as they register and removes them when
// they die); a plan keeps the membership it was sent with. A replica whose step found it
// unreachable is left out of later plans at once, until it can be reached again, so that
// the steps between its death and its removal do not all fail. Fewer than two live replicas
// cannot rotate: a plan is then answered at once with Unavailable, and Reachable() is
// false until two are back.
//
// Thread-safety: thread-safe.
#ifndef STRATA_SERVER_ROTATION_GROUP_H_
#define STRATA_SERVER_ROTATION_GROUP_H_

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/protocol/node_config.h"
#include "server/step_executor.h"

namespace strata {

class RotationGroup : public StepExecutor {
 public:
  // `batches`: n, the batch slots; `num_layers`: L of the served model.
  RotationGroup(int batches, int num_layers);
  ~RotationGroup() override;

  std::string name() const override { return "rotation"; }
  void Submit(std::shared_ptr<const StepPlan> plan, StepResultSink sink) override;
  bool Reachable() override;

  // A replica (re)joins under `name` with its context-exchange address; one of the same
  // name is replaced. Plans go to it once it is active: a replica that joins while
  // requests run has not seen their set-ups, so the caller activates it once the scheduler
  // sends them again (Scheduler::ResendSetups).
  //
  // AddReplica and RemoveReplica return the executor that left the group (or null): it
  // fails the plans it still holds through this group's callbacks when it is destroyed,
  // and its destruction may wait (a step channel's connection attempt), so a caller that
  // holds a lock of its own lets it go after that lock (ControlPlane::ReleaseLater). A
  // Submit or Reachable in progress may still hold a copy; where the last copy goes, the
  // executor is handed to SetRetire's function.
  std::shared_ptr<StepExecutor> AddReplica(const std::string& name,
                                           const std::string& context_address,
                                           std::shared_ptr<StepExecutor> executor,
                                           bool active = true);
  // Active again, and reachable.
  void ActivateReplica(const std::string& name);
  // Called (outside the group's lock) for a replica that a step found unreachable and that
  // can be reached again: it missed plans, so it must rejoin as a new replica does (the
  // control plane resends the set-ups, then activates it). Without a handler it is used
  // again at once.
  void SetRejoinHandler(std::function<void(const std::string&)> handler);
  std::shared_ptr<StepExecutor> RemoveReplica(const std::string& name);
  // Replicas removed after plans were sent to them, with the last step each was sent (the
  // newest kMaxDepartures): the control plane tells the other replicas (ComputeConfig), so
  // that a lane waiting for a context from one that hung gives up then, not at its
  // hand-off deadline. A replica that joins again under its address leaves the list.
  static constexpr size_t kMaxDepartures = 16;
  std::vector<DepartedReplica> Departures() const;
  // Where a replica's executor is destroyed once nothing holds it any more (the group, the
  // caller it left to, or a Submit or Reachable in progress that copied it, on whichever
  // thread lets it go last): `retire` takes it, or gives it back if it cannot (it is then
  // destroyed there). It runs under a lock of its own, so it must only hand the executor
  // on (ControlPlane posts it to a thread of its own): never destroy it, call SetRetire,
  // let go of another of the group's executors, or throw (it runs in a deleter: an
  // exception ends the process). Without one, and once the group is being or has been
  // destroyed, executors are destroyed where their last copy goes. Null: none.
  using Retire = std::function<std::shared_ptr<StepExecutor>(std::shared_ptr<StepExecutor>)>;
  void SetRetire(Retire retire);
  // Active replicas.
  int live_replicas() const;

 private:
  struct Replica {
    std::string name;
    std::string address;
    std::shared_ptr<StepExecutor> executor;
    // A step found it unreachable: left out of plans until its executor is Reachable()
    // again (before the control plane has declared it dead).
    bool unreachable = false;
    bool active = true;
    uint64_t last_step = 0;  // the last plan sent to it (0: none)
  };
  struct Pending {
    std::shared_ptr<const StepPlan> plan;  // without the rotation
    StepResultSink sink;
    int slot = -1;
    size_t sampler = 0;  // index of the replica that samples
    std::vector<std::optional<StepResult>> results;
    size_t answered = 0;
    bool done = false;
    StepResult combined;
  };
  // SetRetire's function, shared with the deleters of the executors the group hands out
  // (a deleter may outlive the group; an executor that still holds plans must not, since
  // it answers them through the group's callbacks).
  struct RetireCell {
    std::mutex mu;
    Retire retire;  // guarded by mu
  };
  // `executor` as the group keeps it: its last copy hands it to the retire function.
  std::shared_ptr<StepExecutor> Retiring(std::shared_ptr<StepExecutor> executor) const;

  // Folds the answers of `p` into its result (mu_ held).
  void CombineLocked(Pending& p);
  // Drops the departure of the replica at `address`, if listed (mu_ held).
  void ForgetDepartureLocked(const std::string& address);
  // Hands on finished plans at the front, in submission order (takes mu_).
  void Deliver();

  const int batches_;
  const int num_layers_;
  mutable std::mutex mu_;
  std::map<std::string, Replica> replicas_;  // by name, so ordered alike for every plan
  std::vector<bool> slot_busy_;
  std::deque<std::shared_ptr<Pending>> pending_;
  std::deque<DepartedReplica> departures_;  // oldest first
  bool delivering_ = false;
  std::function<void(const std::string&)> rejoin_;
  const std::shared_ptr<RetireCell> retire_cell_ = std::make_shared<RetireCell>();
};

// An executor that forwards to a shared one (the scheduler owns executors; the control
// plane keeps the rotation group too).
std::unique_ptr<StepExecutor> ForwardTo(std::shared_ptr<StepExecutor> executor);

}  // namespace strata

#endif  // STRATA_SERVER_ROTATION_GROUP_H_
