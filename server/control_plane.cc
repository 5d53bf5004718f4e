#include "server/control_plane.h"

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/control/version.h"
#include "server/grpc_executor.h"

namespace strata {
namespace {

grpc::Status Refuse(const std::string& why) {
  LOG(ERROR) << "refused a node: " << why;
  return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, why);
}

}  // namespace

ControlPlane::ControlPlane(Scheduler* scheduler, ControlPlaneOptions options)
    : scheduler_(scheduler), options_(std::move(options)) {
  worker_ = std::thread([this] { Work(); });
  monitor_ = std::thread([this] { Monitor(); });
}

ControlPlane::~ControlPlane() { Stop(); }

void ControlPlane::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
  monitor_.join();
}

grpc::Status ControlPlane::Register(grpc::ServerContext*, const control::RegisterRequest* request,
                                    control::RegisterResponse* response) {
  const control::NodeInfo& info = request->node();
  if (info.protocol_version() != kProtocolVersion) {
    return Refuse(absl::StrCat("node ", info.name(), " speaks protocol version ",
                               info.protocol_version(), "; this scheduler speaks ",
                               kProtocolVersion, " (", kBuildVersion, ")"));
  }
  if (info.role() != control::ROLE_COMPUTE && info.role() != control::ROLE_MEMORY) {
    return Refuse(absl::StrCat("node ", info.name(), " has no role"));
  }
  if (info.role() == control::ROLE_MEMORY && options_.expected_memory_nodes == 0) {
    return Refuse(absl::StrCat("memory node ", info.name(),
                               " registered, but this scheduler runs attention co-located "
                               "(--memory_nodes=0)"));
  }
  if (info.role() == control::ROLE_COMPUTE) {
    const control::ModelShape& m = info.model();
    const control::ModelShape& want = options_.model;
    if (m.num_layers() != want.num_layers() || m.num_heads() != want.num_heads() ||
        m.num_kv_heads() != want.num_kv_heads() || m.head_dim() != want.head_dim() ||
        m.vocab_size() != want.vocab_size()) {
      return Refuse(absl::StrCat("compute node ", info.name(), " loaded a different model (",
                                 m.num_layers(), " layers, ", m.num_heads(), " heads, vocabulary ",
                                 m.vocab_size(), ") than the scheduler serves (", want.num_layers(),
                                 " layers, ", want.num_heads(), " heads, vocabulary ",
                                 want.vocab_size(), ")"));
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (isa_.empty()) {
    isa_ = info.cpu_isa();
  } else if (info.cpu_isa() != isa_ && !options_.allow_mixed_isa) {
    return Refuse(absl::StrCat("node ", info.name(), " runs ", info.cpu_isa(),
                               " kernels but the deployment runs ", isa_,
                               "; mixed kernel paths break bit-identical results "
                               "(set --allow_mixed_isa to accept)"));
  }
  // A node that comes back under the same name replaces its dead record.
  for (auto it = nodes_.begin(); it != nodes_.end(); ++it) {
    if (it->second.view.info.name() == info.name()) {
      if (it->second.view.alive) MarkDead(it->second, "registered again");
      nodes_.erase(it);
      break;
    }
  }
  Node node;
  node.view.id = next_id_++;
  node.view.info = info;
  node.view.alive = true;
  node.view.last_seen = absl::Now();
  const uint64_t id = node.view.id;
  nodes_.emplace(id, std::move(node));
  to_configure_.push_back(id);
  cv_.notify_all();
  response->set_node_id(id);
  response->set_epoch(options_.epoch);
  response->set_heartbeat_interval_ms(absl::ToInt64Milliseconds(options_.heartbeat_interval));
  LOG(INFO) << "registered " << (info.role() == control::ROLE_COMPUTE ? "compute" : "memory")
            << " node " << info.name() << " at " << info.control_address();
  return grpc::Status::OK;
}

grpc::Status ControlPlane::Heartbeat(grpc::ServerContext*, const control::HeartbeatRequest* request,
                                     control::HeartbeatResponse* response) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = nodes_.find(request->node_id());
  const bool known =
      it != nodes_.end() && it->second.view.alive && request->epoch() == options_.epoch;
  response->set_known(known);
  if (known) {
    it->second.view.last_seen = absl::Now();
    it->second.view.status = request->status();
  }
  return grpc::Status::OK;
}

void ControlPlane::MarkDead(Node& node, const std::string& why) {
  if (!node.view.alive) return;
  node.view.alive = false;
  LOG(WARNING) << "node " << node.view.info.name() << " is dead: " << why;
  if (node.executor >= 0) scheduler_->SetExecutorAlive(node.executor, false);
  if (node.pool >= 0) scheduler_->SetPoolAlive(node.pool, false);
}

void ControlPlane::Monitor() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::milliseconds(100));
    const absl::Time now = absl::Now();
    bool memory_changed = false;
    for (auto& [id, node] : nodes_) {
      if (node.view.alive && now - node.view.last_seen > options_.heartbeat_timeout) {
        MarkDead(node, absl::StrCat("no heartbeat for ",
                                    absl::FormatDuration(now - node.view.last_seen)));
        memory_changed |= node.view.info.role() == control::ROLE_MEMORY;
      }
    }
    if (memory_changed) {
      lock.unlock();
      ReconfigureComputeNodes();
      lock.lock();
    }
  }
}

void ControlPlane::Work() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !to_configure_.empty(); });
    if (stop_) return;
    const uint64_t id = to_configure_.front();
    to_configure_.pop_front();
    auto it = nodes_.find(id);
    if (it == nodes_.end() || !it->second.view.alive) continue;
    const bool compute = it->second.view.info.role() == control::ROLE_COMPUTE;
    lock.unlock();
    if (compute) {
      ConfigureCompute(id);
    } else {
      ConfigureMemory(id);
    }
    lock.lock();
  }
}

void ControlPlane::ConfigureCompute(uint64_t id) {
  control::NodeInfo info;
  control::ComputeConfig config;
  {
    std::lock_guard<std::mutex> lock(mu_);
    info = nodes_.at(id).view.info;
    config.set_epoch(options_.epoch);
    for (const auto& [other_id, other] : nodes_) {
      if (other.view.info.role() == control::ROLE_MEMORY && other.view.alive && other.pool >= 0) {
        auto* m = config.add_memory_nodes();
        m->set_pool_index(other.pool);
        m->set_name(other.view.info.name());
        m->set_data_address(other.view.info.data_address());
      }
    }
  }
  auto executor =
      std::make_unique<GrpcExecutor>(info.name(), info.control_address(), options_.step_deadline);
  auto stub = control::ComputeNode::NewStub(executor->channel());
  grpc::ClientContext context;
  // Allocating and touching a large local KV cache takes a while.
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  control::ComputeConfigAck ack;
  const grpc::Status status = stub->Configure(&context, config, &ack);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = nodes_.find(id);
  if (it == nodes_.end()) return;
  Node& node = it->second;
  if (!status.ok()) {
    MarkDead(node, "configuration failed: " + status.error_message());
    return;
  }
  node.channel = executor->channel();
  std::optional<PoolIndex> local_pool;
  if (options_.expected_memory_nodes == 0) {
    node.pool = static_cast<int>(
        scheduler_->AddPool(info.name(), static_cast<int64_t>(ack.local_kv_slots())));
    local_pool = static_cast<PoolIndex>(node.pool);
  }
  node.executor = scheduler_->AddExecutor(std::move(executor), local_pool);
  node.view.configured = true;
  LOG(INFO) << "compute node " << info.name() << " is ready"
            << (local_pool ? absl::StrCat(" (co-located, ", ack.local_kv_slots(), " KV slots)")
                           : "");
}

void ControlPlane::ConfigureMemory(uint64_t id) {
  // Memory nodes are configured by the disaggregated control path (memory_node/).
  std::lock_guard<std::mutex> lock(mu_);
  auto it = nodes_.find(id);
  if (it != nodes_.end()) MarkDead(it->second, "memory nodes are not supported by this build");
}

void ControlPlane::ReconfigureComputeNodes() {}

bool ControlPlane::Ready() const {
  std::lock_guard<std::mutex> lock(mu_);
  int compute = 0, memory = 0;
  for (const auto& [id, node] : nodes_) {
    if (!node.view.alive || !node.view.configured) continue;
    if (node.view.info.role() == control::ROLE_COMPUTE) ++compute;
    if (node.view.info.role() == control::ROLE_MEMORY) ++memory;
  }
  return compute >= options_.expected_compute_nodes && memory >= options_.expected_memory_nodes &&
         scheduler_->HasCapacity();
}

std::vector<NodeView> ControlPlane::Nodes() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<NodeView> out;
  for (const auto& [id, node] : nodes_) out.push_back(node.view);
  return out;
}

void ControlPlane::ShutdownNodes() {
  std::vector<std::pair<std::string, std::shared_ptr<grpc::Channel>>> targets;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, node] : nodes_) {
      if (node.view.alive && node.channel)
        targets.emplace_back(node.view.info.name(), node.channel);
    }
  }
  for (const auto& [name, channel] : targets) {
    auto stub = control::ComputeNode::NewStub(channel);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    control::ShutdownResponse response;
    stub->Shutdown(&context, control::ShutdownRequest(), &response);
  }
}

}  // namespace strata
