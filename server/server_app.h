// The server process (scheduler + frontend) as a library: loads the model's config,
// tokenizer and chat template, and runs the scheduler, the control plane (where nodes
// register), the HTTP API and, when enabled, the gRPC API. main.cc only parses flags.
#ifndef STRATA_SERVER_SERVER_APP_H_
#define STRATA_SERVER_SERVER_APP_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/control/cluster_auth.h"
#include "common/transport/transport.h"
#include "server/api/grpc_api.h"
#include "server/api/openai_api.h"
#include "server/control_plane.h"
#include "server/http/http_server.h"
#include "server/scheduler.h"
#include "server/server_metrics.h"

namespace grpc {
class Server;
}

namespace strata {

struct ServerOptions {
  std::string model_dir;
  std::string served_model_name;  // default: the model directory's name
  std::string tool_call_parser;   // hermes, llama3 or mistral; empty: from the chat template
  int64_t max_model_len = 0;      // 0: the model's
  // The KV cache's element type, "bf16" or "f16", on every node: memory nodes are configured
  // with it, and compute nodes started with another are refused.
  std::string kv_cache_dtype = "bf16";
  std::string control_host = "127.0.0.1";
  int control_port = 50050;  // 0: any free port
  std::string grpc_host = "127.0.0.1";
  int grpc_port = -1;     // gRPC API; -1: off, 0: any free port
  std::string port_file;  // JSON {"http": .., "control": .., "grpc": ..} once listening
  int expected_compute_nodes = 1;
  int expected_memory_nodes = 0;
  absl::Duration heartbeat_timeout = absl::Seconds(3);
  absl::Duration step_timeout = absl::Seconds(60);
  absl::Duration disk_load_timeout = absl::Seconds(2);  // a batch of disk-tier loads
  absl::Duration drain_timeout = absl::Seconds(30);
  bool allow_mixed_isa = false;
  // Step plans and results go over each compute node's step channel on the data plane
  // (compute_node/step_channel.h) where the node offers one, with this transport; false:
  // over the RunSteps gRPC stream.
  bool data_plane_steps = true;
  transport::TransportConfig step_transport;
  std::string api_key;
  // The deployment's credentials, loaded after the model directory is checked (so that its
  // errors come first).
  ClusterAuthOptions cluster_auth;
  SchedulerConfig scheduler;
  http::HttpServerOptions http;
};

class ServerApp {
 public:
  static absl::StatusOr<std::unique_ptr<ServerApp>> Start(ServerOptions options);
  ~ServerApp();

  // Stops taking generation requests (/ready turns 503), waits up to drain_timeout for
  // streams in flight, then stops everything. With shutdown_nodes, asks the registered
  // nodes to exit too.
  void Shutdown(bool shutdown_nodes);

  int http_port() const { return http_->port(); }
  int control_port() const { return control_port_; }
  int grpc_port() const { return grpc_port_; }  // 0 when the gRPC API is off
  bool Ready() const { return control_->Ready(); }
  Scheduler& scheduler() { return *scheduler_; }

 private:
  ServerApp() = default;

  ServerOptions options_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ChatTemplate> chat_template_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<ServerMetrics> metrics_;
  std::unique_ptr<ControlPlane> control_;
  std::unique_ptr<grpc::Server> control_server_;
  std::unique_ptr<api::OpenAiApi> api_;
  std::unique_ptr<http::HttpServer> http_;
  std::unique_ptr<api::GrpcApi> grpc_api_;
  std::unique_ptr<grpc::Server> grpc_server_;
  int control_port_ = 0;
  int grpc_port_ = 0;
  bool shut_down_ = false;
};

}  // namespace strata

#endif  // STRATA_SERVER_SERVER_APP_H_
