#include "common/control/node_main.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/logging.h"
#include "common/base/shutdown.h"
#include "common/control/node_agent.h"
#include "common/control/version.h"
#include "common/transport/handshake.h"

namespace strata {

control::NodeInfo MakeNodeInfo(control::NodeRole role, const std::string& name,
                               const std::string& cpu_isa) {
  control::NodeInfo info;
  info.set_role(role);
  info.set_name(name);
  info.set_protocol_version(kProtocolVersion);
  info.set_data_plane_version(transport::kDataPlaneVersion);
  info.set_build_version(kBuildVersion);
  info.set_cpu_isa(cpu_isa);
  return info;
}

int ServeNode(NodeProcess node) {
  auto metrics_endpoint =
      metrics::MetricsEndpoint::StartIfEnabled(node.host, node.metrics_port, node.registry);
  if (!metrics_endpoint.ok()) {
    LOG(ERROR) << metrics_endpoint.status();
    return 1;
  }

  int port = 0;
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  if (node.max_message_bytes > 0) {
    builder.SetMaxReceiveMessageSize(node.max_message_bytes);
    builder.SetMaxSendMessageSize(node.max_message_bytes);
  }
  // The scheduler pings its step streams every 2 s (server/grpc_executor.cc) to find a dead
  // node fast. gRPC servers by default take pings on a connection with no data for 5 minutes
  // as abuse and close it after two ("too_many_pings"), which a step longer than a few
  // seconds (a long prefill on a slow node, a rotated replica waiting for its next slice)
  // would trigger: accept one a second.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddListeningPort(absl::StrCat(node.host, ":", node.port), node.auth->ServerCredentials(),
                           &port);
  builder.RegisterService(node.service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    LOG(ERROR) << "cannot listen on " << node.host << ":" << node.port;
    return 1;
  }
  node.info.set_control_address(absl::StrCat(node.host, ":", port));
  LOG(INFO) << (node.info.role() == control::ROLE_COMPUTE ? "compute" : "memory") << " node "
            << node.info.name() << " listening on " << node.info.control_address() << " (control)"
            << (node.info.data_address().empty()
                    ? std::string()
                    : absl::StrCat(" and ", node.info.data_address(),
                                   " (data: ", node.info.transport(), ")"))
            << ", " << node.info.cpu_isa() << " kernels" << node.description;

  std::unique_ptr<NodeAgent> agent;
  if (!node.scheduler.empty()) {
    agent = std::make_unique<NodeAgent>(node.scheduler, node.info, node.status, node.auth);
    agent->Start();
  }
  std::string fatal;
  while (!WaitForShutdownFor(absl::Milliseconds(200))) {
    if (auto* health = server->GetHealthCheckService()) {
      health->SetServingStatus("strata.ready", node.status().ready());
    }
    if (agent != nullptr && !(fatal = agent->fatal_error()).empty()) {
      LOG(ERROR) << "giving up: " << fatal;
      break;
    }
  }
  if (agent != nullptr) agent->Stop();
  server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  metrics_endpoint->reset();
  return fatal.empty() ? 0 : 1;
}

}  // namespace strata
