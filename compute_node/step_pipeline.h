// Runs step plans on a LaneEngine with two batches in flight: the "two" pipelining of the
// attention-offloading design (Lamina's n = 2).
//
// Plans arrive in a PlanQueue from another thread (the step channel's transport thread, the
// gRPC stream's reader, or a test's executor). RunPipeline takes them on one thread: a plan starts
// on a free lane as soon as it is queued, and the busy lanes advance one stage each in turn, oldest
// plan first, so that while one batch's attention is out on the memory nodes the node runs the
// other batch's projections and FFN. A lane that finishes samples, hands its result on and takes
// the next queued plan at once; with one plan queued the other lane simply idles.
//
// A plan started with every lane idle, after an earlier plan, reports its slack in its
// result (StepTiming::plan_slack_us): how long it was queued before the lanes went idle, or
// how long they stayed idle before it came. The scheduler times its plans ahead by it.
//
// Results are handed on in the order the plans were queued, whatever lane finished first
// (the scheduler matches them in submission order), as soon as they can be: a lane that
// finishes hands its result on and takes the next plan before the other lane's next stage.
// A plan that names a token another plan samples (kLastSampledToken, asynchronous
// scheduling) never overlaps: it starts once the other lanes are idle.
//
// Thread-safety: PlanQueue is thread-safe; RunPipeline runs on one thread.
#ifndef STRATA_COMPUTE_NODE_STEP_PIPELINE_H_
#define STRATA_COMPUTE_NODE_STEP_PIPELINE_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/functional/function_ref.h"
#include "absl/time/time.h"
#include "common/protocol/step.h"
#include "compute_node/step_engine.h"

namespace strata {

// A plan to run, or (`answer` set) the answer to a plan that could not even be read, which
// still takes its turn in the order of results. `done` receives the result. `arrived` is
// set by PlanQueue::Push.
struct QueuedPlan {
  StepPlan plan;
  std::optional<StepResult> answer;
  std::function<void(StepResult)> done;
  absl::Time arrived = absl::InfinitePast();
};

class PlanQueue {
 public:
  void Push(QueuedPlan plan);
  // No more plans: RunPipeline returns once those queued have run.
  void Close();
  // No more plans, and nobody waits for results (the stream broke): plans still queued are
  // answered Cancelled without running; plans already running finish.
  void Abort();
  bool aborted() const;
  // The oldest queued plan. With `wait`, blocks until there is one or the queue is closed
  // (then returns nullopt); without, returns nullopt when none is queued.
  std::optional<QueuedPlan> Pop(bool wait);
  bool closed() const;
  // Called after every Push, Close and Abort (outside the queue's lock), for a driver that
  // waits on more than the queue (rotation.h). Set before plans arrive.
  void SetOnChange(std::function<void()> on_change) { on_change_ = std::move(on_change); }

  // Where plans come off a transport that the waiting thread may progress itself (the step
  // channel, Transport::ProgressUntil): Pop(wait=true) with nothing queued first calls
  // `poll` with a test for a queued plan and a deadline `spin` away, and sleeps only if
  // that returns without one. A plan already on its way is then taken by the step thread
  // as it arrives, instead of when the transport thread, woken for it, gets a core (on
  // shared cores the step's team holds them, and a service thread waits for one:
  // common/base/wait_policy.h). Set before plans arrive; a zero spin turns it off.
  using Poll = std::function<bool(absl::FunctionRef<bool()> ready, absl::Time deadline)>;
  void SetPoll(Poll poll, absl::Duration spin) {
    poll_ = std::move(poll);
    spin_ = spin;
  }
  // Waits in Pop that ended during the poll, with a plan queued (by whichever thread) or the
  // queue closed, without sleeping.
  uint64_t polled() const;
  // Whether thread `id` is inside Pop's poll of this queue now: a Push on that thread is a
  // plan the waiting thread received itself (StepChannelStats::polled).
  bool PollingOn(std::thread::id id) const;

 private:
  bool ReadyLocked() const { return closed_ || !plans_.empty(); }

  std::function<void()> on_change_;
  Poll poll_;
  absl::Duration spin_ = absl::ZeroDuration();
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<QueuedPlan> plans_;
  bool closed_ = false;
  bool aborted_ = false;
  uint64_t polled_ = 0;
  std::thread::id poller_;  // the thread in Pop's poll; none outside it
};

// Seconds the pipeline waited with every lane idle before a plan came (the node's bubble
// between steps); may be empty.
using PlanWaitObserver = std::function<void(double seconds)>;

// Runs plans from `queue` on `engine`'s lanes until the queue is closed and drained. While
// no plan runs it does not touch `engine`, so an idle pipeline may outlive it until the
// queue is closed.
void RunPipeline(LaneEngine& engine, PlanQueue& queue, const PlanWaitObserver& on_wait = {});

}  // namespace strata

#endif  // STRATA_COMPUTE_NODE_STEP_PIPELINE_H_
