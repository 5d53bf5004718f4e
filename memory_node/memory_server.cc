#include "memory_node/memory_server.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/base/stopwatch.h"

namespace strata {
namespace {

using transport::FrameHeader;
using transport::FrameKind;
using transport::PeerId;

// A layer frame's payload is at most this big (a step of 16k rows of a large model is far
// below); larger claims are malformed.
constexpr uint64_t kMaxPayload = uint64_t{2} << 30;
// Frames other than a layer's (step descriptors, hellos, errors) are small: a descriptor
// carries a step's rows and slot assignments. Past this they are refused without a copy.
constexpr uint64_t kMaxSmallFrame = uint64_t{64} << 20;
// Buffers kept for reuse: a layer frame's size at most. A larger one goes back to the
// allocator, so that a peer's one-off giant frame does not stay resident.
constexpr size_t kMaxRecycled = size_t{64} << 20;
// The default budget of one peer's frames held at once, in its largest layer frames: a
// compute node's two lanes, two mini-batches each, and the frames of a step it gave up on
// still queued here, with room to spare.
constexpr uint64_t kFramesPerPeer = 8;

}  // namespace

absl::StatusOr<std::unique_ptr<MemoryServer>> MemoryServer::Create(MemoryServerOptions options) {
  auto server = std::unique_ptr<MemoryServer>(new MemoryServer(std::move(options)));
  // The worker's team takes the creating thread's size (--threads, --cpus set it there),
  // before any frame can arrive.
  server->worker_.Start();
  server->worker_.Post([threads = omp_get_max_threads()] { omp_set_num_threads(threads); });
  // Layer frames are placed into the server's own buffers once their claim fits; anything
  // else the transport would hold a copy of is small.
  server->options_.transport.max_held_bytes =
      std::min(server->options_.transport.max_held_bytes, kMaxSmallFrame);
  ASSIGN_OR_RETURN(server->transport_, transport::Transport::Create(server->options_.transport));
  server->transport_->SetHandler(transport::kFrameTag, server.get());
  MemoryServer* self = server.get();
  server->transport_->SetPeerHandler(
      [self](PeerId peer, transport::PeerEvent event, const absl::Status& why) {
        if (event == transport::PeerEvent::kConnected) {
          LOG(INFO) << "compute node connected on the data plane (peer " << peer << ")";
          std::lock_guard<std::mutex> lock(self->stats_mu_);
          ++self->stats_.peers;
          return;
        }
        LOG(WARNING) << "data-plane peer " << peer << " left: " << why.message();
        // Its step, if any, is dropped in order with its frames.
        Work work;
        work.peer = peer;
        work.status = absl::CancelledError("peer left");
        self->Enqueue(std::move(work));
      });
  ASSIGN_OR_RETURN(server->data_address_,
                   server->transport_->Listen(server->options_.data_address));
  return server;
}

MemoryServer::~MemoryServer() {
  {
    // Frames still posted are let go unhandled; one being handled finishes before the
    // transport goes.
    std::unique_lock<std::mutex> lock(pending_mu_);
    stop_ = true;
    pending_cv_.wait(lock, [&] { return pending_ == 0; });
  }
  worker_.Stop();
  transport_.reset();  // completes every send before buffers go
}

absl::StatusOr<MemoryConfigAck> MemoryServer::Configure(const MemoryConfig& config) {
  const ModelShape& m = config.model;
  if (m.num_layers == 0 || m.num_heads == 0 || m.num_kv_heads == 0 || m.head_dim == 0 ||
      m.num_heads % m.num_kv_heads != 0 || m.head_dim % 16 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("unusable model shape: ", m.num_layers, " layers, ", m.num_heads, " heads, ",
                     m.num_kv_heads, " KV heads, head dim ", m.head_dim));
  }
  if (m.kv_dtype != "bf16") {
    return absl::InvalidArgumentError(absl::StrCat("KV dtype \"", m.kv_dtype, "\""));
  }
  if (config.num_slots == 0) return absl::InvalidArgumentError("no KV slots");
  // Bounds that keep every size below in range (a configuration past them would wrap a
  // product into a small allocation): the store's own (KvStoreBytes), checked before
  // anything of the current configuration is let go, and the query heads'.
  if (m.num_heads > (1u << 16)) {
    return absl::InvalidArgumentError(absl::StrCat("model shape past 65536 heads: ", m.num_heads));
  }
  KvStoreConfig store;
  store.num_layers = static_cast<int>(m.num_layers);
  store.num_kv_heads = static_cast<int>(m.num_kv_heads);
  store.head_dim = static_cast<int>(m.head_dim);
  store.dtype = kernels::KvDType::kBF16;
  store.num_slots = static_cast<int64_t>(config.num_slots);
  store.prefault = options_.prefault_kv;
  RETURN_IF_ERROR(KvStoreBytes(store).status());
  disk_.Close();  // the old tier's blocks belong to the old index, and its store may go below
  std::lock_guard<std::mutex> lock(engine_mu_);
  const bool same_shape = engine_ != nullptr &&
                          dims_.num_layers == static_cast<int>(m.num_layers) &&
                          dims_.num_heads == static_cast<int>(m.num_heads) &&
                          dims_.num_kv_heads == static_cast<int>(m.num_kv_heads) &&
                          dims_.head_dim == static_cast<int>(m.head_dim) &&
                          engine_->store().num_slots() == static_cast<int64_t>(config.num_slots);
  peers_.clear();  // steps in flight belong to the previous configuration
  routed_.clear();
  if (same_shape) {
    engine_->Reset();  // the scheduler starts this pool empty
    epoch_ = config.epoch;
    pool_ = config.pool;
    LOG(INFO) << "reconfigured as pool " << pool_ << " of epoch " << epoch_ << " (KV dropped)";
  } else {
    AttentionEngineConfig engine_config;
    engine_config.store = store;
    engine_config.num_heads = m.num_heads;
    engine_.reset();  // free the old store before allocating the new one
    ready_.store(false);
    const absl::Time start = absl::Now();
    ASSIGN_OR_RETURN(engine_, AttentionEngine::Create(engine_config));
    dims_ = {static_cast<int>(m.num_layers), static_cast<int>(m.num_heads),
             static_cast<int>(m.num_kv_heads), static_cast<int>(m.head_dim)};
    epoch_ = config.epoch;
    pool_ = config.pool;
    LOG(INFO) << "configured as pool " << pool_ << " of epoch " << epoch_ << ": "
              << config.num_slots << " KV slots (" << engine_->store().total_bytes() / (1 << 20)
              << " MiB) for " << m.name << " in " << absl::FormatDuration(absl::Now() - start);
  }
  MemoryConfigAck ack;
  ack.num_slots = engine_->store().num_slots();
  ack.kv_bytes = engine_->store().total_bytes();
  if (disk_.enabled() && config.disk_block_tokens > 0) {
    auto tier =
        disk_.Open(config.epoch, &engine_->mutable_store(), config.disk_block_tokens,
                   KvDiskFingerprint(m.name, m.num_layers, m.num_kv_heads, m.head_dim, m.kv_dtype));
    if (tier.ok()) {
      ack.disk = *tier;
    } else {
      // KV still lives in DRAM: the pool serves, without a disk tier.
      LOG(ERROR) << "no disk tier: " << tier.status();
    }
  }
  {
    std::lock_guard<std::mutex> limits_lock(limits_mu_);
    limits_.max_rows = config.max_step_rows;
    limits_.row_min = 2 * dims_.kv_row_bytes();
    limits_.row_max = dims_.q_row_bytes() + limits_.row_min;
  }
  ready_.store(true);
  PublishKvLocked();
  return ack;
}

absl::StatusOr<std::vector<absl::Status>> MemoryServer::MoveKv(uint64_t epoch, uint64_t tier,
                                                               std::span<const KvMove> moves,
                                                               absl::Time deadline) {
  return disk_.Move(epoch, tier, moves, deadline);
}

NodeStatus MemoryServer::Status() const {
  // Never waits for attention or for a configuration in progress: heartbeats must flow.
  NodeStatus status;
  status.ready = ready_.load();
  status.kv_slots_total = kv_slots_.load();
  status.kv_slots_in_tables = kv_positions_.load();
  std::lock_guard<std::mutex> stats_lock(stats_mu_);
  status.steps_executed = stats_.steps;
  status.attention_us = static_cast<uint64_t>(stats_.attention_seconds * 1e6);
  status.layer_frames = stats_.layer_frames;
  status.bytes_received = stats_.bytes_received;
  status.bytes_sent = stats_.bytes_sent;
  status.checksum_failures = stats_.checksum_failures;
  status.malformed_frames = stats_.malformed_frames;
  return status;
}

MemoryServerStats MemoryServer::stats() const {
  MemoryServerStats out;
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    out = stats_;
  }
  out.kv_slots = kv_slots_.load();
  out.kv_positions = kv_positions_.load();
  out.tables = tables_.load();
  return out;
}

void MemoryServer::PublishKvLocked() {
  kv_slots_.store(engine_ ? engine_->store().num_slots() : 0);
  kv_positions_.store(engine_ ? engine_->num_assigned_positions() : 0);
  tables_.store(engine_ ? engine_->num_tables() : 0);
}

std::shared_ptr<std::vector<uint8_t>> MemoryServer::Buffer(size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    for (size_t i = 0; i < free_buffers_.size(); ++i) {
      if (free_buffers_[i]->capacity() >= bytes) {
        auto buffer = std::move(free_buffers_[i]);
        free_buffers_.erase(free_buffers_.begin() + i);
        buffer->resize(bytes);
        return buffer;
      }
    }
  }
  return std::make_shared<std::vector<uint8_t>>(bytes);
}

// Buffers are recycled by a deleter-free convention: whoever finishes with one hands it
// back through this lambda-friendly function.
static void Recycle(std::mutex& mu, std::vector<std::shared_ptr<std::vector<uint8_t>>>& pool,
                    std::shared_ptr<std::vector<uint8_t>> buffer) {
  if (buffer == nullptr || buffer.use_count() != 1 || buffer->capacity() > kMaxRecycled) return;
  std::lock_guard<std::mutex> lock(mu);
  if (pool.size() < 32) pool.push_back(std::move(buffer));
}

std::span<uint8_t> MemoryServer::Place(PeerId peer, std::span<const uint8_t> header_bytes,
                                       size_t payload_bytes) {
  FrameHeader header;
  if (!transport::ParseFrameHeader(header_bytes, &header).ok() ||
      header.kind != static_cast<uint16_t>(FrameKind::kLayer) ||
      header.payload_bytes != payload_bytes || !LayerClaimFits(header, payload_bytes).ok()) {
    return {};  // looked at in Deliver (the transport holds no more than kMaxSmallFrame)
  }
  if (!Hold(peer, payload_bytes)) return {};  // refused in Deliver
  auto buffer = Buffer(payload_bytes);
  std::span<uint8_t> span(buffer->data(), payload_bytes);
  placed_[buffer->data()] = std::move(buffer);
  return span;
}

uint64_t MemoryServer::HeldBudget() const {
  if (options_.max_held_bytes_per_peer != 0) return options_.max_held_bytes_per_peer;
  FrameLimits limits;
  {
    std::lock_guard<std::mutex> lock(limits_mu_);
    limits = limits_;
  }
  const uint64_t largest =
      limits.max_rows != 0 && limits.row_max != 0
          ? std::min<unsigned __int128>(
                static_cast<unsigned __int128>(limits.max_rows) * limits.row_max, kMaxPayload)
          : kMaxPayload;
  return std::max(kFramesPerPeer * largest, kMaxSmallFrame);
}

bool MemoryServer::Hold(PeerId peer, uint64_t bytes) {
  const uint64_t budget = HeldBudget();
  uint64_t held;
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    uint64_t& h = held_[peer];
    if (h + bytes > budget) {
      if (h == 0) held_.erase(peer);
      return false;
    }
    held = h += bytes;
  }
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_.held_bytes_peak = std::max(stats_.held_bytes_peak, held);
  return true;
}

void MemoryServer::Unhold(PeerId peer, uint64_t bytes) {
  if (bytes == 0) return;
  std::lock_guard<std::mutex> lock(pending_mu_);
  auto it = held_.find(peer);
  if (it == held_.end()) return;
  it->second -= std::min(it->second, bytes);
  if (it->second == 0) held_.erase(it);
}

uint64_t MemoryServer::MaxStepRows() const {
  std::lock_guard<std::mutex> lock(limits_mu_);
  return limits_.max_rows;
}

absl::Status MemoryServer::LayerClaimFits(const FrameHeader& header, size_t payload_bytes) const {
  FrameLimits limits;
  {
    std::lock_guard<std::mutex> lock(limits_mu_);
    limits = limits_;
  }
  if (limits.row_max == 0)
    return absl::FailedPreconditionError("a layer frame before configuration");
  const uint64_t rows = header.rows;
  if (rows == 0 || (limits.max_rows != 0 && rows > limits.max_rows)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a layer frame of ", rows, " rows; a step here has ",
                     limits.max_rows != 0 ? absl::StrCat("1 to ", limits.max_rows) : "at least 1"));
  }
  // In 128 bits: a configured row may be large, and no product may wrap.
  using Wide = unsigned __int128;
  const Wide low = Wide{rows} * limits.row_min;
  const Wide high = std::min<Wide>(Wide{rows} * limits.row_max, kMaxPayload);
  if (payload_bytes < low || payload_bytes > high) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a layer frame of ", rows, " rows and ", payload_bytes, " bytes; its rows fill ",
        static_cast<uint64_t>(std::min<Wide>(low, kMaxPayload + 1)), " to ",
        static_cast<uint64_t>(high), " bytes"));
  }
  return absl::OkStatus();
}

absl::Status MemoryServer::UnplacedLayerClaim(std::span<const uint8_t> header_bytes,
                                              size_t payload_bytes,
                                              const absl::Status& received) const {
  // Refused by Place, and here before a copy is made; the claim is also the better reason
  // when the transport dropped the payload. (A header that disagrees with the payload it
  // came with is reported as such in Handle.)
  FrameHeader header;
  if (!transport::ParseFrameHeader(header_bytes, &header).ok() ||
      header.kind != static_cast<uint16_t>(FrameKind::kLayer) ||
      (header.payload_bytes != payload_bytes && received.ok())) {
    return absl::OkStatus();
  }
  return LayerClaimFits(header, header.payload_bytes);
}

void MemoryServer::Deliver(PeerId from, std::span<const uint8_t> header,
                           std::span<const uint8_t> payload, absl::Status status) {
  Work work;
  work.peer = from;
  work.header.assign(header.begin(), header.end());
  work.status = std::move(status);
  auto it = placed_.find(payload.data());
  if (it != placed_.end() && payload.data() != nullptr) {
    work.payload = std::move(it->second);
    work.held = payload.size();  // counted by Place
    placed_.erase(it);
  } else if (absl::Status claim = UnplacedLayerClaim(header, payload.size(), work.status);
             !claim.ok()) {
    work.status = std::move(claim);
  } else if (work.status.ok() && payload.size() > kMaxSmallFrame) {
    work.status = absl::InvalidArgumentError(absl::StrCat("a frame of ", payload.size(),
                                                          " bytes that was not placed (at most ",
                                                          kMaxSmallFrame, " bytes are copied)"));
  } else if (work.status.ok() && !Hold(from, payload.size())) {
    {
      std::lock_guard<std::mutex> lock(stats_mu_);
      ++stats_.frames_over_budget;
    }
    work.status = absl::ResourceExhaustedError(
        absl::StrCat("a frame of ", payload.size(), " bytes while this peer's frames hold ",
                     HeldBudget(), " bytes here at most; it is refused, not queued"));
  } else if (work.status.ok()) {
    work.held = payload.size();
    work.payload = Buffer(payload.size());
    if (!payload.empty()) std::memcpy(work.payload->data(), payload.data(), payload.size());
  }
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    stats_.bytes_received += header.size() + payload.size();
  }
  Enqueue(std::move(work));
}

void MemoryServer::Enqueue(Work work) {
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    if (stop_) return;
    // Nothing ahead of it: run it here, saving the worker's wake-up.
    const bool run_inline = options_.run_on_transport_thread && pending_ == 0;
    ++pending_;
    if (run_inline) {
      inline_busy_ = true;
    } else {
      worker_.Post([this, work = std::move(work)]() mutable {
        {
          // In case the transport hands frames on from more than one thread.
          std::unique_lock<std::mutex> lock(pending_mu_);
          pending_cv_.wait(lock, [&] { return !inline_busy_; });
        }
        Finish(work, false);
      });
      return;
    }
  }
  Finish(work, true);
}

void MemoryServer::Finish(Work& work, bool is_inline) {
  bool stopping;
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    stopping = stop_ && !is_inline;
  }
  if (!stopping) Handle(work);
  Recycle(pool_mu_, free_buffers_, std::move(work.payload));
  Unhold(work.peer, work.held);
  std::lock_guard<std::mutex> lock(pending_mu_);
  --pending_;
  if (is_inline) inline_busy_ = false;
  pending_cv_.notify_all();
}

void MemoryServer::Handle(Work& work) {
  if (work.header.empty() && absl::IsCancelled(work.status)) {
    {
      std::lock_guard<std::mutex> lock(engine_mu_);
      peers_.erase(work.peer);  // the peer left: let go of its step
      for (auto it = endpoints_.begin(); it != endpoints_.end();) {
        it = it->second == work.peer ? endpoints_.erase(it) : std::next(it);
      }
      departed_.insert(work.peer);
    }
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.peers_left;
    return;
  }
  bool departed;
  {
    std::lock_guard<std::mutex> lock(engine_mu_);
    departed = departed_.count(work.peer) > 0;
  }
  if (departed) {
    // Held by the transport behind a payload still arriving when the peer went: its step
    // was let go of above, and applying it now would hold slot tables for ever.
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.departed_frames;
    return;
  }
  FrameHeader header;
  absl::Status status = transport::ParseFrameHeader(work.header, &header);
  if (status.ok()) status = work.status;
  const std::span<const uint8_t> payload =
      work.payload ? std::span<const uint8_t>(*work.payload) : std::span<const uint8_t>();
  if (status.ok()) {
    status = transport::CheckFramePayload(header, payload, options_.verify_checksums);
    if (!status.ok() && absl::IsDataLoss(status) && payload.size() == header.payload_bytes) {
      std::lock_guard<std::mutex> lock(stats_mu_);
      ++stats_.checksum_failures;
    }
  }
  if (!status.ok()) {
    LOG_FIRST_N(WARNING, 20) << "rejected a data-plane frame from peer " << work.peer << ": "
                             << status.message();
    {
      std::lock_guard<std::mutex> lock(stats_mu_);
      ++stats_.malformed_frames;
    }
    // Tell the sender, if the header says who to tell about, and fail the step it names.
    if (work.header.size() == sizeof(FrameHeader)) {
      std::memcpy(&header, work.header.data(), sizeof(header));
      PeerId reply;
      {
        std::lock_guard<std::mutex> lock(engine_mu_);
        PeerState* state = FindStepLocked(work.peer, header);
        if (state != nullptr) state->error = status;
        reply = ReplyPeerLocked(work.peer, header);
      }
      SendError(reply != 0 ? reply : work.peer, header, status);
    }
    return;
  }
  switch (static_cast<FrameKind>(header.kind)) {
    case FrameKind::kStep:
      HandleStep(work.peer, header, payload);
      return;
    case FrameKind::kLayer:
      HandleLayer(work.peer, header, payload);
      return;
    case FrameKind::kHello: {
      std::lock_guard<std::mutex> lock(engine_mu_);
      if (header.reserved != 0) endpoints_[header.reserved] = work.peer;
      return;
    }
    default: {
      std::lock_guard<std::mutex> lock(stats_mu_);
      ++stats_.malformed_frames;
    }
      SendError(
          work.peer, header,
          absl::InvalidArgumentError(absl::StrCat(
              "a memory node does not take ", transport::FrameKindName(header.kind), " frames")));
  }
}

void MemoryServer::HandleStep(PeerId peer, const FrameHeader& header,
                              std::span<const uint8_t> payload) {
  absl::Status error;
  PeerId reply = 0;
  {
    std::lock_guard<std::mutex> lock(engine_mu_);
    if (header.reserved != 0 && header.epoch != epoch_) {
      // A stale replica's step: it must not take the place of this epoch's step of that id.
      error = absl::FailedPreconditionError(
          absl::StrCat("step of epoch ", header.epoch, "; this memory node serves epoch ", epoch_));
      reply = ReplyPeerLocked(peer, header);
    } else {
      if (header.reserved != 0) {
        routed_.erase(header.step_id);
        while (routed_.size() >= kMaxRoutedSteps) {
          LOG(WARNING) << "let go of routed step " << routed_.begin()->first << " with "
                       << routed_.begin()->second.frames_left << " layer frames unanswered";
          routed_.erase(routed_.begin());
        }
      }
      PeerState& state = header.reserved != 0 ? routed_[header.step_id] : peers_[peer];
      state = PeerState();  // drop the previous step (and its hold on slot tables) first
      state.has_step = true;
      state.share.step_id = header.step_id;
      auto share = DecodeStepShare(payload);
      if (!share.ok()) {
        error = share.status();
      } else if (engine_ == nullptr) {
        error = absl::FailedPreconditionError("this memory node is not configured yet");
      } else if (share->epoch != epoch_ || header.epoch != epoch_) {
        error = absl::FailedPreconditionError(absl::StrCat(
            "step of epoch ", share->epoch, "; this memory node serves epoch ", epoch_));
      } else if (share->pool != pool_) {
        error = absl::InvalidArgumentError(
            absl::StrCat("step for pool ", share->pool, " reached pool ", pool_));
      } else if (share->num_layers != static_cast<uint32_t>(dims_.num_layers)) {
        error = absl::InvalidArgumentError(absl::StrCat(
            "step for a model of ", share->num_layers, " layers; this one has ", dims_.num_layers));
      } else if (const uint64_t max_rows = MaxStepRows();
                 max_rows != 0 && share->plan.rows.size() > max_rows) {
        error = absl::InvalidArgumentError(absl::StrCat(
            "step of ", share->plan.rows.size(), " rows; a step here has at most ", max_rows));
      } else if (share->step_id != header.step_id) {
        error = absl::InvalidArgumentError("step descriptor and frame header disagree on the step");
      } else {
        auto prepared = engine_->Prepare(share->plan);
        if (!prepared.ok()) {
          error = prepared.status();
        } else {
          state.share = std::move(*share);
          state.prepared = std::move(*prepared);
          state.layouts = LayoutMinibatches(state.share, dims_);
          state.frames_left = state.layouts.size() * static_cast<size_t>(dims_.num_layers);
          PublishKvLocked();
        }
      }
      state.error = error;
      reply = ReplyPeerLocked(peer, header);
      // A routed step with no rows (only slot-table changes) is done once applied.
      if (header.reserved != 0 && error.ok() && state.frames_left == 0) {
        routed_.erase(header.step_id);
      }
    }
  }
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.steps;
    if (!error.ok()) ++stats_.rejected_steps;
  }
  if (!error.ok()) {
    LOG_FIRST_N(WARNING, 20) << "rejected step " << header.step_id << " from peer " << peer << ": "
                             << error;
    SendError(reply != 0 ? reply : peer, header, error);
  }
}

void MemoryServer::HandleLayer(PeerId peer, const FrameHeader& header,
                               std::span<const uint8_t> payload) {
  // Layer-wise pre-loading: outside the engine lock (moves and other peers' steps go on),
  // wait until the step's loading requests have this layer in DRAM.
  absl::Status gate;
  {
    std::vector<uint64_t> tickets;
    {
      std::lock_guard<std::mutex> lock(engine_mu_);
      PeerState* found = FindStepLocked(peer, header);
      if (found != nullptr && header.layer < static_cast<uint32_t>(dims_.num_layers)) {
        for (const PendingLoad& l : found->share.plan.loads) tickets.push_back(l.ticket);
      }
    }
    if (!tickets.empty()) gate = disk_.gate().Wait(tickets, static_cast<int>(header.layer));
  }
  std::shared_ptr<std::vector<uint8_t>> reply;
  FrameHeader answer;
  absl::Status error;
  double seconds = 0;
  PeerId reply_peer = peer;
  {
    std::lock_guard<std::mutex> lock(engine_mu_);
    PeerState* found = FindStepLocked(peer, header);
    reply_peer = ReplyPeerLocked(peer, header);
    if (header.epoch != epoch_) {
      error = absl::FailedPreconditionError(absl::StrCat(
          "layer frame of epoch ", header.epoch, "; this memory node serves epoch ", epoch_));
    } else if (found == nullptr) {
      error = absl::FailedPreconditionError(
          absl::StrCat("layer frame of step ", header.step_id, " without its descriptor"));
    } else if (reply_peer == 0) {
      error = absl::FailedPreconditionError(absl::StrCat("layer frame of step ", header.step_id,
                                                         " routed to endpoint ", header.reserved,
                                                         ", which has not said hello here"));
    } else if (!found->error.ok()) {
      error = found->error;
    } else if (!gate.ok()) {
      error = gate;
      found->error = gate;
    } else {
      PeerState& state = *found;
      const MinibatchLayout* m =
          header.minibatch < state.layouts.size() ? &state.layouts[header.minibatch] : nullptr;
      if (header.layer >= static_cast<uint32_t>(dims_.num_layers)) {
        error = absl::InvalidArgumentError(
            absl::StrCat("layer ", header.layer, " of a ", dims_.num_layers, "-layer model"));
      } else if (m == nullptr) {
        error = absl::InvalidArgumentError(
            absl::StrCat("mini-batch ", header.minibatch, " of ", state.layouts.size()));
      } else if (header.rows != static_cast<uint32_t>(m->end - m->begin)) {
        error = absl::InvalidArgumentError(absl::StrCat("mini-batch ", header.minibatch, " has ",
                                                        header.rows, " rows; the descriptor says ",
                                                        m->end - m->begin));
      } else if (header.dtype != static_cast<uint16_t>(transport::FrameDType::kBF16)) {
        error = absl::InvalidArgumentError(
            absl::StrCat("rows of dtype ", header.dtype, "; this node stores bf16"));
      } else if (payload.size() != m->request_bytes()) {
        error = absl::InvalidArgumentError(absl::StrCat("layer frame of ", payload.size(),
                                                        " bytes; mini-batch ", header.minibatch,
                                                        " needs ", m->request_bytes()));
      } else {
        reply = Buffer(m->result_bytes());
        const auto* q = reinterpret_cast<const uint16_t*>(payload.data());
        const auto* k = reinterpret_cast<const uint16_t*>(payload.data() + m->q_bytes);
        const auto* v =
            reinterpret_cast<const uint16_t*>(payload.data() + m->q_bytes + m->kv_bytes);
        auto* out = reinterpret_cast<uint16_t*>(reply->data());
        auto* partial = reinterpret_cast<float*>(reply->data() + m->out_bytes);
        const Stopwatch watch;
        const absl::Time started = options_.trace != nullptr ? absl::Now() : absl::InfinitePast();
        absl::Status status = engine_->AttendRows(state.prepared, header.layer, m->begin, m->end, q,
                                                  k, v, out, m->partials > 0 ? partial : nullptr);
        seconds = watch.ElapsedSeconds();
        if (options_.trace != nullptr) {
          options_.trace->Add(
              static_cast<int>(peer),
              absl::StrCat("step ", header.step_id, " L", header.layer, " mb", header.minibatch),
              started, absl::Seconds(seconds));
        }
        if (!status.ok()) {
          error = status;
          state.error = error;
        }
        answer = header;
        answer.kind = static_cast<uint16_t>(FrameKind::kLayerResult);
        answer.payload_bytes = reply->size();
      }
    }
    // A routed step is let go once its last layer frame is answered, or at its first
    // error (its later frames then fail as frames without a descriptor).
    if (found != nullptr && header.reserved != 0 && header.epoch == epoch_ &&
        (!error.ok() || --found->frames_left == 0)) {
      routed_.erase(header.step_id);
    }
  }
  if (!error.ok()) {
    {
      std::lock_guard<std::mutex> lock(stats_mu_);
      ++stats_.malformed_frames;
    }
    LOG_FIRST_N(WARNING, 20) << "layer frame of step " << header.step_id << " from peer " << peer
                             << ": " << error;
    SendError(reply_peer != 0 ? reply_peer : peer, header, error);
    return;
  }
  answer.checksum = transport::PayloadChecksum(*reply);
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.layer_frames;
    stats_.rows += header.rows;
    stats_.attention_seconds += seconds;
    stats_.bytes_sent += sizeof(answer) + reply->size();
  }
  std::span<const uint8_t> body(*reply);
  transport_->Send(
      reply_peer, transport::kFrameTag, transport::AsBytes(answer), {body},
      [this, reply](absl::Status) mutable { Recycle(pool_mu_, free_buffers_, std::move(reply)); });
}

MemoryServer::PeerState* MemoryServer::FindStepLocked(PeerId peer, const FrameHeader& header) {
  if (header.reserved != 0) {
    auto it = routed_.find(header.step_id);
    return it == routed_.end() ? nullptr : &it->second;
  }
  auto it = peers_.find(peer);
  if (it == peers_.end() || !it->second.has_step || it->second.share.step_id != header.step_id) {
    return nullptr;
  }
  return &it->second;
}

PeerId MemoryServer::ReplyPeerLocked(PeerId peer, const FrameHeader& header) {
  if (header.reserved == 0) return peer;
  auto it = endpoints_.find(header.reserved);
  return it == endpoints_.end() ? 0 : it->second;
}

void MemoryServer::SendError(PeerId peer, const FrameHeader& about, const absl::Status& why) {
  auto text = std::make_shared<std::string>();
  const FrameHeader answer = transport::ErrorFrameHeader(about, why, text.get());
  const std::span<const uint8_t> body(reinterpret_cast<const uint8_t*>(text->data()), text->size());
  transport_->Send(peer, transport::kFrameTag, transport::AsBytes(answer), {body},
                   [text](absl::Status) {});
}

}  // namespace strata
