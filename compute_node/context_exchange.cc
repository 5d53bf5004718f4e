#include "compute_node/context_exchange.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/base/thread_name.h"

namespace strata {
namespace {

using transport::FrameHeader;
using transport::FrameKind;
using transport::PeerId;

}  // namespace

uint64_t RotationEndpoint(const std::string& address, int batch) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over the address
  for (unsigned char c : address) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return (h << 8) | static_cast<uint64_t>((batch + 1) & 0xFF);  // never zero
}

absl::StatusOr<std::unique_ptr<ContextExchange>> ContextExchange::Create(
    ContextExchangeOptions options) {
  if (options.hidden <= 0) return absl::InvalidArgumentError("context rows need a hidden size");
  auto exchange = std::unique_ptr<ContextExchange>(new ContextExchange(std::move(options)));
  ASSIGN_OR_RETURN(exchange->transport_,
                   transport::Transport::Create(exchange->options_.transport));
  ContextExchange* self = exchange.get();
  exchange->transport_->SetHandler(transport::kFrameTag, self);
  exchange->transport_->SetPeerHandler(
      [self](PeerId peer, transport::PeerEvent event, const absl::Status& why) {
        if (event != transport::PeerEvent::kDisconnected) return;
        {
          std::lock_guard<std::mutex> lock(self->mu_);
          for (auto it = self->peers_.begin(); it != self->peers_.end();) {
            it = it->second == peer ? self->peers_.erase(it) : std::next(it);
          }
          if (auto it = self->inbound_.find(peer); it != self->inbound_.end()) {
            self->departed_.insert(it->second);
            self->inbound_.erase(it);
          }
        }
        LOG(WARNING) << "context exchange: peer " << peer << " left: " << why.message();
        if (self->options_.on_arrival) self->options_.on_arrival();
      });
  ASSIGN_OR_RETURN(exchange->address_,
                   exchange->transport_->Listen(exchange->options_.listen_address));
  return exchange;
}

ContextExchange::~ContextExchange() {
  std::list<ConnectThread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    threads = std::move(connect_threads_);
  }
  connect_cv_.notify_all();
  // An attempt at a hung replica would last until the connect timeout: cut short.
  if (transport_ != nullptr) transport_->AbortConnects();
  for (ConnectThread& t : threads) t.thread.join();
  transport_.reset();
}

void ContextExchange::SetEpoch(uint64_t epoch) {
  std::lock_guard<std::mutex> lock(mu_);
  if (epoch != epoch_) {
    held_.clear();
    retired_.clear();
    departed_through_.clear();  // the previous scheduler's step ids
    departure_order_.clear();
  }
  epoch_ = epoch;
}

absl::StatusOr<PeerId> ContextExchange::PeerFor(const std::string& address, uint64_t step_id) {
  std::unique_lock<std::mutex> lock(mu_);
  std::shared_ptr<Attempt> attempt;  // the one this call waits for
  for (;;) {
    if (auto it = peers_.find(address); it != peers_.end()) return it->second;
    if (attempt != nullptr && attempt->done) {
      return absl::UnavailableError(
          absl::StrCat("cannot reach the compute replica at ", address, ": ",
                       attempt->status.ok() ? "its connection closed" : attempt->status.message()));
    }
    if (DeclaredDeadLocked(address, step_id)) {
      return absl::UnavailableError(absl::StrCat("cannot reach the compute replica at ", address,
                                                 ": the scheduler declared it dead"));
    }
    if (stopping_) return absl::UnavailableError("the context exchange is stopping");
    if (attempt == nullptr) {
      std::shared_ptr<Attempt>& slot = connecting_[address];
      if (slot == nullptr) {
        for (auto it = connect_threads_.begin(); it != connect_threads_.end();) {
          if (it->attempt->done) {
            it->thread.join();  // done, and on its way out
            it = connect_threads_.erase(it);
          } else {
            ++it;
          }
        }
        slot = std::make_shared<Attempt>();
        connect_threads_.push_back({std::thread([this, address, a = slot] {
                                      SetCurrentThreadName("ctx-connect");
                                      ConnectTo(address, a);
                                    }),
                                    slot});
      }
      attempt = slot;
      continue;
    }
    connect_cv_.wait(lock);
  }
}

void ContextExchange::ConnectTo(const std::string& address, std::shared_ptr<Attempt> attempt) {
  auto peer = transport_->Connect(address);
  if (peer.ok()) {
    // The other side learns who this is: once this connection closes, what this replica
    // owed it will not come (Departed).
    FrameHeader hello;
    hello.kind = static_cast<uint16_t>(FrameKind::kHello);
    SendText(*peer, hello, std::make_shared<const std::string>(address_));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (peer.ok()) peers_[address] = *peer;
    attempt->done = true;
    attempt->status = peer.status();
    if (auto it = connecting_.find(address); it != connecting_.end() && it->second == attempt) {
      connecting_.erase(it);
    }
  }
  connect_cv_.notify_all();
}

FrameHeader ContextExchange::HeaderOf(uint64_t step_id, int slice, int batch, int64_t rows,
                                      size_t failed_pools, std::span<const uint8_t> body) {
  FrameHeader h;
  h.kind = static_cast<uint16_t>(FrameKind::kContext);
  h.step_id = step_id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    h.epoch = epoch_;
    ++stats_.sent;
    stats_.bytes_sent += sizeof(h) + body.size();
  }
  h.layer = static_cast<uint32_t>(slice);
  h.minibatch = static_cast<uint32_t>(batch);
  h.rows = static_cast<uint32_t>(rows);
  h.flags = static_cast<uint16_t>(failed_pools);
  h.dtype = static_cast<uint16_t>(transport::FrameDType::kF32);
  h.payload_bytes = body.size();
  h.checksum = transport::PayloadChecksum(body);
  return h;
}

absl::Status ContextExchange::Send(const std::string& to, uint64_t step_id, int slice, int batch,
                                   const float* x, int64_t m,
                                   std::span<const PoolIndex> failed_pools) {
  if (failed_pools.size() > kMaxFailedPools) {
    return absl::InvalidArgumentError(absl::StrCat("a context naming ", failed_pools.size(),
                                                   " failed pools; at most ", kMaxFailedPools));
  }
  RETURN_IF_ERROR(CheckNotDeclaredDead(to, step_id));
  ASSIGN_OR_RETURN(const PeerId peer, PeerFor(to, step_id));
  static_assert(sizeof(float) == sizeof(uint32_t));
  auto body = std::make_shared<std::vector<float>>(m * options_.hidden + failed_pools.size());
  std::memcpy(body->data(), x, m * options_.hidden * sizeof(float));
  for (size_t i = 0; i < failed_pools.size(); ++i) {
    const uint32_t pool = failed_pools[i].value();
    std::memcpy(body->data() + m * options_.hidden + i, &pool, sizeof(pool));
  }
  const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(body->data()),
                                       body->size() * sizeof(float));
  const FrameHeader h = HeaderOf(step_id, slice, batch, m, failed_pools.size(), bytes);
  transport_->Send(peer, transport::kFrameTag, transport::AsBytes(h), {bytes},
                   [body](absl::Status) {});
  return absl::OkStatus();
}

absl::Status ContextExchange::SendFailure(const std::string& to, uint64_t step_id, int slice,
                                          int batch, const absl::Status& why) {
  RETURN_IF_ERROR(CheckNotDeclaredDead(to, step_id));
  ASSIGN_OR_RETURN(const PeerId peer, PeerFor(to, step_id));
  auto text = std::make_shared<std::string>();
  const FrameHeader h =
      transport::ErrorFrameHeader(HeaderOf(step_id, slice, batch, 0, 0, {}), why, text.get());
  SendText(peer, h, std::move(text));
  return absl::OkStatus();
}

void ContextExchange::SendText(PeerId peer, FrameHeader h,
                               std::shared_ptr<const std::string> text) {
  const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(text->data()),
                                       text->size());
  h.payload_bytes = bytes.size();
  h.checksum = transport::PayloadChecksum(bytes);
  transport_->Send(peer, transport::kFrameTag, transport::AsBytes(h), {bytes},
                   [text = std::move(text)](absl::Status) {});
}

bool ContextExchange::Arrived(int batch, uint64_t step_id, int slice) const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_.count({batch, step_id, slice}) > 0;
}

bool ContextExchange::Departed(const std::string& address, uint64_t step_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return departed_.contains(address) || DeclaredDeadLocked(address, step_id);
}

bool ContextExchange::DeclaredDeadLocked(const std::string& address, uint64_t step_id) const {
  auto it = departed_through_.find(address);
  return it != departed_through_.end() && step_id <= it->second;
}

absl::Status ContextExchange::CheckNotDeclaredDead(const std::string& to, uint64_t step_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!DeclaredDeadLocked(to, step_id)) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("cannot reach the compute replica at ", to, ": the scheduler declared it dead"));
}

void ContextExchange::Depart(const std::string& address, uint64_t through_step) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto [it, added] = departed_through_.try_emplace(address, through_step);
    if (added) {
      departure_order_.push_back(address);
      if (departure_order_.size() > kMaxDepartures) {
        departed_through_.erase(departure_order_.front());
        departure_order_.pop_front();
      }
    } else if (through_step > it->second) {
      it->second = through_step;
    } else {
      return;  // known already (the scheduler sends its whole list with each configuration)
    }
  }
  connect_cv_.notify_all();  // a caller waiting to connect to it gives up
  LOG(WARNING) << "context exchange: the scheduler declared the replica at " << address
               << " dead; its contexts of steps up to " << through_step << " will not come";
  if (options_.on_arrival) options_.on_arrival();
}

bool ContextExchange::FailureArrived(int batch, uint64_t step_id, int slice) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = held_.find({batch, step_id, slice});
  return it != held_.end() && !it->second.failed.ok();
}

bool ContextExchange::ArrivedWithFailedPools(int batch, uint64_t step_id, int slice) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = held_.find({batch, step_id, slice});
  return it != held_.end() && !it->second.failed_pools.empty();
}

absl::Status ContextExchange::Take(int batch, uint64_t step_id, int slice, float* x, int64_t m,
                                   Taken* taken) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = held_.find({batch, step_id, slice});
  if (it == held_.end()) {
    return absl::NotFoundError(absl::StrCat("no context of slice ", slice, " of step ", step_id));
  }
  Held held = std::move(it->second);
  held_.erase(it);
  if (!held.failed.ok()) return held.failed;
  if (held.rows != static_cast<uint64_t>(m)) {
    return absl::DataLossError(absl::StrCat("the context of slice ", slice, " of step ", step_id,
                                            " has ", held.rows, " rows; the plan has ", m));
  }
  std::memcpy(x, held.x.data(), held.x.size() * sizeof(float));
  taken->failed_pools = std::move(held.failed_pools);
  taken->arrived = held.arrived;
  return absl::OkStatus();
}

void ContextExchange::Retire(int batch, uint64_t step_id) {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t& last = retired_[batch];
  last = std::max(last, step_id);
  for (auto it = held_.begin(); it != held_.end();) {
    const auto& [b, step, slice] = it->first;
    it = b == batch && step <= last ? held_.erase(it) : std::next(it);
  }
}

ContextExchangeStats ContextExchange::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

std::span<uint8_t> ContextExchange::Place(PeerId, std::span<const uint8_t>, size_t) {
  return {};  // kept by the transport until Deliver has checked the frame
}

void ContextExchange::Deliver(PeerId from, std::span<const uint8_t> header_bytes,
                              std::span<const uint8_t> payload, absl::Status status) {
  FrameHeader h;
  absl::Status why = transport::ParseFrameHeader(header_bytes, &h);
  if (why.ok()) why = status;
  // The address the replica at the other end listens at, of at most kMaxHelloBytes.
  if (why.ok() && h.kind == static_cast<uint16_t>(FrameKind::kHello)) {
    if (h.payload_bytes > kMaxHelloBytes) {
      why = absl::InvalidArgumentError(
          absl::StrCat("a hello of ", h.payload_bytes, " bytes at a context exchange"));
    }
    if (why.ok()) why = transport::CheckFramePayload(h, payload, options_.verify_checksums);
    std::lock_guard<std::mutex> lock(mu_);
    if (!why.ok()) {
      ++stats_.rejected;
      LOG_FIRST_N(WARNING, 20) << "rejected a hello from peer " << from << ": " << why.message();
      return;
    }
    const std::string address(payload.begin(), payload.end());
    inbound_[from] = address;
    departed_.erase(address);  // a replica back at the same address
    return;
  }
  // A failure in place of a context: its text, of at most kMaxErrorText bytes.
  const bool failure = why.ok() && h.kind == static_cast<uint16_t>(FrameKind::kError);
  if (why.ok() && !failure && h.kind != static_cast<uint16_t>(FrameKind::kContext)) {
    why = absl::InvalidArgumentError(
        absl::StrCat("a ", transport::FrameKindName(h.kind), " frame at a context exchange"));
  }
  if (why.ok() && failure && h.payload_bytes > transport::kMaxErrorText) {
    why = absl::InvalidArgumentError(
        absl::StrCat("a failure of ", h.payload_bytes, " bytes at a context exchange"));
  }
  // Rows of floats, then `flags` pool ids.
  const uint64_t row_bytes = static_cast<uint64_t>(h.rows) * options_.hidden * 4;
  if (why.ok() && !failure &&
      (h.dtype != static_cast<uint16_t>(transport::FrameDType::kF32) || h.flags > kMaxFailedPools ||
       h.payload_bytes != row_bytes + uint64_t{h.flags} * 4)) {
    why = absl::InvalidArgumentError(absl::StrCat("a context of ", h.rows, " rows and ", h.flags,
                                                  " failed pools in ", h.payload_bytes,
                                                  " bytes of dtype ", h.dtype));
  }
  if (why.ok()) why = transport::CheckFramePayload(h, payload, options_.verify_checksums);
  bool notify = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.bytes_received += header_bytes.size() + payload.size();
    if (!why.ok()) {
      ++stats_.rejected;
      LOG_FIRST_N(WARNING, 20) << "rejected a context frame from peer " << from << ": "
                               << why.message();
      return;
    }
    auto retired = retired_.find(static_cast<int>(h.minibatch));
    if (h.epoch != epoch_ || (retired != retired_.end() && h.step_id <= retired->second)) {
      ++stats_.stale;
      LOG_FIRST_N(WARNING, 20) << "dropped a stale context frame (step " << h.step_id << ", epoch "
                               << h.epoch << ") from peer " << from;
      return;
    }
    if (held_.size() >= kMaxHeld) {
      auto oldest = held_.begin();
      for (auto it = held_.begin(); it != held_.end(); ++it) {
        if (it->second.arrival < oldest->second.arrival) oldest = it;
      }
      ++stats_.stale;
      LOG_FIRST_N(WARNING, 20) << "dropped the context of step " << std::get<1>(oldest->first)
                               << ": more than " << kMaxHeld << " held";
      held_.erase(oldest);
    }
    Held& held = held_[{static_cast<int>(h.minibatch), h.step_id, static_cast<int>(h.layer)}];
    held.arrival = ++arrivals_;
    held.arrived = absl::Now();
    if (failure) {
      held.failed = transport::ErrorFrameStatus(h, payload);
    } else {
      held.rows = h.rows;
      held.x.resize(static_cast<size_t>(h.rows) * options_.hidden);
      if (row_bytes > 0) std::memcpy(held.x.data(), payload.data(), row_bytes);
      for (uint16_t i = 0; i < h.flags; ++i) {
        uint32_t pool;
        std::memcpy(&pool, payload.data() + row_bytes + 4 * i, sizeof(pool));
        held.failed_pools.push_back(PoolIndex(pool));
      }
    }
    ++stats_.received;
    notify = true;
  }
  if (notify && options_.on_arrival) options_.on_arrival();
}

}  // namespace strata
