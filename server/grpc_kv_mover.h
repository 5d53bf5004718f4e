// KvMover over a node's gRPC service (MoveKv): a memory node's, or a compute node's in
// co-located mode, whose own KV cache is the pool. Two lanes, one for loads (on a
// request's time to first token) and one for saves and drops (never on anyone's critical
// path), each a thread making one call at a time, so that a long run of saves never delays
// a load behind it.
//
// Thread-safety: Submit may be called from any thread; `done` runs on a lane's thread.
// Destruction fails what was never sent (Cancelled) and cancels the calls in progress (a
// node that hangs must not hold the scheduler's thread until the deadline).
#ifndef STRATA_SERVER_GRPC_KV_MOVER_H_
#define STRATA_SERVER_GRPC_KV_MOVER_H_

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "common/control/cluster_auth.h"
#include "proto/control.grpc.pb.h"
#include "server/kv_mover.h"

namespace strata {

class GrpcKvMover final : public KvMover {
 public:
  enum class Node { kMemory, kCompute };
  // Moves are stamped with `epoch` and `tier` (the node's configuration ack names the tier).
  // Loads must be done within `load_deadline` of their Submit, queueing behind other loads
  // included (past it they fail, and the node writes none of their slots: a slow disk
  // means "not cached"), other calls within `deadline` of their start.
  GrpcKvMover(Node node, std::shared_ptr<grpc::Channel> channel,
              std::shared_ptr<const ClusterAuth> auth, uint64_t epoch, uint64_t tier,
              absl::Duration load_deadline, absl::Duration deadline);
  ~GrpcKvMover() override;

  void Submit(std::vector<KvMove> moves, KvMovesDone done, bool background) override;

 private:
  struct Queued {
    std::vector<KvMove> moves;
    KvMovesDone done;
    absl::Time submitted;
  };
  struct Lane {
    absl::Duration deadline;
    // Loads: the deadline runs from Submit, as the scheduler's and the node's load gate
    // count it (a batch that waited it out in the queue fails unsent). Others: from the call.
    bool from_submit = false;
    std::deque<Queued> queue;
    grpc::ClientContext* call = nullptr;  // the call in progress, guarded by mu_
    std::thread thread;
  };
  void Run(Lane* lane);

  // The node's MoveKv.
  std::function<grpc::Status(grpc::ClientContext*, const control::KvMoves&, control::KvMoveReport*)>
      call_;
  std::shared_ptr<const ClusterAuth> auth_;
  uint64_t epoch_;
  uint64_t tier_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  Lane loads_, others_;
};

}  // namespace strata

#endif  // STRATA_SERVER_GRPC_KV_MOVER_H_
