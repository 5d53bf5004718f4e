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
  // A layer frame parked for its loads (ParkForLoads) goes on once the gate moves.
  MemoryServer* resumer = server.get();
  server->disk_.gate().SetListener([resumer] {
    if (resumer->parked_count_.load() > 0) resumer->PostResume();
  });
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
    disk_.gate().SetListener(nullptr);
    std::unique_lock<std::mutex> lock(pending_mu_);
    stop_ = true;
    for (const auto& [peer, frames] : parked_) pending_ -= static_cast<int>(frames.size());
    parked_.clear();
    parked_count_ = 0;
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
  kernels::KvDType kv_dtype;
  if (std::string error; !ParseEnumName(m.kv_dtype, kernels::kKvDTypeNames, &kv_dtype, &error)) {
    return absl::InvalidArgumentError(absl::StrCat("KV dtype: ", error));
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
  store.dtype = kv_dtype;
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
                          engine_->store().config().dtype == store.dtype &&
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
  kv_frame_dtype_.store(static_cast<uint16_t>(transport::FrameDTypeOf(store.dtype)));
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
  out.parked_frames = parked_count_.load();
  out.inline_frames = inline_frames_.load();
  return out;
}

void MemoryServer::PublishKvLocked() {
  kv_slots_.store(engine_ ? engine_->store().num_slots() : 0);
  kv_positions_.store(engine_ ? engine_->num_assigned_positions() : 0);
  tables_.store(engine_ ? engine_->num_tables() : 0);
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
    Forget(work.peer);
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
  FrameHeader header = work.frame;
  absl::Status status = work.parsed;
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
    if (!work.over_budget) {
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
      HandleLayer(work.peer, header, payload, work.gate);
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
                               std::span<const uint8_t> payload, const absl::Status& gate) {
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
      } else if (header.dtype != kv_frame_dtype_.load()) {
        error = absl::InvalidArgumentError(absl::StrCat(
            "rows of dtype ", header.dtype, "; this node stores dtype ", kv_frame_dtype_.load()));
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
  transport_->Send(reply_peer, transport::kFrameTag, transport::AsBytes(answer), {body},
                   [this, reply](absl::Status) mutable { Recycle(std::move(reply)); });
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
