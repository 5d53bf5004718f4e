#include "compute_node/compute_node.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/base/wait_policy.h"
#include "common/tokenizer/tokenizer.h"

namespace strata {

absl::StatusOr<std::unique_ptr<ComputeNode>> ComputeNode::Create(
    const ComputeNodeOptions& options) {
  auto node = std::unique_ptr<ComputeNode>(new ComputeNode);
  node->options_ = options;
  node->disk_ = std::make_unique<KvDiskHost>(options.disk);
  if (options.lanes != 1 && options.lanes != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("a compute node runs one or two batches in flight, not ", options.lanes));
  }
  if (options.rotation_batches < 0 ||
      options.rotation_batches > static_cast<int>(StepEngine::kMaxLanes)) {
    return absl::InvalidArgumentError(absl::StrCat("rotational pipelining takes 1 to ",
                                                   StepEngine::kMaxLanes, " batches, not ",
                                                   options.rotation_batches));
  }
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(options.model_dir));
  if (options.kv_cache_dtype != DType::kBF16 && options.kv_cache_dtype != DType::kF16) {
    return absl::InvalidArgumentError("the KV cache is bf16 or f16");
  }
  config.kv_cache_dtype = options.kv_cache_dtype;
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(node->weights_, ModelWeights::Load(options.model_dir, config));
  node->max_model_len_ =
      options.max_model_len > 0 ? options.max_model_len : config.max_position_embeddings;
  if (config.sliding_window > 0 && node->max_model_len_ > config.sliding_window) {
    LOG(WARNING) << "the model declares a sliding window of " << config.sliding_window
                 << " tokens; strata runs full attention, so the context is capped there";
    node->max_model_len_ = config.sliding_window;
  }
  node->runner_ = std::make_unique<ModelRunner>(node->weights_.get(), node->max_model_len_);
  // Structured output matches grammars against the tokenizer's vocabulary.
  if (std::filesystem::exists(std::filesystem::path(options.model_dir) / "tokenizer.json")) {
    auto tokenizer = Tokenizer::Load(options.model_dir);
    if (tokenizer.ok()) {
      std::vector<int32_t> ends(config.eos_token_ids.begin(), config.eos_token_ids.end());
      node->grammar_vocabulary_ = MakeGrammarVocabulary(**tokenizer, ends);
    } else {
      LOG(WARNING) << "structured output is unavailable: " << tokenizer.status();
    }
  }
  if (options.rotation_batches > 0) {
    // This runs on the loading thread, a compute thread; the transports' threads are not.
    ServiceThreadScope service_threads;
    ComputeNode* self = node.get();
    node->wakeup_ = std::make_unique<Wakeup>();
    ContextExchangeOptions exchange;
    exchange.transport = options.remote.transport;
    exchange.listen_address = options.context_address;
    exchange.hidden = config.hidden_size;
    exchange.verify_checksums = options.remote.verify_checksums;
    exchange.on_arrival = [self] { self->wakeup_->Notify(); };
    ASSIGN_OR_RETURN(node->exchange_, ContextExchange::Create(exchange));
    std::vector<AttentionBackend*> lanes;
    for (int j = 0; j < options.rotation_batches; ++j) {
      RemoteAttentionOptions lane = options.remote;
      lane.prefill_policy = PrefillPolicy::kMemory;  // a rotated step leaves all attention there
      lane.endpoint = RotationEndpoint(node->exchange_->address(), j);
      lane.on_settled = [self] { self->wakeup_->Notify(); };
      ASSIGN_OR_RETURN(auto remote, RemoteAttention::Create(config, lane));
      lanes.push_back(remote.get());
      node->rotated_lanes_.push_back(std::move(remote));
    }
    node->rotated_engine_ = std::make_unique<StepEngine>(
        node->runner_.get(), lanes,
        StepEngineOptions{options.max_batch_rows, node->max_model_len_, options.trace,
                          node->grammar_vocabulary_.get()});
    LOG(INFO) << "rotational pipelining: " << options.rotation_batches
              << " batch slots; contexts arrive at " << node->exchange_->address();
  }
  LOG(INFO) << "loaded " << config.architecture << " from " << options.model_dir << " ("
            << config.NumParameters() / 1e6 << "M parameters, "
            << node->weights_->gemm_weight_bytes() / (1 << 20)
            << " MiB of repacked GEMM weights) in " << absl::FormatDuration(absl::Now() - start);
  return node;
}

namespace {

// Points `remote` (and the second lane's `second`, if any) at the memory nodes of `config`.
void SetMemoryNodes(RemoteAttention* remote, RemoteAttention* second, const ComputeConfig& config) {
  remote->SetMemoryNodes(config.epoch, config.memory_nodes);
  if (second != nullptr) second->SetMemoryNodes(config.epoch, config.memory_nodes);
  LOG(INFO) << "disaggregated mode: " << config.memory_nodes.size() << " memory node(s)"
            << (second != nullptr ? ", two batches in flight" : "");
}

}  // namespace

int64_t ComputeNode::local_kv_slots() const {
  const ModelConfig& c = weights_->config;
  const int64_t per_token = 2 * c.num_layers * c.kv_size() * 2;
  return options_.local_kv_budget_bytes / per_token;
}

ComputeNode::~ComputeNode() {
  stopping_.store(true);
  if (wakeup_) wakeup_->Notify();
  std::lock_guard<std::mutex> lock(rotation_mu_);  // the driver is gone
  for (auto& lane : rotated_lanes_) lane->AbandonStep();
}

void ComputeNode::PrepareQueue(PlanQueue& queue) {
  if (rotational()) queue.SetOnChange([this] { wakeup_->Notify(); });
}

ContextExchangeStats ComputeNode::context_stats() const {
  return exchange_ != nullptr ? exchange_->stats() : ContextExchangeStats();
}

std::string ComputeNode::context_address() const {
  return exchange_ != nullptr ? exchange_->address() : "";
}

absl::StatusOr<ComputeConfigAck> ComputeNode::Configure(const ComputeConfig& config) {
  ComputeConfigAck ack;
  const bool disaggregated = config.disaggregated || !config.memory_nodes.empty();
  if (rotational()) {
    if (!disaggregated) {
      return absl::FailedPreconditionError(
          "rotational pipelining needs memory nodes; this scheduler runs co-located attention");
    }
    exchange_->SetEpoch(config.epoch);
    // Replicas declared dead: lanes waiting for their contexts give up now, not at the
    // hand-off deadline (a hung replica's connections stay open).
    // (This node itself, back after a hang, is on the list until it joins again; nothing
    // of its own comes to it through the exchange.)
    for (const DepartedReplica& d : config.departed_replicas) {
      if (d.context_address != exchange_->address()) {
        exchange_->Depart(d.context_address, d.through_step);
      }
    }
    rotated_epoch_.store(config.epoch);  // plans of another epoch are refused from now on
    for (auto& lane : rotated_lanes_) {
      lane->SetMemoryNodes(config.epoch, config.memory_nodes);
      lane->ConnectAll();  // routed answers need each lane's hello at every memory node
    }
    LOG(INFO) << "rotational pipelining over " << config.memory_nodes.size()
              << " memory node(s), epoch " << config.epoch;
    ready_.store(true);
    ack.local_kv_slots = 0;
    return ack;
  }
  if (RemoteAttention* remote = remote_ready_.load();
      disaggregated && remote != nullptr && remote_epoch_.load() == config.epoch) {
    // The same scheduler with another set of memory nodes (one died, one came back): no
    // need to wait for the step in flight, which may be waiting on the node that is gone.
    // Closing its connection ends that wait now rather than at the layer deadline.
    SetMemoryNodes(remote, remote_second_ready_.load(), config);
    ack.local_kv_slots = 0;
    return ack;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (epoch_ != config.epoch) {
    // A new scheduler: forget every request of the previous one.
    // A step still in a lane of the old engine has answers registered that would land in its
    // buffers: forget them before the buffers go.
    for (RemoteAttention* r : {remote_.get(), remote_second_.get()}) {
      if (r != nullptr) r->AbandonStep();
    }
    engine_.reset();
    ++engine_generation_;
    disk_->Close();  // its store goes next
    local_.reset();
    ready_.store(false);
    epoch_ = config.epoch;
  }
  if (disaggregated) {
    if (local_ != nullptr) {
      return absl::FailedPreconditionError(
          "this compute node runs co-located attention for the current scheduler");
    }
    if (remote_ == nullptr) {
      ASSIGN_OR_RETURN(remote_, RemoteAttention::Create(weights_->config, options_.remote));
    }
    if (options_.lanes == 2 && remote_second_ == nullptr) {
      ASSIGN_OR_RETURN(remote_second_, RemoteAttention::Create(weights_->config, options_.remote));
    }
    SetMemoryNodes(remote_.get(), remote_second_.get(), config);
    if (engine_ == nullptr) {
      std::vector<AttentionBackend*> lanes = {remote_.get()};
      if (remote_second_ != nullptr) lanes.push_back(remote_second_.get());
      engine_ = std::make_unique<StepEngine>(
          runner_.get(), lanes,
          StepEngineOptions{options_.max_batch_rows, max_model_len_, options_.trace,
                            grammar_vocabulary_.get()});
      ++engine_generation_;
    }
    ready_.store(true);
    remote_epoch_.store(config.epoch);
    remote_second_ready_.store(remote_second_.get());
    remote_ready_.store(remote_.get());
    ack.local_kv_slots = 0;
    return ack;
  }
  if (remote_ != nullptr && engine_ != nullptr) {
    return absl::FailedPreconditionError(
        "this compute node runs disaggregated attention for the current scheduler");
  }
  if (local_ == nullptr) {
    const int64_t slots = local_kv_slots();
    if (slots < 1) return absl::InvalidArgumentError("the local KV budget holds no token");
    ASSIGN_OR_RETURN(local_, LocalAttention::Create(weights_->config, slots, options_.prefault_kv));
    local_->set_load_gate(&disk_->gate());
    engine_ =
        std::make_unique<StepEngine>(runner_.get(), local_.get(),
                                     StepEngineOptions{options_.max_batch_rows, max_model_len_,
                                                       options_.trace, grammar_vocabulary_.get()});
    ++engine_generation_;
    LOG(INFO) << "co-located mode: local KV cache of " << slots << " tokens ("
              << (slots * weights_->config.kv_elements_per_token_per_layer() * 2 *
                  weights_->config.num_layers) /
                     (1 << 20)
              << " MiB)";
  }
  ack.local_kv_slots = local_kv_slots();
  if (disk_->enabled() && config.disk_block_tokens > 0) {
    // Opened empty at every configuration: the scheduler's index of it starts empty too.
    const ModelShape m = shape();
    auto tier = disk_->Open(
        config.epoch, &local_->engine().mutable_store(), config.disk_block_tokens,
        KvDiskFingerprint(m.name, m.num_layers, m.num_kv_heads, m.head_dim, m.kv_dtype));
    if (tier.ok()) {
      ack.disk = *tier;
    } else {
      // The KV cache still serves, without a disk tier.
      LOG(ERROR) << "no disk tier: " << tier.status();
    }
  }
  ready_.store(true);
  kv_slots_total_.store(local_->engine().store().num_slots());
  return ack;
}

// One stream's view of the node's lanes.
class ComputeNode::Lanes : public LaneEngine {
 public:
  Lanes(ComputeNode* node, uint64_t owner) : node_(node), owner_(owner) {}
  int num_lanes() const override { return node_->NumLanes(); }
  std::optional<StepResult> Begin(int lane, const StepPlan& plan) override {
    return node_->BeginLane(owner_, lane, plan);
  }
  bool Advance(int lane) override { return node_->AdvanceLane(lane); }
  StepResult Finish(int lane) override { return node_->FinishLane(lane); }

 private:
  ComputeNode* node_;
  uint64_t owner_;
};

void ComputeNode::RunPipelined(PlanQueue& queue, const PlanWaitObserver& on_wait) {
  if (rotational()) return RunRotated(queue);
  Lanes lanes(this, next_owner_.fetch_add(1));
  RunPipeline(lanes, queue, on_wait);
}

int ComputeNode::NumLanes() const {
  // Co-located attention computes in place: its engine has one lane, whatever the option.
  std::lock_guard<std::mutex> lock(mu_);
  return engine_ != nullptr ? engine_->num_lanes() : options_.lanes;
}

void ComputeNode::ReleaseLaneLocked() {
  if (--owner_busy_lanes_ == 0) {
    lanes_owner_ = 0;
    lanes_free_.notify_all();
  }
}

std::optional<StepResult> ComputeNode::BeginLane(uint64_t owner, int lane, const StepPlan& plan) {
  std::unique_lock<std::mutex> lock(mu_);
  // Another stream's plans still run: wait until its lanes are idle.
  lanes_free_.wait(lock, [&] { return lanes_owner_ == 0 || lanes_owner_ == owner; });
  auto refuse = [&](absl::Status why) {
    StepResult result;
    result.step_id = plan.step_id;
    result.status = std::move(why);
    return result;
  };
  if (engine_ == nullptr) {
    return refuse(absl::FailedPreconditionError("the compute node is not configured yet"));
  }
  if (plan.epoch != epoch_) {
    return refuse(absl::FailedPreconditionError(
        absl::StrCat("plan of epoch ", plan.epoch, " but the node is configured for ", epoch_)));
  }
  // One lane in co-located mode (the engine's), whatever the option says.
  if (lane >= engine_->num_lanes()) {
    return refuse(absl::FailedPreconditionError(
        "co-located attention runs one batch at a time; the scheduler sent a second"));
  }
  if (engine_->lane_busy(lane)) {
    return refuse(absl::InternalError(absl::StrCat("lane ", lane, " already runs a plan")));
  }
  lane_generation_[lane] = engine_generation_;
  lane_step_[lane] = plan.step_id;
  std::optional<StepResult> result = engine_->Begin(lane, plan);
  if (result) {
    AfterStep(*result);
  } else {
    lanes_owner_ = owner;
    ++owner_busy_lanes_;
  }
  return result;
}

bool ComputeNode::AdvanceLane(int lane) {
  std::lock_guard<std::mutex> lock(mu_);
  if (engine_ == nullptr || lane_generation_[lane] != engine_generation_) return true;
  return engine_->Advance(lane);
}

StepResult ComputeNode::FinishLane(int lane) {
  std::lock_guard<std::mutex> lock(mu_);
  ReleaseLaneLocked();
  if (engine_ == nullptr || lane_generation_[lane] != engine_generation_) {
    StepResult result;
    result.step_id = lane_step_[lane];
    result.status = absl::AbortedError("a new scheduler configured the compute node mid-step");
    return result;
  }
  StepResult result = engine_->Finish(lane);
  AfterStep(result);
  return result;
}

void ComputeNode::RunRotated(PlanQueue& queue) {
  std::lock_guard<std::mutex> lock(rotation_mu_);
  RotationDriverOptions d;
  d.exchange = exchange_.get();
  d.wakeup = wakeup_.get();
  d.handoff_timeout = options_.handoff_timeout;
  d.stop = &stopping_;
  d.on_result = [this](const StepResult& r) { AfterStep(r); };
  d.epoch = &rotated_epoch_;
  d.cached_epoch = &rotated_cached_epoch_;
  RunRotation(*rotated_engine_, queue, d);
}

void ComputeNode::AfterStep(const StepResult& result) {
  ++steps_;
  if (options_.on_step) options_.on_step(result);
  if (local_) kv_slots_used_.store(local_->engine().num_assigned_positions());
}

RemoteAttentionStats ComputeNode::remote_stats() const {
  RemoteAttentionStats total;
  for (const RemoteAttention* r : {remote_ready_.load(), remote_second_ready_.load()}) {
    if (r != nullptr) total += r->stats();
  }
  for (const auto& r : rotated_lanes_) total += r->stats();
  return total;
}

absl::StatusOr<std::vector<absl::Status>> ComputeNode::MoveKv(uint64_t epoch, uint64_t tier,
                                                              std::span<const KvMove> moves,
                                                              absl::Time deadline) {
  return disk_->Move(epoch, tier, moves, deadline);
}

ModelShape ComputeNode::shape() const {
  const ModelConfig& c = weights_->config;
  ModelShape s;
  s.name = options_.served_model_name;
  s.num_layers = c.num_layers;
  s.num_heads = c.num_heads;
  s.num_kv_heads = c.num_kv_heads;
  s.head_dim = c.head_dim;
  s.kv_dtype = EnumNameOf(KvCacheType(c), kernels::kKvDTypeNames);
  s.vocab_size = c.vocab_size;
  s.max_position_embeddings = max_model_len_;
  return s;
}

NodeStatus ComputeNode::Status() const {
  // Never waits for a step: heartbeats must flow while a step waits on a memory node.
  NodeStatus status;
  status.ready = ready_.load();
  status.steps_executed = steps_.load();
  status.kv_slots_total = kv_slots_total_.load();
  status.kv_slots_in_tables = kv_slots_used_.load();
  return status;
}

}  // namespace strata
