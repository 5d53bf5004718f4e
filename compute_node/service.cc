#include "compute_node/service.h"

#include <atomic>
#include <thread>

#include "common/base/event_loop.h"
#include "common/base/logging.h"
#include "common/base/shutdown.h"
#include "common/base/stopwatch.h"
#include "common/base/thread_name.h"
#include "common/base/wait_policy.h"
#include "common/control/grpc_status.h"
#include "common/protocol/node_config_proto.h"
#include "common/protocol/step_proto.h"

namespace strata {

grpc::Status ComputeNodeService::Configure(grpc::ServerContext* context,
                                           const control::ComputeConfig* request,
                                           control::ComputeConfigAck* response) {
  if (grpc::Status auth = auth_->Check(context); !auth.ok()) return auth;
  auto ack = node_->Configure(FromProto(*request));
  if (!ack.ok()) return ToGrpcStatus(ack.status());
  *response = ToProto(*ack);
  return grpc::Status::OK;
}

grpc::Status ComputeNodeService::MoveKv(grpc::ServerContext* context,
                                        const control::KvMoves* request,
                                        control::KvMoveReport* response) {
  if (grpc::Status auth = auth_->Check(context); !auth.ok()) return auth;
  auto moves = MovesFromProto(*request);
  if (!moves.ok()) return ToGrpcStatus(moves.status());
  auto done = node_->MoveKv(request->epoch(), request->tier(), *moves,
                            absl::FromChrono(context->deadline()));
  if (!done.ok()) return ToGrpcStatus(done.status());
  for (const absl::Status& s : *done) ToProto(s, response->add_status());
  return grpc::Status::OK;
}

grpc::Status ComputeNodeService::RunSteps(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<control::StepResult, control::StepPlan>* stream) {
  if (grpc::Status auth = auth_->Check(context); !auth.ok()) return auth;
  // A reader thread queues plans as they come, so that the next plan is at hand (for a
  // second lane, or right after this step) while this thread runs steps. A writer loop
  // writes the results in the order they come: a synchronous gRPC write returns only once
  // the stream's poller has completed it, 0.2-0.3 ms later, which the step thread would
  // otherwise wait out before every step (docs/benchmarks.md, "The compute node writes its
  // results on a thread of their own").
  PlanQueue queue;
  std::atomic<bool> broken{false};  // a result could not be written: the stream is gone
  EventLoop writer("result-writer");
  writer.Start();
  auto write = [stream, &broken, &queue, &writer](StepResult result) {
    writer.Post([stream, &broken, &queue, result = std::move(result)] {
      if (broken.load()) return;
      control::StepResult out;
      ToProto(result, &out);
      if (!stream->Write(out)) {
        broken.store(true);
        queue.Abort();  // nobody reads results any more: do not start what is queued
      }
    });
  };
  node_->PrepareQueue(queue);
  std::thread reader([&] {
    SetCurrentThreadName("plan-reader");
    control::StepPlan wire;
    while (!broken.load() && !context->IsCancelled() && stream->Read(&wire)) {
      QueuedPlan queued;
      auto plan = FromProto(wire);
      if (!plan.ok()) {
        LOG(ERROR) << "rejected a malformed step plan: " << plan.status();
        StepResult refused;
        refused.step_id = wire.step_id();
        refused.status = plan.status();
        queued.answer = std::move(refused);
      } else {
        queued.plan = std::move(*plan);
      }
      queued.done = write;
      queue.Push(std::move(queued));
    }
    if (context->IsCancelled()) queue.Abort();
    queue.Close();
  });
  // The steps run on a thread of the stream's own, whose OpenMP team ends with the stream:
  // gRPC hands each stream to whichever of its threads is free, and a team left behind on
  // one of them would throttle the next stream's spin (common/base/wait_policy.h).
  OnOwnOpenMpThread(
      [&] {
        SetCurrentThreadName("step");  // its OpenMP team's threads take the name too
        node_->RunPipelined(queue, plan_wait_observer_);
      },
      threads_);
  writer.Stop();  // every result handed on is written (or the stream is gone)
  reader.join();
  return grpc::Status::OK;
}

grpc::Status ComputeNodeService::Health(grpc::ServerContext* context, const control::HealthRequest*,
                                        control::HealthResponse* response) {
  if (grpc::Status auth = auth_->Check(context); !auth.ok()) return auth;
  *response->mutable_node() = info_;
  *response->mutable_status() = ToProto(node_->Status());
  return grpc::Status::OK;
}

grpc::Status ComputeNodeService::Shutdown(grpc::ServerContext* context,
                                          const control::ShutdownRequest*,
                                          control::ShutdownResponse*) {
  if (grpc::Status auth = auth_->Check(context); !auth.ok()) return auth;
  LOG(INFO) << "shutdown requested by the scheduler";
  RequestShutdown();
  return grpc::Status::OK;
}

}  // namespace strata
