#include "common/control/node_agent.h"

#include <grpcpp/grpcpp.h>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/logging.h"

namespace strata {
namespace {

constexpr absl::Duration kRpcDeadline = absl::Seconds(2);

}  // namespace

NodeAgent::NodeAgent(std::string scheduler_address, control::NodeInfo info,
                     std::function<control::NodeStatus()> status,
                     std::shared_ptr<const ClusterAuth> auth)
    : scheduler_address_(std::move(scheduler_address)),
      info_(std::move(info)),
      status_(std::move(status)),
      auth_(std::move(auth)) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  stub_ = control::Scheduler::NewStub(auth_->CreateChannel(scheduler_address_, args));
}

NodeAgent::~NodeAgent() { Stop(); }

void NodeAgent::Start() {
  thread_ = std::thread([this] { Run(); });
}

void NodeAgent::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool NodeAgent::WaitRegistered(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, absl::ToChronoMilliseconds(timeout), [&] {
    return registered_.load() || !fatal_error_.empty();
  }) && registered_.load();
}

std::string NodeAgent::fatal_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fatal_error_;
}

bool NodeAgent::Register() {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kRpcDeadline));
  auth_->Attach(&context);
  control::RegisterRequest request;
  *request.mutable_node() = info_;
  control::RegisterResponse response;
  const grpc::Status status = stub_->Register(&context, request, &response);
  if (!status.ok()) {
    if (status.error_code() == grpc::StatusCode::FAILED_PRECONDITION ||
        status.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
        status.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
      std::lock_guard<std::mutex> lock(mu_);
      fatal_error_ = status.error_message();
      LOG(ERROR) << "registration refused: " << status.error_message();
      cv_.notify_all();
    } else if (status.error_code() == grpc::StatusCode::ALREADY_EXISTS) {
      LOG_FIRST_N(WARNING, 3) << "registration deferred: " << status.error_message();
    } else {
      LOG_FIRST_N(WARNING, 3) << "scheduler at " << scheduler_address_
                              << " not reachable yet: " << status.error_message();
    }
    return false;
  }
  epoch_ = response.epoch();
  node_id_ = response.node_id();
  session_token_ = response.session_token();
  if (response.heartbeat_interval_ms() > 0) {
    interval_ = absl::Milliseconds(response.heartbeat_interval_ms());
  }
  LOG(INFO) << "registered with the scheduler as node " << response.node_id() << " (epoch "
            << response.epoch() << ")";
  registered_ = true;
  std::lock_guard<std::mutex> lock(mu_);
  cv_.notify_all();
  return true;
}

void NodeAgent::Run() {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (stop_ || !fatal_error_.empty()) return;
    }
    if (!registered_.load()) {
      if (!Register()) {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait_for(lock, absl::ToChronoNanoseconds(absl::Milliseconds(200)),
                     [&] { return stop_; });
        continue;
      }
    } else {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + kRpcDeadline));
      auth_->Attach(&context);
      control::HeartbeatRequest request;
      request.set_node_id(node_id_.load());
      request.set_epoch(epoch_.load());
      request.set_session_token(session_token_);
      *request.mutable_status() = status_();
      control::HeartbeatResponse response;
      const grpc::Status status = stub_->Heartbeat(&context, request, &response);
      if (status.ok() && !response.known()) {
        LOG(WARNING) << "the scheduler no longer knows this node; registering again";
        registered_ = false;
        continue;
      }
      LOG_IF(WARNING, !status.ok()) << "heartbeat failed: " << status.error_message();
    }
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, absl::ToChronoMilliseconds(interval_), [&] { return stop_; });
  }
}

}  // namespace strata
