#include "server/control_plane.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/crypto.h"
#include "common/base/logging.h"
#include "common/base/thread_name.h"
#include "common/control/grpc_status.h"
#include "common/control/version.h"
#include "common/model/kv_dtype.h"
#include "common/transport/handshake.h"
#include "server/data_plane_executor.h"
#include "server/grpc_executor.h"
#include "server/grpc_kv_mover.h"
#include "server/kernel_agreement.h"

namespace strata {
namespace {

// Whether the rotation has the two live replicas it needs (asked on the scheduler thread,
// when the change is applied).
std::function<bool()> RotationAlive(std::weak_ptr<RotationGroup> weak) {
  return [weak] {
    auto group = weak.lock();
    return group != nullptr && group->live_replicas() >= 2;
  };
}

// A replica that has not seen the running requests' set-ups (it joined, or it was out of
// reach) takes plans once the scheduler has marked them to be sent again.
void ActivateAfterSetups(Scheduler* scheduler, int index, std::weak_ptr<RotationGroup> weak,
                         const std::string& name) {
  scheduler->ResendSetups(index, [scheduler, index, weak, name] {
    auto group = weak.lock();
    if (group == nullptr) return;
    group->ActivateReplica(name);
    scheduler->RefreshExecutorAlive(index, RotationAlive(weak));
  });
}

// A Configure call's error that asking again would get again (the node cannot take the
// configuration), as opposed to one of reaching it (unavailable, a deadline, cancelled).
bool Refusal(grpc::StatusCode code) {
  return code == grpc::StatusCode::FAILED_PRECONDITION ||
         code == grpc::StatusCode::INVALID_ARGUMENT || code == grpc::StatusCode::UNIMPLEMENTED ||
         code == grpc::StatusCode::PERMISSION_DENIED || code == grpc::StatusCode::UNAUTHENTICATED;
}

grpc::Status Refuse(const std::string& why) {
  LOG(ERROR) << "refused a node: " << why;
  return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, why);
}

// A pool's disk tier as its node acknowledged it (control::MemoryConfigAck or
// ComputeConfigAck), opened empty: the scheduler's index of it starts empty too. Returns
// what the log says of it ("" without one).
template <typename Ack>
std::string AttachDiskTier(Scheduler* scheduler, PoolIndex pool, GrpcKvMover::Node node,
                           std::shared_ptr<grpc::Channel> channel,
                           const ControlPlaneOptions& options, const Ack& ack) {
  if (ack.disk_extents() == 0) return "";
  scheduler->SetPoolDisk(pool, static_cast<int64_t>(ack.disk_extents()),
                         std::make_shared<GrpcKvMover>(
                             node, std::move(channel), options.auth, options.epoch, ack.disk_tier(),
                             options.disk_load_deadline, options.step_deadline));
  return absl::StrCat(", disk tier of ", ack.disk_extents(), " blocks of ", ack.disk_block_bytes(),
                      " bytes", ack.disk_direct() ? "" : " (buffered)");
}

}  // namespace

ControlPlane::ControlPlane(Scheduler* scheduler, ControlPlaneOptions options)
    : scheduler_(scheduler), options_(std::move(options)) {
  CHECK(options_.auth != nullptr) << "the control plane needs credentials";
  scheduler_->SetPoolDeathHandler([this](PoolIndex pool) { OnPoolDeath(pool); });
  if (options_.rotation != nullptr) {
    // A replica that missed plans while unreachable rejoins as a new one does.
    std::weak_ptr<RotationGroup> weak = options_.rotation;
    Scheduler* scheduler = scheduler_;
    const int index = options_.rotation_executor;
    options_.rotation->SetRejoinHandler([weak, scheduler, index](const std::string& name) {
      ActivateAfterSetups(scheduler, index, weak, name);
    });
    // A replica's executor is destroyed on release_loop_ wherever its last copy goes.
    options_.rotation->SetRetire(
        [this](std::shared_ptr<StepExecutor> executor) -> std::shared_ptr<StepExecutor> {
          auto held = std::make_shared<std::shared_ptr<StepExecutor>>(std::move(executor));
          if (release_loop_.Post([held] { held->reset(); })) return nullptr;
          return std::move(*held);  // the loop has stopped: the caller destroys it
        });
  }
  broadcast_loop_.Start();
  monitor_loop_.Start();
  release_loop_.Start();
}

void ControlPlane::OnPoolDeath(PoolIndex pool) {
  bool changed = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, node] : nodes_) {
      if (node.view.info.role() == control::ROLE_MEMORY && node.pool == pool && node.view.alive) {
        // The node may still answer heartbeats (a hang that passed); it must register again
        // and come back empty.
        changed |= MarkDead(node, "a compute node found it dead or hung during a step");
      }
    }
  }
  if (changed) RequestReconfigure();
}

void ControlPlane::RequestReconfigure() {
  if (reconfigure_pending_.exchange(true)) return;  // one is queued and sends the newest list
  broadcast_loop_.Post([this] {
    reconfigure_pending_.store(false);
    ReconfigureComputeNodes();
  });
}

ControlPlane::~ControlPlane() { Stop(); }

void ControlPlane::Stop() {
  std::list<Configuration> configurations;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    stop_ = true;
    for (auto& [id, node] : nodes_) {
      if (node.configuring != nullptr) node.configuring->TryCancel();
    }
    configurations = std::move(configurations_);
  }
  cv_.notify_all();
  // Calls in progress were cancelled, and none starts after stop_.
  for (Configuration& c : configurations) c.thread.join();
  monitor_loop_.Stop();
  broadcast_loop_.Stop();
  // No executor is handed to this plane after this (it waits for a hand-over in progress).
  if (options_.rotation != nullptr) options_.rotation->SetRetire(nullptr);
  release_loop_.Stop();  // after the configurations, which may hand it executors
}

grpc::Status ControlPlane::Register(grpc::ServerContext* context,
                                    const control::RegisterRequest* request,
                                    control::RegisterResponse* response) {
  if (grpc::Status auth = options_.auth->Check(context); !auth.ok()) return auth;
  const control::NodeInfo& info = request->node();
  if (info.name().empty() || info.name().size() > 253) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "a node name must have 1-253 bytes");
  }
  if (info.protocol_version() != kProtocolVersion) {
    return Refuse(absl::StrCat("node ", info.name(), " speaks protocol version ",
                               info.protocol_version(), "; this scheduler speaks ",
                               kProtocolVersion, " (", kBuildVersion, ")"));
  }
  // The data plane's version: a node of another would register and then fail every
  // connection to it (the handshake refuses it), so it is refused here, where the node
  // learns why and exits.
  if (info.data_plane_version() != 0 && info.data_plane_version() != transport::kDataPlaneVersion) {
    return Refuse(absl::StrCat("node ", info.name(), " speaks data-plane version ",
                               info.data_plane_version(), "; this scheduler speaks ",
                               transport::kDataPlaneVersion, " (", kBuildVersion, ")"));
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
    // Unsaid (a node of an older build, a plane's options without it): bf16, the only one
    // there was.
    auto or_bf16 = [](const std::string& kv) {
      return kv.empty() ? std::string(EnumNameOf(KvDType::kBF16, kKvDTypeNames)) : kv;
    };
    if (or_bf16(m.kv_dtype()) != or_bf16(want.kv_dtype())) {
      return Refuse(absl::StrCat("compute node ", info.name(), " keeps its KV cache in ",
                                 or_bf16(m.kv_dtype()), "; this scheduler's is ",
                                 or_bf16(want.kv_dtype()),
                                 " (start both with the same --kv_cache_dtype)"));
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  // A node that comes back under the same name replaces its dead record; a live one keeps
  // its name until it misses its heartbeat deadline.
  const absl::Time now = absl::Now();
  for (auto it = nodes_.begin(); it != nodes_.end(); ++it) {
    if (it->second.view.info.name() == info.name()) {
      if (it->second.view.alive && now - it->second.view.last_seen <= options_.heartbeat_timeout) {
        LOG_FIRST_N(WARNING, 20) << "refused to register a second " << info.name()
                                 << " while the first is alive";
        return grpc::Status(
            grpc::StatusCode::ALREADY_EXISTS,
            absl::StrCat("node ", info.name(), " is registered and alive (last heartbeat ",
                         absl::FormatDuration(
                             absl::Trunc(now - it->second.view.last_seen, absl::Milliseconds(1))),
                         " ago); the name is free once it misses its heartbeat deadline of ",
                         absl::FormatDuration(options_.heartbeat_timeout)));
      }
      if (it->second.view.alive) MarkDead(it->second, "registered again");
      nodes_.erase(it);
      break;
    }
  }
  std::vector<const control::NodeInfo*> live;
  for (const auto& [id, other] : nodes_) {
    if (other.view.alive) live.push_back(&other.view.info);
  }
  if (const absl::Status agreed = CheckKernelAgreement(info, live, options_.allow_mixed_isa);
      !agreed.ok()) {
    LOG(ERROR) << "refused a node: " << agreed.message();
    return ToGrpcStatus(agreed);
  }
  Node node;
  node.view.id = next_id_++;
  node.view.info = info;
  node.view.alive = true;
  node.view.last_seen = now;
  node.session_token = HexEncode(SecureRandomBytes(16));
  response->set_session_token(node.session_token);
  const uint64_t id = node.view.id;
  nodes_.emplace(id, std::move(node));
  if (!stop_) StartConfigurationLocked(id);
  monitor_loop_.Post([this] { CheckHeartbeats(); });  // its deadline may be the next one
  response->set_node_id(id);
  response->set_epoch(options_.epoch);
  response->set_heartbeat_interval_ms(absl::ToInt64Milliseconds(options_.heartbeat_interval));
  LOG(INFO) << "registered " << (info.role() == control::ROLE_COMPUTE ? "compute" : "memory")
            << " node " << info.name() << " at " << info.control_address();
  return grpc::Status::OK;
}

grpc::Status ControlPlane::Heartbeat(grpc::ServerContext* context,
                                     const control::HeartbeatRequest* request,
                                     control::HeartbeatResponse* response) {
  if (grpc::Status auth = options_.auth->Check(context); !auth.ok()) return auth;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = nodes_.find(request->node_id());
  const bool known = it != nodes_.end() && it->second.view.alive &&
                     request->epoch() == options_.epoch &&
                     ConstantTimeEquals(request->session_token(), it->second.session_token);
  response->set_known(known);
  if (known) {
    it->second.view.last_seen = absl::Now();
    it->second.view.status = request->status();
  }
  return grpc::Status::OK;
}

bool ControlPlane::MarkDead(Node& node, const std::string& why) {
  if (!node.view.alive) return false;
  node.view.alive = false;
  LOG(WARNING) << "node " << node.view.info.name() << " is dead: " << why;
  if (node.configuring != nullptr) node.configuring->TryCancel();  // the loop goes on
  if (node.executor >= 0) scheduler_->SetExecutorAlive(node.executor, false);
  const bool left_rotation = node.in_rotation;
  if (node.in_rotation) {
    // The other replicas learn it from their next configuration (Departures), which the
    // caller sends: one that hung still holds its connections to them.
    node.in_rotation = false;
    ReleaseLater(options_.rotation->RemoveReplica(node.view.info.name()));
    scheduler_->RefreshExecutorAlive(options_.rotation_executor, RotationAlive(options_.rotation));
  }
  if (node.pool) scheduler_->SetPoolAlive(*node.pool, false);
  // Pools that waited only for this node to hear of them.
  if (node.view.info.role() == control::ROLE_COMPUTE) AnnounceKnownPoolsLocked();
  return left_rotation || node.view.info.role() == control::ROLE_MEMORY;
}

void ControlPlane::ReleaseLater(std::shared_ptr<StepExecutor> executor) {
  if (executor == nullptr) return;
  // The group's copy is let go on this loop. Where it is the last, the group's retire
  // function (set in the constructor) posts the executor back to this loop to be
  // destroyed; where a call the group made before it let the executor go (Submit,
  // Reachable) still holds a copy, that call's copy does the same when it goes, on its
  // thread. A refused post (the loop has stopped) drops the closure, and the executor with
  // it, at once.
  release_loop_.Post([executor = std::move(executor)]() mutable { executor.reset(); });
}

void ControlPlane::CheckHeartbeats() {
  if (heartbeat_timer_ != 0) monitor_loop_.Cancel(heartbeat_timer_);
  heartbeat_timer_ = 0;
  absl::Time next = absl::InfiniteFuture();
  bool compute_config_changed = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    const absl::Time now = absl::Now();
    for (auto& [id, node] : nodes_) {
      if (!node.view.alive) continue;
      if (now - node.view.last_seen > options_.heartbeat_timeout) {
        compute_config_changed |= MarkDead(
            node,
            absl::StrCat("no heartbeat for ", absl::FormatDuration(now - node.view.last_seen)));
      } else {
        next = std::min(next, node.view.last_seen + options_.heartbeat_timeout);
      }
    }
  }
  if (compute_config_changed) RequestReconfigure();
  if (next != absl::InfiniteFuture()) {
    // Just past the earliest deadline; heartbeats that arrive meanwhile move it on.
    heartbeat_timer_ =
        monitor_loop_.RunAt(next + absl::Milliseconds(1), [this] { CheckHeartbeats(); });
  }
}

void ControlPlane::StartConfigurationLocked(uint64_t id) {
  for (auto it = configurations_.begin(); it != configurations_.end();) {
    if (it->done) {
      it->thread.join();  // it has set `done` and is on its way out
      it = configurations_.erase(it);
    } else {
      ++it;
    }
  }
  Configuration& c = configurations_.emplace_back();
  c.thread = std::thread([this, id, &c] {
    SetCurrentThreadName("ctl-configure");
    ConfigureNode(id);
    std::lock_guard<std::mutex> lock(mu_);
    c.done = true;
  });
}

void ControlPlane::ConfigureNode(uint64_t id) {
  bool compute;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    auto it = nodes_.find(id);
    if (it == nodes_.end() || !it->second.view.alive) return;
    compute = it->second.view.info.role() == control::ROLE_COMPUTE;
  }
  if (compute) {
    ConfigureCompute(id);
  } else {
    ConfigureMemory(id);
  }
}

bool ControlPlane::SetConfiguring(uint64_t id, grpc::ClientContext* context) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = nodes_.find(id);
  if (it == nodes_.end()) return false;
  if (context != nullptr && (stop_ || !it->second.view.alive)) return false;
  it->second.configuring = context;
  return true;
}

void ControlPlane::ConfigureCompute(uint64_t id) {
  control::NodeInfo info;
  control::ComputeConfig config;
  std::set<uint64_t> sent_memory_ids;
  {
    std::lock_guard<std::mutex> lock(mu_);
    info = nodes_.at(id).view.info;
    config = ComputeConfigLocked(&sent_memory_ids);
  }
  const std::shared_ptr<grpc::Channel> channel =
      ComputeNodeChannel(info.control_address(), *options_.auth);
  std::unique_ptr<StepExecutor> executor;
  std::string carrier = "gRPC";
  // Plans over the node's step channel where it offers one and can be reached there (a
  // firewall that opens only the control port, a transport that cannot start: gRPC then).
  // Its frames are sealed with the deployment's secret (common/protocol/step_frame.h), so
  // control-plane TLS does not keep them off the data plane.
  if (options_.data_plane_steps && !info.step_address().empty()) {
    DataPlaneExecutorOptions o;
    o.name = info.name();
    o.address = info.step_address();
    o.step_deadline = options_.step_deadline;
    o.transport = options_.step_transport;
    o.control = channel;
    auto made = DataPlaneExecutor::Create(std::move(o));
    absl::Status reached = made.ok() ? (*made)->Probe() : made.status();
    if (reached.ok()) {
      executor = std::move(*made);
      carrier = absl::StrCat("the data plane at ", info.step_address());
    } else {
      LOG(WARNING) << "compute node " << info.name() << ": its step channel at "
                   << info.step_address() << " cannot be reached (" << reached.message()
                   << "); its steps go over gRPC";
    }
  }
  if (executor == nullptr) {
    executor =
        std::make_unique<GrpcExecutor>(info.name(), channel, options_.step_deadline, options_.auth);
  }
  auto stub = control::ComputeNode::NewStub(channel);
  grpc::ClientContext context;
  options_.auth->Attach(&context);
  // Allocating and touching a large local KV cache takes a while.
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
  control::ComputeConfigAck ack;
  if (!SetConfiguring(id, &context)) return;  // declared dead meanwhile
  const grpc::Status status = stub->Configure(&context, config, &ack);
  SetConfiguring(id, nullptr);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = nodes_.find(id);
  if (it == nodes_.end()) return;
  Node& node = it->second;
  if (!status.ok()) {
    MarkDead(node, "configuration failed: " + status.error_message());
    return;
  }
  node.channel = channel;
  std::optional<PoolIndex> local_pool;
  std::string disk;
  if (options_.expected_memory_nodes == 0) {
    node.pool = scheduler_->AddPool(info.name(), static_cast<int64_t>(ack.local_kv_slots()));
    local_pool = node.pool;
    // Co-located: the disk tier under the node's own KV cache.
    disk = AttachDiskTier(scheduler_, *local_pool, GrpcKvMover::Node::kCompute, channel, options_,
                          ack);
  }
  if (options_.rotation != nullptr) {
    if (info.data_address().empty()) {
      MarkDead(node, "it has no context address: start it with --pipelining=rotational");
      return;
    }
    // It takes plans once the scheduler resends the running requests' set-ups.
    ReleaseLater(options_.rotation->AddReplica(info.name(), info.data_address(),
                                               std::shared_ptr<StepExecutor>(std::move(executor)),
                                               /*active=*/false));
    node.in_rotation = true;
    ActivateAfterSetups(scheduler_, options_.rotation_executor, options_.rotation, info.name());
  } else {
    node.executor = scheduler_->AddExecutor(std::move(executor), local_pool);
  }
  node.view.configured = true;
  node.knows = sent_memory_ids;
  // A memory node configured (or a replica gone) during the call is not in the list it was
  // sent; from now on, a change reaches this node through the broadcast.
  if (ComputeConfigLocked().SerializeAsString() != config.SerializeAsString()) {
    RequestReconfigure();
  }
  AnnounceKnownPoolsLocked();
  LOG(INFO) << "compute node " << info.name() << " is ready, its steps over " << carrier
            << (local_pool
                    ? absl::StrCat(" (co-located, ", ack.local_kv_slots(), " KV slots", disk, ")")
                    : "");
}

control::ComputeConfig ControlPlane::ComputeConfigLocked(std::set<uint64_t>* memory_ids) const {
  control::ComputeConfig config;
  config.set_epoch(options_.epoch);
  config.set_disaggregated(options_.expected_memory_nodes > 0);
  // Co-located: the disk tier under the node's own cache keeps prefix-cache blocks.
  if (options_.expected_memory_nodes == 0 && scheduler_->config().enable_prefix_caching) {
    config.set_disk_block_tokens(static_cast<uint32_t>(scheduler_->config().block_tokens));
  }
  for (const auto& [other_id, other] : nodes_) {
    if (other.view.info.role() == control::ROLE_MEMORY && other.view.alive && other.kv_ready) {
      if (memory_ids != nullptr) memory_ids->insert(other_id);
      auto* m = config.add_memory_nodes();
      m->set_pool_index(other.pool->value());
      m->set_name(other.view.info.name());
      m->set_data_address(other.view.info.data_address());
    }
  }
  if (options_.rotation != nullptr) {
    for (const DepartedReplica& d : options_.rotation->Departures()) {
      control::DepartedReplica* out = config.add_departed_replicas();
      out->set_context_address(d.context_address);
      out->set_through_step(d.through_step);
    }
  }
  return config;
}

void ControlPlane::ConfigureMemory(uint64_t id) {
  control::NodeInfo info;
  control::MemoryConfig config;
  std::optional<PoolIndex> pool;
  {
    std::lock_guard<std::mutex> lock(mu_);
    info = nodes_.at(id).view.info;
    const control::ModelShape& m = options_.model;
    const int64_t per_token = 2LL * m.num_layers() * m.num_kv_heads() * m.head_dim() * 2;
    const int64_t slots =
        per_token > 0 ? static_cast<int64_t>(info.kv_budget_bytes()) / per_token : 0;
    if (slots > 0) {
      auto known = pool_of_name_.find(info.name());
      if (known == pool_of_name_.end()) {
        known = pool_of_name_.emplace(info.name(), scheduler_->ReservePool(info.name())).first;
      }
      pool = known->second;
      config.set_pool_index(pool->value());
    }
    config.set_epoch(options_.epoch);
    *config.mutable_model() = m;
    config.set_num_slots(slots);
    config.set_max_step_rows(static_cast<uint64_t>(scheduler_->config().max_num_batched_tokens));
    // The disk tier keeps prefix-cache blocks: none without the prefix cache.
    if (scheduler_->config().enable_prefix_caching) {
      config.set_disk_block_tokens(static_cast<uint32_t>(scheduler_->config().block_tokens));
    }
  }
  if (config.num_slots() == 0) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = nodes_.find(id);
    if (it != nodes_.end()) {
      MarkDead(it->second, absl::StrCat("its KV budget of ", info.kv_budget_bytes(),
                                        " bytes holds no token of this model"));
    }
    return;
  }
  auto channel = options_.auth->CreateChannel(info.control_address());
  auto stub = control::MemoryNode::NewStub(channel);
  grpc::ClientContext context;
  options_.auth->Attach(&context);
  // Allocating and touching gigabytes of KV cache takes a while (about 3 s per GiB here).
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(600)));
  control::MemoryConfigAck ack;
  if (!SetConfiguring(id, &context)) return;  // declared dead meanwhile
  const grpc::Status status = stub->Configure(&context, config, &ack);
  SetConfiguring(id, nullptr);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = nodes_.find(id);
    if (it == nodes_.end()) return;
    Node& node = it->second;
    if (!status.ok()) {
      MarkDead(node, "configuration failed: " + status.error_message());
      return;
    }
    if (!node.view.alive) return;  // died while configuring
    node.channel = channel;
    node.pool = pool;
    node.ack = ack;
    node.kv_ready = true;
    AnnounceKnownPoolsLocked();  // with no compute node yet, at once
  }
  RequestReconfigure();
}

void ControlPlane::AnnounceKnownPoolsLocked() {
  for (auto& [id, node] : nodes_) {
    if (node.view.info.role() != control::ROLE_MEMORY || !node.view.alive || !node.kv_ready ||
        node.announced) {
      continue;
    }
    bool known = true;
    for (const auto& [other_id, other] : nodes_) {
      if (other.view.info.role() == control::ROLE_COMPUTE && other.view.alive &&
          !other.knows.contains(id)) {
        known = false;
        break;
      }
    }
    if (!known) continue;
    node.announced = true;
    node.view.configured = true;
    scheduler_->SetPoolAlive(*node.pool, true, static_cast<int64_t>(node.ack.num_slots()));
    const std::string disk = AttachDiskTier(scheduler_, *node.pool, GrpcKvMover::Node::kMemory,
                                            node.channel, options_, node.ack);
    const control::NodeInfo& info = node.view.info;
    LOG(INFO) << "memory node " << info.name() << " is ready: pool " << *node.pool << ", "
              << node.ack.num_slots() << " KV slots (" << node.ack.kv_bytes() / (1 << 20)
              << " MiB), data plane at " << info.data_address() << " over " << info.transport()
              << disk;
  }
}

void ControlPlane::ReconfigureComputeNodes() {
  if (options_.expected_memory_nodes == 0) return;
  std::vector<std::pair<uint64_t, std::shared_ptr<grpc::Channel>>> targets;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, node] : nodes_) {
      if (node.view.info.role() == control::ROLE_COMPUTE && node.view.alive &&
          node.view.configured && node.channel) {
        targets.emplace_back(id, node.channel);
      }
    }
  }
  // Each node on a thread of its own: one that hangs, until it is declared dead, or retries
  // holds up no other node's news (a memory node gone, which its steps wait on otherwise).
  std::vector<std::thread> tellers;
  for (const auto& [id, channel] : targets) {
    tellers.emplace_back([this, id = id, channel = channel] {
      SetCurrentThreadName("ctl-broadcast");
      TellComputeNode(id, channel);
    });
  }
  for (std::thread& t : tellers) t.join();
  std::lock_guard<std::mutex> lock(mu_);
  LOG(INFO) << "compute nodes now use " << ComputeConfigLocked().memory_nodes_size()
            << " memory node(s)";
}

void ControlPlane::TellComputeNode(uint64_t id, std::shared_ptr<grpc::Channel> channel) {
  // A node that misses the new list keeps waiting on a memory node that is gone, or
  // (rotational pipelining) on a replica that hung. Retried with backoff until it takes, the
  // node dies, or the control plane stops; every attempt sends the newest list.
  // One that heartbeats but never takes it would hold back every new memory node's pool for
  // as long as it lives: after options_.list_deadline it is taken out instead.
  auto stub = control::ComputeNode::NewStub(channel);
  const absl::Time give_up = absl::Now() + options_.list_deadline;
  absl::Duration backoff = absl::Milliseconds(100);
  for (int attempt = 1;; ++attempt) {
    std::string name;
    control::ComputeConfig config;
    std::set<uint64_t> memory_ids;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = nodes_.find(id);
      if (stop_ || it == nodes_.end() || !it->second.view.alive) return;
      name = it->second.view.info.name();
      config = ComputeConfigLocked(&memory_ids);
    }
    grpc::ClientContext context;
    options_.auth->Attach(&context);
    context.set_deadline(absl::ToChronoTime(std::min(absl::Now() + absl::Seconds(5), give_up)));
    control::ComputeConfigAck ack;
    if (!SetConfiguring(id, &context)) return;  // declared dead meanwhile
    const grpc::Status status = stub->Configure(&context, config, &ack);
    SetConfiguring(id, nullptr);
    if (status.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = nodes_.find(id);
      if (it != nodes_.end()) it->second.knows = memory_ids;
      AnnounceKnownPoolsLocked();
      return;
    }
    // Asking again gets the same answer (a refusal), or the time is up: it is taken out.
    const bool refused = Refusal(status.error_code());
    if (refused || absl::Now() >= give_up) {
      const std::string why =
          refused ? "it refused the memory-node list: " + status.error_message()
                  : absl::StrCat("it did not take the memory-node list in ",
                                 absl::FormatDuration(options_.list_deadline), " (", attempt,
                                 " attempts; the last: ", status.error_message(), ")");
      bool changed = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = nodes_.find(id);
        if (it != nodes_.end()) changed = MarkDead(it->second, why);
      }
      if (changed) RequestReconfigure();
      return;
    }
    LOG(WARNING) << "could not tell compute node " << name << " about the memory nodes (attempt "
                 << attempt << "): " << status.error_message() << "; retrying in "
                 << absl::FormatDuration(backoff);
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, absl::ToChronoMilliseconds(backoff), [&] { return stop_; });
    backoff = std::min(2 * backoff, absl::Seconds(2));
  }
}

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

std::string ControlPlane::Missing() const {
  int compute = 0, memory = 0, unannounced = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, node] : nodes_) {
      if (!node.view.alive) continue;
      unannounced += node.kv_ready && !node.announced;
      if (!node.view.configured) continue;
      compute += node.view.info.role() == control::ROLE_COMPUTE;
      memory += node.view.info.role() == control::ROLE_MEMORY;
    }
  }
  const SchedulerStats stats = scheduler_->Stats();
  std::vector<std::string> missing;
  if (stats.alive_executors == 0 || compute < options_.expected_compute_nodes) {
    missing.push_back(absl::StrCat("a compute node (", stats.alive_executors, " of ",
                                   options_.expected_compute_nodes, " ready)"));
  }
  if (options_.expected_memory_nodes > 0 && memory < options_.expected_memory_nodes) {
    missing.push_back(absl::StrCat(
        "memory nodes (", memory, " of ", options_.expected_memory_nodes, " ready",
        unannounced > 0
            ? absl::StrCat("; ", unannounced, " configured but not yet known to every compute node")
            : "",
        ")"));
  }
  bool pool = false;
  for (const PoolStatus& p : stats.pools) pool = pool || p.alive;
  // Co-located, the pool is the compute node's own cache and goes with it.
  if (!pool && (options_.expected_memory_nodes > 0 || missing.empty())) {
    missing.push_back("a KV pool");
  }
  if (missing.empty()) return "the scheduler";
  return absl::StrJoin(missing, " and ");
}

bool ControlPlane::Serving() const {
  if (!ever_ready_.load()) {
    if (!Ready()) return false;
    ever_ready_.store(true);
  }
  return scheduler_->HasCapacity();
}

std::vector<NodeView> ControlPlane::Nodes() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<NodeView> out;
  for (const auto& [id, node] : nodes_) out.push_back(node.view);
  return out;
}

void ControlPlane::ShutdownNodes() {
  struct Target {
    std::string name;
    bool compute;
    std::shared_ptr<grpc::Channel> channel;
  };
  std::vector<Target> targets;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, node] : nodes_) {
      if (node.view.alive && node.channel) {
        targets.push_back(
            {node.view.info.name(), node.view.info.role() == control::ROLE_COMPUTE, node.channel});
      }
    }
  }
  for (const Target& target : targets) {
    grpc::ClientContext context;
    options_.auth->Attach(&context);
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    control::ShutdownResponse response;
    if (target.compute) {
      control::ComputeNode::NewStub(target.channel)
          ->Shutdown(&context, control::ShutdownRequest(), &response);
    } else {
      control::MemoryNode::NewStub(target.channel)
          ->Shutdown(&context, control::ShutdownRequest(), &response);
    }
  }
}

}  // namespace strata
