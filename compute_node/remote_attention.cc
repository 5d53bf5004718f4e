#include "compute_node/remote_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/base/stopwatch.h"
#include "kernels/cpu/attention.h"

namespace strata {
namespace {

using transport::FrameHeader;
using transport::FrameKind;
using transport::PeerId;

constexpr int kTile = kernels::kAttentionTileTokens;

}  // namespace

RemoteAttention::RemoteAttention(const ModelConfig& config, RemoteAttentionOptions options)
    : config_(config), options_(std::move(options)) {
  dims_ = {static_cast<int>(config.num_layers), static_cast<int>(config.num_heads),
           static_cast<int>(config.num_kv_heads), static_cast<int>(config.head_dim)};
}

absl::StatusOr<std::unique_ptr<RemoteAttention>> RemoteAttention::Create(
    const ModelConfig& config, RemoteAttentionOptions options) {
  if (options.minibatches < 1) return absl::InvalidArgumentError("mini-batches must be >= 1");
  if (options.endpoint != 0 && options.prefill_policy != PrefillPolicy::kMemory) {
    return absl::InvalidArgumentError(
        "a rotated lane leaves all attention to the memory nodes: prefill policy \"memory\"");
  }
  auto remote = std::unique_ptr<RemoteAttention>(new RemoteAttention(config, options));
  ASSIGN_OR_RETURN(remote->transport_, transport::Transport::Create(options.transport));
  RemoteAttention* self = remote.get();
  remote->transport_->SetHandler(transport::kFrameTag, self);
  remote->transport_->SetPeerHandler([self](PeerId peer, transport::PeerEvent event,
                                            const absl::Status& why) {
    if (event != transport::PeerEvent::kDisconnected) return;
    std::lock_guard<std::mutex> lock(self->mu_);
    if (!self->closing_) {
      LOG(WARNING) << "lost the data-plane connection to peer " << peer << ": " << why.message();
    }
    self->dead_peers_[peer] = true;
    self->cv_.notify_all();
    self->NotifySettledLocked();
  });
  LOG(INFO) << "disaggregated attention over " << remote->transport_->capabilities().ToString()
            << "; " << options.minibatches << " mini-batch(es) per memory node, prefill "
            << AbslUnparseFlag(options.prefill_policy);
  return remote;
}

RemoteAttention::~RemoteAttention() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
  }
  transport_.reset();
}

void RemoteAttention::NotifySettledLocked() {
  // While closing, the transport reports every peer gone, and what the callback wakes may
  // already be destroyed: its owner keeps it alive only while this object serves.
  if (options_.on_settled && !closing_) options_.on_settled();
}

void RemoteAttention::SetMemoryNodes(uint64_t epoch, const std::vector<MemoryNodeAddress>& nodes) {
  std::vector<PeerId> to_close;
  {
    std::lock_guard<std::mutex> lock(config_mu_);
    std::map<PoolIndex, Pool> next;
    for (const MemoryNodeAddress& node : nodes) {
      Pool pool;
      pool.name = node.name;
      pool.address = node.data_address;
      auto it = pools_.find(node.pool);
      if (it != pools_.end() && it->second.address == node.data_address && epoch == epoch_) {
        pool.peer = it->second.peer;  // unchanged: keep the connection
      }
      next[node.pool] = pool;
    }
    for (const auto& [index, pool] : pools_) {
      auto it = next.find(index);
      if (pool.peer != 0 && (it == next.end() || it->second.peer != pool.peer)) {
        to_close.push_back(pool.peer);
      }
    }
    pools_ = std::move(next);
    if (epoch != epoch_) {
      // Kept answers and step ids belong to the previous scheduler.
      std::lock_guard<std::mutex> state_lock(mu_);
      early_.clear();
      step_id_ = 0;
    }
    epoch_ = epoch;
    epoch_now_.store(epoch);
  }
  for (PeerId peer : to_close) transport_->Disconnect(peer);
}

RemoteAttentionStats RemoteAttention::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  RemoteAttentionStats s = stats_;
  s.lost_wakeups = transport_->LostWakeups();
  for (const auto& [peer, t] : peer_traffic_) {
    s.by_peer[t.name].sent += t.bytes.sent;
    s.by_peer[t.name].received += t.bytes.received;
  }
  return s;
}

absl::Status RemoteAttention::ConnectPool(PoolIndex index, Share& share) {
  // One connection per pool: the step thread and ConnectAll (Configure) may both try, and a
  // second connection would say hello too, taking the lane's routed answers from the first.
  std::lock_guard<std::mutex> connecting(connect_mu_);
  std::string address;
  {
    std::lock_guard<std::mutex> lock(config_mu_);
    auto it = pools_.find(index);
    if (it == pools_.end()) {
      return absl::UnavailableError(absl::StrCat("no memory node is known for pool ", index));
    }
    if (it->second.peer != 0) {
      bool dead;
      {
        std::lock_guard<std::mutex> state_lock(mu_);
        dead = dead_peers_.count(it->second.peer) > 0;
      }
      if (!dead) {
        share.peer = it->second.peer;
        return absl::OkStatus();
      }
      it->second.peer = 0;  // reconnect below
    }
    address = it->second.address;
  }
  auto peer = transport_->Connect(address);
  if (!peer.ok()) return peer.status();
  LOG(INFO) << "connected to memory node of pool " << index << " at " << address << ": "
            << transport_->DescribePeer(*peer);
  std::lock_guard<std::mutex> lock(config_mu_);
  auto it = pools_.find(index);
  if (it == pools_.end() || it->second.address != address) {
    transport_->Disconnect(*peer);
    return absl::UnavailableError(absl::StrCat("pool ", index, " changed while connecting"));
  }
  it->second.peer = *peer;
  share.peer = *peer;
  if (options_.endpoint != 0) {
    // Routed answers for this lane come on this connection.
    FrameHeader hello;
    hello.kind = static_cast<uint16_t>(FrameKind::kHello);
    hello.reserved = options_.endpoint;
    hello.checksum = transport::PayloadChecksum(std::span<const uint8_t>());
    transport_->Send(*peer, transport::kFrameTag, transport::AsBytes(hello), {},
                     [](absl::Status) {});
  }
  {
    std::lock_guard<std::mutex> state_lock(mu_);
    peer_traffic_[*peer].name =
        it->second.name.empty() ? absl::StrCat("pool-", index) : it->second.name;
  }
  return absl::OkStatus();
}

void RemoteAttention::FailShare(Share& share, const absl::Status& why, bool dead) {
  if (share.failed) return;
  share.failed = true;
  share.why = why;
  LOG(WARNING) << "step " << step_id_ << ": memory node of pool " << share.pool
               << (dead ? " is dead or hung: " : " failed its rows: ") << why << " ("
               << share.share.plan.rows.size() << " rows, " << share.share.plan.assignments.size()
               << " slot assignments, " << share.share.plan.releases.size() << " releases)";
  if (dead) {
    outcome_.dead_pools.push_back(share.pool);
    if (share.peer != 0) {
      transport_->Disconnect(share.peer);  // waits: no late payload lands after this
      std::lock_guard<std::mutex> lock(mu_);
      dead_peers_[share.peer] = true;
    }
  }
  std::vector<SequenceId> ids;
  for (const AttentionRowPlan& r : share.share.plan.rows) ids.push_back(r.request_id);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  for (SequenceId id : ids) {
    // The request may run again elsewhere: Unavailable, with the memory node's own status
    // (code and message) as the reason.
    outcome_.failed.emplace_back(
        id, absl::UnavailableError(
                absl::StrCat("memory node of pool ", share.pool, " failed: ", why.ToString())));
  }
}

void RemoteAttention::ConnectAll() {
  std::vector<PoolIndex> pools;
  {
    std::lock_guard<std::mutex> lock(config_mu_);
    for (const auto& [index, pool] : pools_) pools.push_back(index);
  }
  for (PoolIndex index : pools) {
    Share share;
    absl::Status status = ConnectPool(index, share);
    if (!status.ok()) LOG(WARNING) << "memory node of pool " << index << ": " << status;
  }
}

absl::Status RemoteAttention::BeginStep(const StepKvPlan& plan) {
  return StartStep(plan, /*send=*/true, /*reply_to=*/0);
}

absl::Status RemoteAttention::BeginRoutedStep(const StepKvPlan& plan, bool send_descriptors,
                                              uint64_t reply_to) {
  if (options_.endpoint == 0) return absl::FailedPreconditionError("this lane has no endpoint");
  return StartStep(plan, send_descriptors, reply_to);
}

absl::Status RemoteAttention::StartStep(const StepKvPlan& plan, bool send, uint64_t reply_to) {
  outcome_ = AttentionStepOutcome();
  shares_.clear();
  local_rows_.clear();
  local_slots_.clear();
  rows_ = static_cast<int>(plan.rows.size());
  uint64_t epoch;
  {
    std::lock_guard<std::mutex> lock(config_mu_);
    epoch = epoch_;
  }
  // One share per pool, in row order; pools with only table changes come after.
  std::map<PoolIndex, size_t> share_of_pool;
  auto share_for = [&](PoolIndex pool) -> Share& {
    auto it = share_of_pool.find(pool);
    if (it != share_of_pool.end()) return shares_[it->second];
    share_of_pool[pool] = shares_.size();
    Share share;
    share.pool = pool;
    share.share.step_id = plan.step_id;
    share.share.epoch = epoch;
    share.share.pool = pool;
    share.share.num_layers = static_cast<uint32_t>(dims_.num_layers);
    share.share.plan.step_id = plan.step_id;
    shares_.push_back(std::move(share));
    return shares_.back();
  };
  for (int i = 0; i < rows_; ++i) {
    const PoolIndex pool = plan.rows[i].pool;
    if (i > 0 && plan.rows[i - 1].pool != pool && share_of_pool.count(pool)) {
      return absl::InvalidArgumentError(
          absl::StrCat("step ", plan.step_id, ": rows of pool ", pool, " are not contiguous"));
    }
    Share& share = share_for(pool);
    if (share.share.plan.rows.empty()) share.first_row = i;
    share.share.plan.rows.push_back(plan.rows[i]);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    step_id_ = plan.step_id;  // under mu_: Deliver tells early answers by it
    pending_errors_.clear();
    expected_.clear();
    layer_ = -1;
    // Kept answers of older steps will never be wanted.
    std::erase_if(early_, [&](const Early& e) { return e.header.step_id < plan.step_id; });
  }
  for (const TableRelease& r : plan.releases) share_for(r.pool).share.plan.releases.push_back(r);
  for (const SlotAssignment& a : plan.assignments) {
    share_for(a.pool).share.plan.assignments.push_back(a);
  }
  // A pool's loads in progress matter only where its rows attend.
  for (const PendingLoad& l : plan.loads) {
    if (share_of_pool.count(l.pool)) share_for(l.pool).share.plan.loads.push_back(l);
  }

  // Tile limits of prefill chunks (runs of one request at consecutive positions).
  const bool split = options_.prefill_policy == PrefillPolicy::kSplit;
  for (Share& share : shares_) {
    std::vector<AttentionRowPlan>& rows = share.share.plan.rows;
    for (size_t a = 0; a < rows.size();) {
      size_t b = a + 1;
      while (b < rows.size() && rows[b].request_id == rows[a].request_id &&
             rows[b].position == rows[b - 1].position + 1) {
        ++b;
      }
      if (split && b - a >= 2) {
        const int32_t start = rows[a].position;
        const int32_t limit = (start + kTile - 1) / kTile;
        std::vector<int32_t> slots(rows[b - 1].position + 1, 0);
        for (size_t r = a; r < b; ++r) {
          slots[rows[r].position] = share.first_row + static_cast<int32_t>(r);
        }
        const size_t slot_index = local_slots_.size();
        local_slots_.push_back(std::move(slots));
        for (size_t r = a; r < b; ++r) {
          const int32_t tiles = kernels::AttentionNumTiles(rows[r].position + 1);
          if (limit == 0) {
            rows[r].tile_limit = 0;  // the memory node only stores it
          } else if (tiles <= limit) {
            rows[r].tile_limit = -1;
            continue;
          } else {
            rows[r].tile_limit = limit;
          }
          local_rows_.push_back(
              {share.first_row + static_cast<int>(r), rows[r].position, limit, slot_index});
        }
      }
      a = b;
    }
    // Mini-batches only pay where a transfer is long against a frame's fixed costs (a
    // wake-up on each side): small shares go whole.
    const int n = static_cast<int>(rows.size());
    const int count =
        std::max(1, std::min(options_.minibatches, n / std::max(1, options_.min_minibatch_rows)));
    share.share.minibatch_rows = SplitMinibatches(n, count);
    share.layouts = LayoutMinibatches(share.share, dims_);
  }

  // Connect and send each memory node its descriptor.
  for (Share& share : shares_) {
    absl::Status status = ConnectPool(share.pool, share);
    if (!status.ok() && share.share.plan.rows.empty() && share.share.plan.assignments.empty()) {
      share.failed = true;  // only releases, for a node that is gone with its KV: nothing to do
      continue;
    }
    if (!status.ok()) {
      FailShare(share, status, /*dead=*/true);
      continue;
    }
    if (!send) continue;
    auto body = std::make_shared<std::string>(EncodeStepShare(share.share));
    const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(body->data()),
                                         body->size());
    FrameHeader header;
    header.kind = static_cast<uint16_t>(FrameKind::kStep);
    header.step_id = plan.step_id;
    header.epoch = epoch;
    header.rows = static_cast<uint32_t>(share.share.plan.rows.size());
    header.reserved = reply_to;
    header.payload_bytes = bytes.size();
    header.checksum = transport::PayloadChecksum(bytes);
    const PeerId peer = share.peer;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.bytes_sent += sizeof(header) + bytes.size();
      if (auto t = peer_traffic_.find(peer); t != peer_traffic_.end()) {
        t->second.bytes.sent += sizeof(header) + bytes.size();
      }
    }
    outcome_.bytes_sent += sizeof(header) + bytes.size();
    transport_->Send(peer, transport::kFrameTag, transport::AsBytes(header), {bytes},
                     [this, body, peer](absl::Status s) {
                       if (s.ok()) return;
                       std::lock_guard<std::mutex> lock(mu_);
                       dead_peers_[peer] = true;
                       cv_.notify_all();
                       if (options_.on_settled) options_.on_settled();
                     });
  }
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.steps;
  return absl::OkStatus();
}

void RemoteAttention::RunLocal(const std::vector<const LocalRow*>& rows, BatchBuffers& b,
                               const float* states) {
  const int n = static_cast<int>(rows.size());
  if (n == 0) return;
  kernels::AttentionParams p;
  p.num_heads = dims_.num_heads;
  p.num_kv_heads = dims_.num_kv_heads;
  p.head_dim = dims_.head_dim;
  p.scale = 1.0f / std::sqrt(static_cast<float>(dims_.head_dim));  // as AttentionEngine
  p.kv_dtype = KvCacheType(config_);
  const size_t q_row = static_cast<size_t>(p.num_heads) * p.head_dim;
  const size_t state_row = static_cast<size_t>(p.num_heads) * (p.head_dim + 2);
  std::vector<uint16_t> q(n * q_row), out(n * q_row);
  std::vector<float> state(n * state_row);
  std::vector<kernels::AttentionRow> kernel_rows(n);
  for (int i = 0; i < n; ++i) {
    const LocalRow& r = *rows[i];
    std::memcpy(q.data() + i * q_row, b.q.data() + r.row * q_row, q_row * 2);
    kernel_rows[i].slots = local_slots_[r.slots].data();
    kernel_rows[i].kv_end = r.position + 1;
    kernel_rows[i].tile_begin = r.first_tile;
    kernel_rows[i].tile_end = kernels::AttentionNumTiles(r.position + 1);
  }
  if (states != nullptr) {
    std::memcpy(state.data(), states, state.size() * sizeof(float));
  } else {
    kernels::AttentionStateInit(p, n, state.data());
  }
  const int rc = kernels::AttentionFold(p, n, q.data(), kernel_rows.data(), b.k.data(), b.v.data(),
                                        state.data());
  CHECK_EQ(rc, 0) << "local attention over a prefill chunk";
  kernels::AttentionFinish(p, n, state.data(), out.data());
  for (int i = 0; i < n; ++i) {
    std::memcpy(b.attn.data() + rows[i]->row * q_row, out.data() + i * q_row, q_row * 2);
  }
}

absl::Status RemoteAttention::Attend(int layer, BatchBuffers& b, int64_t m) {
  RETURN_IF_ERROR(SendLayer(layer, b, m));
  return WaitLayer(layer, b, m);
}

absl::Status RemoteAttention::CheckRows(int64_t m) const {
  if (m == rows_) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("batch has ", m, " rows but the step plan ", rows_));
}

absl::Status RemoteAttention::SendLayer(int layer, BatchBuffers& b, int64_t m) {
  return SendLayerTo(layer, b, m, 0);
}

absl::Status RemoteAttention::SendLayerTo(int layer, BatchBuffers& b, int64_t m,
                                          uint64_t reply_to) {
  RETURN_IF_ERROR(CheckRows(m));
  const size_t q_row = dims_.q_row_bytes(), kv_row = dims_.kv_row_bytes();
  const auto* q_base = reinterpret_cast<const uint8_t*>(b.q.data());
  const auto* k_base = reinterpret_cast<const uint8_t*>(b.k.data());
  const auto* v_base = reinterpret_cast<const uint8_t*>(b.v.data());
  uint64_t epoch;
  {
    std::lock_guard<std::mutex> lock(config_mu_);
    epoch = epoch_;
  }
  if (reply_to == 0) {
    layer_watch_.Reset();
    expecting_routed_ = false;
  }
  // Register every answer before the first frame leaves: answers can be fast.
  struct Outgoing {
    size_t share;
    int minibatch;
    FrameHeader header;
    std::vector<std::span<const uint8_t>> parts;
  };
  std::vector<Outgoing> outgoing;
  FailSharesWithErrors();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (reply_to == 0) {
      ExpectLocked(layer);
      expected_deadline_ = absl::Now() + options_.layer_timeout;
    }
    for (size_t s = 0; s < shares_.size(); ++s) {
      Share& share = shares_[s];
      if (share.failed || share.share.plan.rows.empty()) continue;
      for (size_t j = 0; j < share.layouts.size(); ++j) {
        const MinibatchLayout& mb = share.layouts[j];
        const int r0 = share.first_row + mb.begin, r1 = share.first_row + mb.end;
        Outgoing out{s, static_cast<int>(j), {}, {}};
        // q of the rows that attend there, in runs of consecutive rows.
        for (int r = mb.begin; r < mb.end;) {
          if (share.share.plan.rows[r].tile_limit == 0) {
            ++r;
            continue;
          }
          int e = r + 1;
          while (e < mb.end && share.share.plan.rows[e].tile_limit != 0) ++e;
          out.parts.emplace_back(q_base + (share.first_row + r) * q_row, (e - r) * q_row);
          r = e;
        }
        out.parts.emplace_back(k_base + r0 * kv_row, (r1 - r0) * kv_row);
        out.parts.emplace_back(v_base + r0 * kv_row, (r1 - r0) * kv_row);
        FrameHeader& h = out.header;
        h.kind = static_cast<uint16_t>(FrameKind::kLayer);
        h.step_id = step_id_;
        h.epoch = epoch;
        h.layer = static_cast<uint32_t>(layer);
        h.minibatch = static_cast<uint32_t>(j);
        h.rows = static_cast<uint32_t>(r1 - r0);
        // The type of the rows' k and v (the KV cache's); q and the answers are bf16.
        h.dtype = static_cast<uint16_t>(transport::FrameDTypeOf(KvCacheType(config_)));
        h.payload_bytes = mb.request_bytes();
        h.reserved = reply_to;
        h.checksum = transport::PayloadChecksum(out.parts);
        outgoing.push_back(std::move(out));
      }
    }
  }
  for (Outgoing& out : outgoing) {
    const PeerId peer = shares_[out.share].peer;
    const size_t bytes = sizeof(FrameHeader) + out.header.payload_bytes;
    outcome_.bytes_sent += bytes;
    transport_->Send(peer, transport::kFrameTag, transport::AsBytes(out.header),
                     std::move(out.parts), [this, peer](absl::Status s) {
                       if (s.ok()) return;
                       std::lock_guard<std::mutex> lock(mu_);
                       dead_peers_[peer] = true;
                       cv_.notify_all();
                       if (options_.on_settled) options_.on_settled();
                     });
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.layer_frames += outgoing.size();
    for (const Outgoing& out : outgoing) {
      const uint64_t bytes = sizeof(FrameHeader) + out.header.payload_bytes;
      stats_.bytes_sent += bytes;
      auto t = peer_traffic_.find(shares_[out.share].peer);
      if (t != peer_traffic_.end()) t->second.bytes.sent += bytes;
    }
  }

  outcome_.send_us += layer_watch_.ElapsedMicros();
  // While the memory nodes work: chunks that this node attends entirely.
  std::vector<const LocalRow*> whole;
  for (const LocalRow& r : local_rows_) {
    if (r.first_tile == 0) whole.push_back(&r);
  }
  RunLocal(whole, b, nullptr);
  return absl::OkStatus();
}

void RemoteAttention::FailSharesWithErrors() {
  for (Share& share : shares_) {
    absl::Status why;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = pending_errors_.find(share.peer);
      if (share.peer != 0 && it != pending_errors_.end()) why = it->second;
    }
    if (!why.ok()) FailShare(share, why, /*dead=*/false);
  }
}

}  // namespace strata
