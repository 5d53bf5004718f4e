// RemoteAttention's answers: registering what a layer waits for, receiving it (the
// transport thread's Place and Deliver, answers kept for a step not begun yet), and merging
// it into the batch once the layer is settled. Steps and sends are in remote_attention.cc.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/base/stopwatch.h"
#include "compute_node/remote_attention.h"

namespace strata {
namespace {

using transport::FrameHeader;
using transport::FrameKind;
using transport::PeerId;

}  // namespace

void RemoteAttention::ExpectLocked(int layer) {
  layer_ = layer;
  expected_.clear();
  for (size_t s = 0; s < shares_.size(); ++s) {
    const Share& share = shares_[s];
    if (share.failed || share.share.plan.rows.empty()) continue;
    for (size_t j = 0; j < share.layouts.size(); ++j) {
      const MinibatchLayout& mb = share.layouts[j];
      Expected e;
      e.share = s;
      e.minibatch = static_cast<int>(j);
      e.peer = share.peer;
      // Never b.attn itself: an answer that arrives after the wait gave up (a timeout,
      // AbandonStep) would land in rows that are by then another step's.
      e.staging = std::make_shared<std::vector<uint8_t>>(mb.result_bytes());
      e.dest = {e.staging->data(), e.staging->size()};
      expected_.push_back(std::move(e));
    }
  }
}

absl::Status RemoteAttention::ExpectLayer(int layer, BatchBuffers& b, int64_t m) {
  RETURN_IF_ERROR(CheckRows(m));
  FailSharesWithErrors();
  expecting_routed_ = true;
  std::lock_guard<std::mutex> lock(mu_);
  layer_watch_.Reset();
  expected_deadline_ = absl::Now() + options_.layer_timeout;
  ExpectLocked(layer);
  // Answers that came before this lane knew the step.
  std::vector<Early> replay;
  std::erase_if(early_, [&](Early& e) {
    if (e.header.step_id != step_id_ ||
        (e.header.kind == static_cast<uint16_t>(FrameKind::kLayerResult) &&
         static_cast<int>(e.header.layer) != layer)) {
      return false;
    }
    replay.push_back(std::move(e));
    return true;
  });
  for (const Early& e : replay) DeliverLocked(e.from, e.header, e.payload, e.status);
  return absl::OkStatus();
}

bool RemoteAttention::LayerSettled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return LayerSettledLocked() || absl::Now() >= expected_deadline_;
}

thread_local const RemoteAttention* RemoteAttention::polling_ = nullptr;

absl::Status RemoteAttention::WaitLayer(int layer, BatchBuffers& b, int64_t m) {
  RETURN_IF_ERROR(CheckRows(m));
  const size_t q_row = dims_.q_row_bytes();
  auto* attn_base = reinterpret_cast<uint8_t*>(b.attn.data());
  // Wait for every answer, a dead peer, or the deadline.
  const Stopwatch wait_watch;
  std::vector<Expected> answers;
  // The deadline counts from the layer's first send: with two batches in flight the other
  // lane's stage ran in between.
  absl::Time until;
  {
    std::lock_guard<std::mutex> lock(mu_);
    until = expected_deadline_;
  }
  auto left = [&] { return std::max(absl::ZeroDuration(), until - absl::Now()); };
  if (options_.answer_spin > absl::ZeroDuration()) {
    // Answers due within microseconds: taken off the worker here, without the two wake-ups
    // (the transport thread's, then this thread's) that sleeping would cost.
    polling_ = this;
    transport_->ProgressUntil(
        [this] {
          std::lock_guard<std::mutex> lock(mu_);
          return LayerSettledLocked();
        },
        absl::Now() + std::min(options_.answer_spin, left()));
    polling_ = nullptr;
  }
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, absl::ToChronoNanoseconds(left()), [&] { return LayerSettledLocked(); });
    answers = std::move(expected_);
    expected_.clear();
    layer_ = -1;
    expected_deadline_ = absl::InfiniteFuture();
  }
  outcome_.wait_us += wait_watch.ElapsedMicros();
  if (options_.on_layer_round_trip) {
    options_.on_layer_round_trip(layer_watch_.ElapsedSeconds());
  }
  const Stopwatch merge_watch;

  for (const Expected& e : answers) {
    Share& share = shares_[e.share];
    if (share.failed) continue;
    bool dead_peer;
    {
      std::lock_guard<std::mutex> lock(mu_);
      dead_peer = dead_peers_.count(e.peer) > 0;
    }
    if (!e.arrived) {
      if (dead_peer) {
        FailShare(share, absl::UnavailableError("the connection closed"), /*dead=*/true);
      } else {
        {
          std::lock_guard<std::mutex> lock(mu_);
          ++stats_.timeouts;
        }
        // Answers routed here come after other replicas' slices: a replica that failed
        // upstream looks the same as a hung memory node, so a routed wait that times out
        // does not declare the memory node dead (its connection or heartbeats will).
        FailShare(
            share,
            absl::DeadlineExceededError(absl::StrCat(
                "no answer for layer ", layer, " within ",
                absl::FormatDuration(options_.layer_timeout),
                expecting_routed_ ? " (sent by another replica, which may have failed)" : "")),
            /*dead=*/!expecting_routed_);
      }
    } else if (!e.status.ok()) {
      FailShare(share, e.status, /*dead=*/false);
    } else {
      outcome_.bytes_received += sizeof(FrameHeader) + e.dest.size();
    }
  }

  // Scatter outputs and continue partial rows; zero the rows of failed shares.
  std::vector<int> local_of_row(rows_, -1);
  for (size_t i = 0; i < local_rows_.size(); ++i) local_of_row[local_rows_[i].row] = i;
  std::vector<const LocalRow*> continued;
  std::vector<float> states;
  const size_t state_row = dims_.state_row_bytes();
  for (const Expected& e : answers) {
    Share& share = shares_[e.share];
    const MinibatchLayout& mb = share.layouts[e.minibatch];
    if (share.failed) {
      std::memset(attn_base + (share.first_row + mb.begin) * q_row, 0, (mb.end - mb.begin) * q_row);
      continue;
    }
    int finals = 0, partials = 0;
    for (int r = mb.begin; r < mb.end; ++r) {
      const int32_t limit = share.share.plan.rows[r].tile_limit;
      const int row = share.first_row + r;
      if (limit < 0) {
        std::memcpy(attn_base + row * q_row, e.dest.data() + finals++ * q_row, q_row);
      } else if (limit > 0) {
        const auto* s =
            reinterpret_cast<const float*>(e.dest.data() + mb.out_bytes + partials++ * state_row);
        states.insert(states.end(), s, s + state_row / sizeof(float));
        continued.push_back(&local_rows_[local_of_row[row]]);
      }
    }
  }
  RunLocal(continued, b, states.empty() ? nullptr : states.data());
  // Rows of failed shares that this node computed itself are still meaningless.
  for (const Share& share : shares_) {
    if (!share.failed) continue;
    for (size_t r = 0; r < share.share.plan.rows.size(); ++r) {
      std::memset(attn_base + (share.first_row + r) * q_row, 0, q_row);
    }
  }
  outcome_.merge_us += merge_watch.ElapsedMicros();
  return absl::OkStatus();
}

std::vector<PoolIndex> RemoteAttention::FailedPools() const {
  std::vector<PoolIndex> pools;
  for (const Share& share : shares_) {
    if (share.failed && !share.share.plan.rows.empty()) pools.push_back(share.pool);
  }
  return pools;
}

void RemoteAttention::FailPools(std::span<const PoolIndex> pools, const absl::Status& why) {
  for (Share& share : shares_) {
    if (!share.share.plan.rows.empty() &&
        std::find(pools.begin(), pools.end(), share.pool) != pools.end()) {
      FailShare(share, why, /*dead=*/false);
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(expected_, [&](const Expected& e) { return shares_[e.share].failed; });
}

void RemoteAttention::AbandonStep() {
  std::lock_guard<std::mutex> lock(mu_);
  expected_.clear();
  layer_ = -1;
  expected_deadline_ = absl::InfiniteFuture();
}

void RemoteAttention::ContextArrivedAt(absl::Time when) {
  std::lock_guard<std::mutex> lock(mu_);
  if (layer_ >= 0) expected_deadline_ = std::max(expected_deadline_, when + options_.layer_timeout);
}

absl::Time RemoteAttention::LayerDeadline() const {
  std::lock_guard<std::mutex> lock(mu_);
  return expected_deadline_;
}

bool RemoteAttention::LayerSettledLocked() const {
  for (const Expected& e : expected_) {
    if (!e.arrived && !dead_peers_.count(e.peer)) return false;
  }
  return true;
}

AttentionStepOutcome RemoteAttention::EndStep() {
  AttentionStepOutcome out = std::move(outcome_);
  outcome_ = AttentionStepOutcome();
  std::sort(out.dead_pools.begin(), out.dead_pools.end());
  out.dead_pools.erase(std::unique(out.dead_pools.begin(), out.dead_pools.end()),
                       out.dead_pools.end());
  return out;
}

std::span<uint8_t> RemoteAttention::Place(PeerId from, std::span<const uint8_t> header_bytes,
                                          size_t payload_bytes) {
  FrameHeader h;
  if (!transport::ParseFrameHeader(header_bytes, &h).ok() ||
      h.kind != static_cast<uint16_t>(FrameKind::kLayerResult)) {
    return {};
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (h.step_id != step_id_ || static_cast<int>(h.layer) != layer_) return {};
  for (Expected& e : expected_) {
    // Once only (not while the transport holds it already): a second frame for the same
    // answer gets a buffer of the transport's. Delivered, it has arrived.
    if (e.peer == from && e.minibatch == static_cast<int>(h.minibatch) && !e.arrived &&
        !placed_.contains(e.dest.data()) && e.dest.size() == payload_bytes && payload_bytes > 0) {
      // The transport writes there until it delivers the frame, which may be after the
      // wait has given up on it: the buffer is kept until then.
      placed_.emplace(e.dest.data(), e.staging);
      return e.dest;
    }
  }
  return {};
}

void RemoteAttention::Deliver(PeerId from, std::span<const uint8_t> header_bytes,
                              std::span<const uint8_t> payload, absl::Status status) {
  FrameHeader h;
  absl::Status parsed = transport::ParseFrameHeader(header_bytes, &h);
  std::lock_guard<std::mutex> lock(mu_);
  // A payload that Place gave a buffer is in it now: the transport is done with it. (What
  // it answers below still holds it through expected_ if the step waits for it.)
  const auto placed = placed_.extract(payload.data());
  stats_.bytes_received += header_bytes.size() + payload.size();
  if (auto t = peer_traffic_.find(from); t != peer_traffic_.end()) {
    t->second.bytes.received += header_bytes.size() + payload.size();
  }
  if (!parsed.ok()) {
    ++stats_.stale_frames;
    LOG_FIRST_N(WARNING, 10) << "dropped a malformed data-plane frame: " << parsed.message();
    return;
  }
  const bool answer = h.kind == static_cast<uint16_t>(FrameKind::kLayerResult) ||
                      h.kind == static_cast<uint16_t>(FrameKind::kError);
  if (answer && polling_ == this) ++stats_.answers_polled;
  if (options_.endpoint != 0 && answer && h.epoch == epoch_now_.load() &&
      (h.step_id > step_id_ ||
       (h.step_id == step_id_ && h.kind == static_cast<uint16_t>(FrameKind::kLayerResult) &&
        static_cast<int>(h.layer) > layer_))) {
    // A routed answer ahead of this lane's plan: kept for ExpectLayer.
    if (early_.size() >= kMaxEarly) {
      ++stats_.stale_frames;
      return;
    }
    ++stats_.early_frames;
    early_.push_back({from, h, std::vector<uint8_t>(payload.begin(), payload.end()), status});
    return;
  }
  DeliverLocked(from, h, payload, status);
}

void RemoteAttention::DeliverLocked(PeerId from, const FrameHeader& h,
                                    std::span<const uint8_t> payload, const absl::Status& status) {
  if (h.step_id != step_id_ || (h.kind == static_cast<uint16_t>(FrameKind::kLayerResult) &&
                                static_cast<int>(h.layer) != layer_)) {
    ++stats_.stale_frames;  // an answer to a step or layer that has been given up
    return;
  }
  if (h.kind == static_cast<uint16_t>(FrameKind::kError)) {
    ++stats_.error_frames;
    // The memory node's status, its code included.
    const absl::Status why = transport::ErrorFrameStatus(h, payload);
    // The memory node gave up on this step: every answer of that peer fails.
    for (Expected& e : expected_) {
      if (e.peer == from && !e.arrived) {
        e.arrived = true;
        e.status = why;
      }
    }
    pending_errors_[from] = why;
    cv_.notify_all();
    NotifySettledLocked();
    return;
  }
  if (h.kind != static_cast<uint16_t>(FrameKind::kLayerResult)) {
    ++stats_.stale_frames;
    return;
  }
  for (Expected& e : expected_) {
    if (e.peer != from || e.minibatch != static_cast<int>(h.minibatch) || e.arrived) continue;
    e.arrived = true;
    if (!status.ok()) {
      e.status = status;
    } else if (payload.size() != e.dest.size()) {
      e.status = absl::DataLossError(
          absl::StrCat("layer result of ", payload.size(), " bytes; expected ", e.dest.size()));
    } else {
      e.status = transport::CheckFramePayload(h, payload, options_.verify_checksums);
      if (absl::IsDataLoss(e.status)) ++stats_.checksum_failures;
      if (e.status.ok() && payload.data() != e.dest.data() && !payload.empty()) {
        std::memcpy(e.dest.data(), payload.data(), payload.size());
      }
    }
    // Wake the step thread once, for the last answer: every wake-up before it would take a
    // core from the memory nodes that share this machine, only to sleep again.
    if (LayerSettledLocked()) {
      cv_.notify_all();
      NotifySettledLocked();
    }
    return;
  }
  ++stats_.stale_frames;
}

}  // namespace strata
