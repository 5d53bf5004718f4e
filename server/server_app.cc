#include "server/server_app.h"

#include <grpcpp/grpcpp.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/model/model_config.h"

namespace strata {
namespace {

// Starts a gRPC server for one service on host:port (0: any free port); *bound gets the port.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartGrpcServer(
    const std::string& what, const std::string& host, int port, grpc::Service* service,
    std::shared_ptr<grpc::ServerCredentials> credentials, int* bound) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat(host, ":", port), std::move(credentials), bound);
  builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || *bound == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", what, " port ", host, ":", port));
  }
  return server;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ServerApp>> ServerApp::Start(ServerOptions options) {
  auto app = std::unique_ptr<ServerApp>(new ServerApp);
  ASSIGN_OR_RETURN(ModelConfig model, LoadModelConfig(options.model_dir));
  if (options.served_model_name.empty()) {
    options.served_model_name = std::filesystem::path(options.model_dir).filename().string();
    if (options.served_model_name.empty()) options.served_model_name = "strata";
  }
  if (std::filesystem::exists(options.model_dir + "/tokenizer.json")) {
    ASSIGN_OR_RETURN(app->tokenizer_, Tokenizer::Load(options.model_dir));
    auto chat = ChatTemplate::Create(app->tokenizer_->chat_template(), app->tokenizer_->bos_token(),
                                     app->tokenizer_->eos_token());
    if (!chat.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(options.model_dir, "/tokenizer_config.json: ", chat.status().message()));
    }
    app->chat_template_ = std::move(*chat);
    LOG(INFO) << "tokenizer: " << app->tokenizer_->vocab_size() << " tokens; chat template: "
              << (app->chat_template_->is_default() ? "strata's default (the model has none)"
                                                    : "the model's");
  } else {
    LOG(WARNING) << options.model_dir
                 << " has no tokenizer.json: prompts must be token ids, chat is off";
  }

  const int64_t max_model_len =
      options.max_model_len > 0 ? options.max_model_len : model.max_position_embeddings;
  SchedulerConfig& sc = options.scheduler;
  sc.max_model_len = max_model_len;
  sc.vocab_size = static_cast<int32_t>(model.vocab_size);
  sc.num_layers = static_cast<int>(model.num_layers);
  sc.rope_inv_freq = RopeInverseFrequencies(model);
  sc.eos_token_ids.assign(model.eos_token_ids.begin(), model.eos_token_ids.end());
  if (app->tokenizer_ && app->tokenizer_->eos_token_id() >= 0 &&
      std::find(sc.eos_token_ids.begin(), sc.eos_token_ids.end(),
                app->tokenizer_->eos_token_id()) == sc.eos_token_ids.end()) {
    sc.eos_token_ids.push_back(app->tokenizer_->eos_token_id());
  }
  sc.cache_salt = std::hash<std::string>()(options.model_dir);
  sc.epoch =
      std::random_device{}() | (static_cast<uint64_t>(absl::ToUnixSeconds(absl::Now())) << 32);
  RETURN_IF_ERROR(Scheduler::ValidateConfig(sc));
  // The secret is checked after the model directory and the flags, so their errors come first.
  ASSIGN_OR_RETURN(std::shared_ptr<const ClusterAuth> auth,
                   ClusterAuth::Load(options.cluster_auth));
  app->scheduler_ = std::make_unique<Scheduler>(sc, app->tokenizer_.get());
  app->scheduler_->Start();
  app->metrics_ = std::make_unique<ServerMetrics>(std::make_shared<metrics::MetricsRegistry>(),
                                                  options.served_model_name, app->scheduler_.get());
  app->scheduler_->SetObserver(app->metrics_->Observer());

  ControlPlaneOptions cp;
  cp.epoch = sc.epoch;
  cp.model.set_num_layers(model.num_layers);
  cp.model.set_num_heads(model.num_heads);
  cp.model.set_num_kv_heads(model.num_kv_heads);
  cp.model.set_head_dim(model.head_dim);
  cp.model.set_vocab_size(model.vocab_size);
  cp.model.set_kv_dtype(options.kv_cache_dtype);
  cp.model.set_max_position_embeddings(max_model_len);
  cp.model.set_name(options.served_model_name);
  cp.expected_compute_nodes = options.expected_compute_nodes;
  cp.expected_memory_nodes = options.expected_memory_nodes;
  cp.heartbeat_timeout = options.heartbeat_timeout;
  cp.step_deadline = options.step_timeout;
  cp.disk_load_deadline = options.disk_load_timeout;
  cp.allow_mixed_isa = options.allow_mixed_isa;
  cp.data_plane_steps = options.data_plane_steps;
  cp.step_transport = options.step_transport;
  cp.step_transport.auth_key = auth->data_plane_key();
  cp.auth = auth;
  if (sc.pipelining == Pipelining::kRotational) {
    if (options.expected_memory_nodes == 0) {
      return absl::InvalidArgumentError("rotational pipelining needs memory nodes");
    }
    cp.rotation =
        std::make_shared<RotationGroup>(sc.max_plans_in_flight, static_cast<int>(model.num_layers));
    cp.rotation_executor = app->scheduler_->AddExecutor(ForwardTo(cp.rotation), std::nullopt);
    app->scheduler_->SetExecutorAlive(cp.rotation_executor, false);  // until 2 replicas join
  }
  app->control_ = std::make_unique<ControlPlane>(app->scheduler_.get(), cp);
  ASSIGN_OR_RETURN(
      app->control_server_,
      StartGrpcServer("control", options.control_host, options.control_port, app->control_.get(),
                      auth->ServerCredentials(), &app->control_port_));

  api::ApiOptions api_options;
  api_options.served_model_name = options.served_model_name;
  api_options.model_path = options.model_dir;
  api_options.api_key = options.api_key;
  api_options.tool_call_parser = options.tool_call_parser;
  api_options.limits.max_model_len = max_model_len;
  api_options.limits.vocab_size = static_cast<int32_t>(model.vocab_size);
  api_options.limits.max_n = sc.max_n;
  api_options.limits.truncate_context = sc.context_overflow == ContextOverflow::kTruncate;
  ControlPlane* control = app->control_.get();
  const std::function<bool()> serving = [control] { return control->Serving(); };
  app->api_ = std::make_unique<api::OpenAiApi>(app->scheduler_.get(), app->tokenizer_.get(),
                                               app->chat_template_.get(), api_options, serving);
  api::OpenAiApi* api = app->api_.get();
  ServerMetrics* metrics = app->metrics_.get();
  api->SetMetricsText([metrics] { return metrics->Text(); });
  api->SetHealthDetail([control] { return control->Missing(); });
  api->SetRequestObserver([metrics](const std::string& route, int status, double seconds) {
    metrics->OnHttpRequest(route, status, seconds);
  });
  ASSIGN_OR_RETURN(app->http_,
                   http::HttpServer::Start(options.http, [api](const http::Request& r,
                                                               std::shared_ptr<http::Responder> w) {
                     api->Handle(r, std::move(w));
                   }));
  if (options.grpc_port >= 0) {
    app->grpc_api_ =
        std::make_unique<api::GrpcApi>(app->scheduler_.get(), app->tokenizer_.get(),
                                       app->chat_template_.get(), api_options, serving);
    ASSIGN_OR_RETURN(
        app->grpc_server_,
        StartGrpcServer("gRPC API", options.grpc_host, options.grpc_port, app->grpc_api_.get(),
                        grpc::InsecureServerCredentials(), &app->grpc_port_));
    LOG(INFO) << "gRPC API on " << options.grpc_host << ":" << app->grpc_port_;
  }
  LOG(INFO) << "serving " << options.served_model_name << " at http://" << options.http.host << ":"
            << app->http_->port() << " (control plane on port " << app->control_port_
            << ", waiting for " << options.expected_compute_nodes << " compute and "
            << options.expected_memory_nodes << " memory nodes)";
  if (!options.port_file.empty()) {
    const std::string tmp = options.port_file + ".tmp";
    std::ofstream(tmp) << "{\"http\": " << app->http_->port()
                       << ", \"control\": " << app->control_port_
                       << ", \"grpc\": " << app->grpc_port_ << "}\n";
    std::filesystem::rename(tmp, options.port_file);
  }
  app->options_ = std::move(options);
  return app;
}

void ServerApp::Shutdown(bool shutdown_nodes) {
  if (shut_down_) return;
  shut_down_ = true;
  // Start may have failed half-way (a bad model directory, a port in use): stop only what
  // was started.
  if (api_) api_->SetDraining(true);
  if (grpc_api_) grpc_api_->SetDraining(true);
  const absl::Time deadline = absl::Now() + options_.drain_timeout;
  while (api_ && scheduler_ && absl::Now() < deadline) {
    const SchedulerStats stats = scheduler_->Stats();
    const int64_t grpc_calls = grpc_api_ ? grpc_api_->active_calls() : 0;
    if (api_->active_streams() == 0 && grpc_calls == 0 && stats.num_running == 0 &&
        stats.num_waiting == 0) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  if (http_) http_->Stop();
  // Calls still open after the drain are cancelled before the scheduler stops.
  if (grpc_server_) grpc_server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  if (scheduler_) scheduler_->Stop();
  if (shutdown_nodes && control_) control_->ShutdownNodes();
  if (control_server_)
    control_server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  if (control_) control_->Stop();
}

ServerApp::~ServerApp() { Shutdown(false); }

}  // namespace strata
