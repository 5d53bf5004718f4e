// Rotational staggered pipelining (Lamina §5.1.1) on one compute replica.
//
// n batches rotate over R = n - 1 replicas that all hold the full weights and share the
// memory nodes. Slice k of a plan's layers (the work between two attentions: k = 0 embeds
// and projects layer 0, 0 < k < L ends layer k-1 and projects layer k, k = L ends the last
// layer and samples) runs on replica (batch + k) mod R. So while a batch's attention is on
// the memory nodes, its context moves to the replica of its next slice
// (context_exchange.h) and the memory nodes answer that replica directly
// (remote_attention.h); no replica waits for its own batch's attention.
//
// The scheduler sends every plan to every replica of its rotation (server/rotation_group.h),
// each copy naming the receiver's place. RunRotation takes them from the queue, one lane per
// batch slot, and runs whichever lane's next slice has its inputs (the context and the
// attention answers), oldest plan first; it never blocks on one lane while another could
// run, so replicas waiting on each other cannot deadlock. A slice whose inputs miss their
// deadline fails its batch with an error that names the replica that did not hand over;
// the other batches go on. Results go back in the order the plans came; the replica of
// slice L returns the sampled tokens, the others a result with none.
//
// Thread-safety: Wakeup is thread-safe; RunRotation runs on one thread.
#ifndef STRATA_COMPUTE_NODE_ROTATION_H_
#define STRATA_COMPUTE_NODE_ROTATION_H_

#include <atomic>
#include <condition_variable>
#include <mutex>

#include "absl/time/time.h"
#include "compute_node/context_exchange.h"
#include "compute_node/step_engine.h"
#include "compute_node/step_pipeline.h"

namespace strata {

// What the rotation driver sleeps on: the plan queue, the context exchange and the lanes'
// attention all notify it.
class Wakeup {
 public:
  void Notify();
  // Returns once Notify has been called since the previous Wait returned, or at `deadline`.
  void Wait(absl::Time deadline);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool pending_ = false;
};

// The deadline on a slice's context, given the memory nodes' per-layer deadline: twice it.
// The replica before may itself wait one layer deadline for a hung memory node, whose rows
// it then fails alone and hands the context on (StepEngine::AdvanceRotated); a deadline of
// one layer would expire meanwhile and fail the whole step.
inline absl::Duration HandoffTimeout(absl::Duration layer_timeout) { return 2 * layer_timeout; }

struct RotationDriverOptions {
  ContextExchange* exchange = nullptr;
  Wakeup* wakeup = nullptr;
  absl::Duration handoff_timeout = absl::Seconds(10);
  // Set (then Notify the wakeup): the node is going away now. Plans not finished are
  // answered Cancelled without running further, and RunRotation returns.
  const std::atomic<bool>* stop = nullptr;
  // Called with every result before it is handed on (metrics); may be empty.
  std::function<void(const StepResult&)> on_result;
  // The epoch the node is configured for (null: not checked). A plan of another epoch is
  // refused (FailedPrecondition), as the node's other paths refuse it; the first plan of an
  // epoch other than the engine's cached requests' drops them (another scheduler's
  // sequences, whose ids the new one reuses), once no lane runs.
  const std::atomic<uint64_t>* epoch = nullptr;
  uint64_t* cached_epoch = nullptr;  // the epoch of the engine's cached requests
};

// Runs plans from `queue` until it is closed and drained. The engine has one lane per batch
// slot. A plan without a rotation, or whose slot has no lane or a lane still busy, is
// answered with an error without running.
void RunRotation(StepEngine& engine, PlanQueue& queue, const RotationDriverOptions& options);

}  // namespace strata

#endif  // STRATA_COMPUTE_NODE_ROTATION_H_
