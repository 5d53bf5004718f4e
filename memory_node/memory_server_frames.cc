// Receiving a memory node's frames: buffers placed for layer frames whose claim fits, each
// peer's budget of bytes held, and the order frames run in (on the transport thread with
// nothing ahead, else on the worker; parked while their loads run). Handling them is in
// memory_server.cc.
#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "memory_node/memory_server.h"

namespace strata {
namespace {

using transport::FrameHeader;
using transport::FrameKind;
using transport::PeerId;

// A layer frame's payload is at most this big (a step of 16k rows of a large model is far
// below); larger claims are malformed.
constexpr uint64_t kMaxPayload = uint64_t{2} << 30;
// Buffers kept for reuse: a layer frame's size at most. A larger one goes back to the
// allocator, so that a peer's one-off giant frame does not stay resident.
constexpr size_t kMaxRecycled = size_t{64} << 20;
// The default budget of one peer's frames held at once, in its largest layer frames: a
// compute node's two lanes, two mini-batches each, and the frames of a step it gave up on
// still queued here, with room to spare.
constexpr uint64_t kFramesPerPeer = 8;
// The default budget of all peers' frames together, in peers' budgets: more than a compute
// node ever holds here in normal running is a fraction of its budget, so this many peers
// can each fill theirs (a stuck or flooding node) before frames of the others are refused.
constexpr uint64_t kPeersAtBudget = 4;

}  // namespace

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

void MemoryServer::Recycle(std::shared_ptr<std::vector<uint8_t>> buffer) {
  if (buffer == nullptr || buffer.use_count() != 1 || buffer->capacity() > kMaxRecycled) return;
  std::lock_guard<std::mutex> lock(pool_mu_);
  if (free_buffers_.size() < 32) free_buffers_.push_back(std::move(buffer));
}

std::span<uint8_t> MemoryServer::Place(PeerId peer, std::span<const uint8_t> header_bytes,
                                       size_t payload_bytes) {
  FrameHeader header;
  if (!transport::ParseFrameHeader(header_bytes, &header).ok() ||
      header.kind != static_cast<uint16_t>(FrameKind::kLayer) ||
      header.payload_bytes != payload_bytes || !LayerClaimFits(header, payload_bytes).ok()) {
    return {};  // looked at in Deliver (the transport holds no more than kMaxSmallFrame)
  }
  if (!Hold(peer, payload_bytes)) {
    // Refused in Deliver, whether the transport then holds a copy or drops the payload.
    refused_for_budget_.insert({peer, std::string(header_bytes.begin(), header_bytes.end())});
    return {};
  }
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

uint64_t MemoryServer::HeldBudgetAll(uint64_t per_peer) const {
  return options_.max_held_bytes != 0 ? options_.max_held_bytes : kPeersAtBudget * per_peer;
}

bool MemoryServer::Hold(PeerId peer, uint64_t bytes) {
  if (bytes == 0) return true;
  const uint64_t budget = HeldBudget();
  const uint64_t budget_all = HeldBudgetAll(budget);
  uint64_t held, held_all;
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    uint64_t& h = held_[peer];
    if (h + bytes > budget || held_all_ + bytes > budget_all) {
      if (h == 0) held_.erase(peer);
      return false;
    }
    held = h += bytes;
    held_all = held_all_ += bytes;
  }
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_.held_bytes_peak = std::max(stats_.held_bytes_peak, held);
  stats_.held_bytes_all_peak = std::max(stats_.held_bytes_all_peak, held_all);
  return true;
}

void MemoryServer::Unhold(PeerId peer, uint64_t bytes) {
  if (bytes == 0) return;
  std::lock_guard<std::mutex> lock(pending_mu_);
  auto it = held_.find(peer);
  if (it == held_.end()) return;
  const uint64_t freed = std::min(it->second, bytes);
  it->second -= freed;
  held_all_ -= freed;
  if (it->second == 0) held_.erase(it);
}

void MemoryServer::Forget(PeerId peer) { Unhold(peer, std::numeric_limits<uint64_t>::max()); }

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

absl::Status MemoryServer::UnplacedLayerClaim(const Work& work, size_t payload_bytes) const {
  // Refused by Place, and here before a copy is made; the claim is also the better reason
  // when the transport dropped the payload. (A header that disagrees with the payload it
  // came with is reported as such in Handle.)
  const FrameHeader& header = work.frame;
  if (!work.parsed.ok() || header.kind != static_cast<uint16_t>(FrameKind::kLayer) ||
      (header.payload_bytes != payload_bytes && work.status.ok())) {
    return absl::OkStatus();
  }
  return LayerClaimFits(header, header.payload_bytes);
}

void MemoryServer::Deliver(PeerId from, std::span<const uint8_t> header,
                           std::span<const uint8_t> payload, absl::Status status) {
  Work work;
  work.peer = from;
  work.header.assign(header.begin(), header.end());
  work.parsed = transport::ParseFrameHeader(header, &work.frame);
  work.status = std::move(status);
  auto it = placed_.find(payload.data());
  if (it != placed_.end() && payload.data() != nullptr) {
    work.payload = std::move(it->second);
    work.held = payload.size();  // counted by Place
    placed_.erase(it);
  } else if (absl::Status claim = UnplacedLayerClaim(work, payload.size()); !claim.ok()) {
    work.status = std::move(claim);
  } else if (refused_for_budget_.erase({from, std::string(header.begin(), header.end())}) > 0 ||
             (work.status.ok() && payload.size() <= kMaxSmallFrame &&
              !Hold(from, payload.size()))) {
    {
      std::lock_guard<std::mutex> lock(stats_mu_);
      ++stats_.frames_over_budget;
    }
    work.over_budget = true;
    const uint64_t budget = HeldBudget();
    work.status = absl::ResourceExhaustedError(
        absl::StrCat("a frame of ", payload.size(), " bytes while this peer's frames hold ", budget,
                     " bytes here at most, and all peers' ", HeldBudgetAll(budget),
                     "; it is refused, not queued"));
  } else if (work.status.ok() && payload.size() > kMaxSmallFrame) {
    work.status = absl::InvalidArgumentError(absl::StrCat("a frame of ", payload.size(),
                                                          " bytes that was not placed (at most ",
                                                          kMaxSmallFrame, " bytes are copied)"));
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
    // Nothing ahead of it but frames parked for their loads (a frame of their peers queues
    // behind them in Finish): run it here, saving the worker's wake-up. Not while a frame
    // runs here already (frames handed on from two threads), nor while the worker waits to
    // resume a parked frame (ResumeParked), which would wait behind every later one; a
    // frame it took counts as ahead until it is done.
    const bool run_inline = options_.run_on_transport_thread && !inline_busy_ && !resume_waiting_ &&
                            static_cast<size_t>(pending_) == parked_count_.load();
    ++pending_;
    if (run_inline) {
      inline_busy_ = true;
      ++inline_frames_;
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
    // Behind a parked frame of its peer it waits there, in order; so does the peer's
    // departure (frames it sent before it left are answered, as they were before parking:
    // a routed step's answer goes to another replica).
    if (auto it = parked_.find(work.peer); !stopping && it != parked_.end()) {
      it->second.push_back(std::move(work));
      ++parked_count_;
      LeftLocked(is_inline);
      return;
    }
  }
  if (!stopping && ParkForLoads(work)) {
    std::lock_guard<std::mutex> lock(pending_mu_);
    LeftLocked(is_inline);
    return;
  }
  if (!stopping) Handle(work);
  Done(work, is_inline);
}

void MemoryServer::Done(Work& work, bool is_inline) {
  Recycle(std::move(work.payload));
  Unhold(work.peer, work.held);
  std::lock_guard<std::mutex> lock(pending_mu_);
  --pending_;
  LeftLocked(is_inline);
}

void MemoryServer::LeftLocked(bool is_inline) {
  if (is_inline) inline_busy_ = false;
  pending_cv_.notify_all();
}

bool MemoryServer::ParkForLoads(Work& work) {
  const FrameHeader& header = work.frame;
  if (!work.status.ok() || !work.parsed.ok() ||
      header.kind != static_cast<uint16_t>(FrameKind::kLayer)) {
    return false;
  }
  std::vector<uint64_t> tickets;
  {
    std::lock_guard<std::mutex> lock(engine_mu_);
    PeerState* found = FindStepLocked(work.peer, header);
    // A departed peer's frame is dropped (Handle), not parked.
    if (found != nullptr && header.layer < static_cast<uint32_t>(dims_.num_layers) &&
        !departed_.contains(work.peer)) {
      for (const PendingLoad& l : found->share.plan.loads) {
        if (l.ticket != 0) tickets.push_back(l.ticket);
      }
    }
  }
  if (tickets.empty()) return false;
  LoadGate& gate = disk_.gate();
  const uint64_t generation = gate.generation();
  absl::Time wake;
  absl::StatusOr<bool> ready =
      gate.Poll(tickets, static_cast<int>(header.layer), &wake, /*owner=*/work.peer);
  const absl::Time now = absl::Now();
  if (!ready.ok() || *ready) {
    work.gate = ready.status();
    if (ready.ok()) gate.Record(std::max(now - work.parked_since, absl::ZeroDuration()));
    return false;
  }
  work.parked_since = std::min(work.parked_since, now);
  const PeerId peer = work.peer;
  bool arm = false;  // one timer, at the earliest time a parked frame's loads are given up on
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    if (stop_) {
      work.gate = absl::CancelledError("the memory node is stopping");
      return false;
    }
    parked_[peer].push_front(std::move(work));
    ++parked_count_;
    if (wake < next_wake_) {
      next_wake_ = wake;
      arm = true;
    }
  }
  // A change between the look and the parking would have found nothing parked to resume.
  if (gate.generation() != generation) PostResume();
  if (arm) {
    worker_.RunAt(wake, [this, wake] {
      {
        std::lock_guard<std::mutex> lock(pending_mu_);
        if (next_wake_ == wake) next_wake_ = absl::InfiniteFuture();
      }
      ResumeParked();
    });
  }
  return true;
}

void MemoryServer::PostResume() {
  if (!resume_posted_.exchange(true)) worker_.Post([this] { ResumeParked(); });
}

void MemoryServer::ResumeParked() {
  resume_posted_ = false;  // a change from here on posts another look
  std::vector<PeerId> peers;
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    for (const auto& [peer, frames] : parked_) peers.push_back(peer);
  }
  for (PeerId peer : peers) {
    for (;;) {
      Work work;
      {
        // Frames of other peers run inline while these are parked: one frame at a time on
        // either thread (attention would serialize on engine_mu_ anyway, with the worker's
        // team waiting on it). While this waits, new frames go to the worker (Enqueue).
        std::unique_lock<std::mutex> lock(pending_mu_);
        resume_waiting_ = true;
        pending_cv_.wait(lock, [&] { return !inline_busy_; });
        resume_waiting_ = false;
        auto it = parked_.find(peer);
        if (it == parked_.end()) break;
        if (it->second.empty() || stop_) {
          pending_ -= static_cast<int>(it->second.size());
          parked_count_ -= it->second.size();
          parked_.erase(it);
          pending_cv_.notify_all();
          break;
        }
        work = std::move(it->second.front());
        it->second.pop_front();
        --parked_count_;
      }
      if (ParkForLoads(work)) break;  // its layer is still on its way
      Handle(work);
      Done(work, false);
    }
  }
}

}  // namespace strata
