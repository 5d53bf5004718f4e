#include "server/grpc_kv_mover.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/control/grpc_status.h"
#include "common/protocol/node_config_proto.h"
#include "common/protocol/step_proto.h"
#include "server/disk_ledger.h"

namespace strata {
namespace {

// A call that failed as a whole says nothing of any block, so each move gets a code that
// says "not moved": the call's own where it says so already (its deadline, a cancellation,
// an unreachable node, ...), else Aborted. Never one that could be taken for bad bytes on
// disk (INTERNAL, INVALID_ARGUMENT, ...), which would drop a loaded block.
absl::Status WholeCallFailure(absl::StatusCode code, const std::string& message) {
  const bool says_not_moved = !LoadCondemnsBlock(absl::Status(code, message));
  return absl::Status(
      says_not_moved ? code : absl::StatusCode::kAborted,
      absl::StrCat("KV moves failed as a whole (", absl::StatusCodeToString(code), "): ", message));
}

}  // namespace

GrpcKvMover::GrpcKvMover(Node node, std::shared_ptr<grpc::Channel> channel,
                         std::shared_ptr<const ClusterAuth> auth, uint64_t epoch, uint64_t tier,
                         absl::Duration load_deadline, absl::Duration deadline)
    : auth_(std::move(auth)), epoch_(epoch), tier_(tier) {
  loads_.deadline = load_deadline;
  loads_.from_submit = true;
  others_.deadline = deadline;
  if (node == Node::kMemory) {
    call_ = [stub = std::shared_ptr(control::MemoryNode::NewStub(channel))](
                grpc::ClientContext* context, const control::KvMoves& request,
                control::KvMoveReport* report) { return stub->MoveKv(context, request, report); };
  } else {
    call_ = [stub = std::shared_ptr(control::ComputeNode::NewStub(channel))](
                grpc::ClientContext* context, const control::KvMoves& request,
                control::KvMoveReport* report) { return stub->MoveKv(context, request, report); };
  }
  loads_.thread = std::thread([this] { Run(&loads_); });
  others_.thread = std::thread([this] { Run(&others_); });
}

GrpcKvMover::~GrpcKvMover() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    for (Lane* lane : {&loads_, &others_}) {
      if (lane->call != nullptr) lane->call->TryCancel();
    }
  }
  cv_.notify_all();
  loads_.thread.join();
  others_.thread.join();
}

void GrpcKvMover::Submit(std::vector<KvMove> moves, KvMovesDone done, bool background) {
  bool loads = !moves.empty() && !background;
  for (const KvMove& m : moves) loads = loads && m.kind == KvMove::Kind::kLoad;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stop_) {
      (loads ? loads_ : others_).queue.push_back({std::move(moves), std::move(done), absl::Now()});
      cv_.notify_all();
      return;
    }
  }
  done(std::vector<absl::Status>(moves.size(), absl::CancelledError("the mover is stopping")));
}

void GrpcKvMover::Run(Lane* lane) {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !lane->queue.empty(); });
    if (stop_) {
      // Never sent: failed, so that the scheduler unpins what they held.
      auto left = std::move(lane->queue);
      lock.unlock();
      for (Queued& q : left) {
        q.done(
            std::vector<absl::Status>(q.moves.size(), absl::CancelledError("the mover stopped")));
      }
      return;
    }
    auto [moves, done, submitted] = std::move(lane->queue.front());
    lane->queue.pop_front();
    const absl::Time deadline = (lane->from_submit ? submitted : absl::Now()) + lane->deadline;
    if (absl::Now() >= deadline) {
      // Its caller has given up already (a step waiting on these loads has abandoned them):
      // run now, they would be taken as loads it waited for.
      lock.unlock();
      done(std::vector<absl::Status>(
          moves.size(),
          absl::DeadlineExceededError("KV loads queued past their deadline; not sent")));
      lock.lock();
      continue;
    }
    control::KvMoves request;
    request.set_epoch(epoch_);
    request.set_tier(tier_);
    for (const KvMove& m : moves) *request.add_moves() = ToProto(m);
    grpc::ClientContext context;
    auth_->Attach(&context);
    context.set_deadline(absl::ToChronoTime(deadline));
    lane->call = &context;  // the destructor may cancel it from now on
    lock.unlock();
    control::KvMoveReport report;
    const grpc::Status status = call_(&context, request, &report);
    lock.lock();
    lane->call = nullptr;
    lock.unlock();
    std::vector<absl::Status> out;
    if (!status.ok()) {
      out.assign(moves.size(),
                 WholeCallFailure(FromGrpcStatus(status).code(), status.error_message()));
    } else if (report.status_size() != static_cast<int>(moves.size())) {
      out.assign(moves.size(),
                 WholeCallFailure(absl::StatusCode::kInternal,
                                  absl::StrCat("the node answered ", report.status_size(),
                                               " statuses for ", moves.size(), " KV moves")));
    } else {
      for (const control::Status& s : report.status()) out.push_back(FromProto(s));
    }
    done(std::move(out));
    lock.lock();
  }
}

}  // namespace strata
