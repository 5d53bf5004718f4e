// What the transport's tests share: a handler that records what arrives, a record of peer
// events, the key both ends of a test hold, seeded bytes, and a peer that hung.
#ifndef STRATA_COMMON_TRANSPORT_TRANSPORT_TESTING_H_
#define STRATA_COMMON_TRANSPORT_TRANSPORT_TESTING_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/transport/transport.h"

namespace strata::transport {

// Records what arrives; optionally places payloads into a caller-owned buffer.
class Recorder : public MessageHandler {
 public:
  struct Message {
    PeerId from;
    std::vector<uint8_t> header, payload;
    bool placed;
    absl::Status status;
  };
  std::span<uint8_t> Place(PeerId, std::span<const uint8_t>, size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!place_into_buffer_) return {};
    // Several receives may be in flight at once: each gets a buffer of its own.
    buffers_.emplace_back(bytes);
    return {buffers_.back().data(), bytes};
  }
  void Deliver(PeerId from, std::span<const uint8_t> header, std::span<const uint8_t> payload,
               absl::Status status) override {
    std::lock_guard<std::mutex> lock(mu_);
    messages_.push_back({from,
                         {header.begin(), header.end()},
                         {payload.begin(), payload.end()},
                         place_into_buffer_ && !buffers_.empty() && IsPlaced(payload.data()),
                         status});
    cv_.notify_all();
  }
  bool WaitFor(size_t n, absl::Duration timeout = absl::Seconds(20)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                        [&] { return messages_.size() >= n; });
  }
  std::vector<Message> messages() {
    std::lock_guard<std::mutex> lock(mu_);
    return messages_;
  }
  void set_place_into_buffer(bool on) {
    std::lock_guard<std::mutex> lock(mu_);
    place_into_buffer_ = on;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Message> messages_;
  bool place_into_buffer_ = false;
  std::deque<std::vector<uint8_t>> buffers_;
  bool IsPlaced(const uint8_t* p) const {
    for (const auto& b : buffers_) {
      if (b.data() == p) return true;
    }
    return false;
  }
};

// Places every payload in a buffer of its own, and counts places and deliveries: for the
// tests of the promise that every span Place hands out comes back in exactly one Deliver,
// also when the sender dies with its payload under way.
class PlacingCounter : public MessageHandler {
 public:
  std::span<uint8_t> Place(PeerId, std::span<const uint8_t>, size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    buffers_.emplace_back(bytes);
    ++placed_;
    cv_.notify_all();
    return {buffers_.back().data(), bytes};
  }
  void Deliver(PeerId, std::span<const uint8_t>, std::span<const uint8_t> payload,
               absl::Status) override {
    std::lock_guard<std::mutex> lock(mu_);
    bool ours = false;
    for (const auto& b : buffers_) ours = ours || (b.data() == payload.data() && !b.empty());
    misplaced_ += ours ? 0 : 1;
    ++delivered_;
    cv_.notify_all();
  }
  // Waits (20 s at most) until `pred(places, deliveries)` holds; returns whether it did.
  template <class Pred>
  bool WaitFor(Pred pred) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(20), [&] { return pred(placed_, delivered_); });
  }
  // Deliveries of a span that no Place of this handler gave out.
  int misplaced() {
    std::lock_guard<std::mutex> lock(mu_);
    return misplaced_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::vector<uint8_t>> buffers_;
  int placed_ = 0, delivered_ = 0, misplaced_ = 0;
};

struct PeerEvents {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<PeerId, PeerEvent>> events;
  void Add(PeerId id, PeerEvent event) {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back({id, event});
    cv.notify_all();
  }
  bool WaitFor(PeerEvent event, absl::Duration timeout = absl::Seconds(20)) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, absl::ToChronoNanoseconds(timeout), [&] {
      for (const auto& [id, e] : events) {
        if (e == event) return true;
      }
      return false;
    });
  }
};

// The key both ends of a test hold.
inline const std::string kTestKey = "0123456789abcdef0123456789abcdef";

// A transport of `config` listening on a free loopback port, with `handler` for `tag`, its
// peer events recorded in `events`; `*address` is where it listens.
inline absl::StatusOr<std::unique_ptr<Transport>> ListeningTransport(const TransportConfig& config,
                                                                     Tag tag,
                                                                     MessageHandler* handler,
                                                                     PeerEvents* events,
                                                                     std::string* address) {
  auto transport = Transport::Create(config);
  if (!transport.ok()) return transport.status();
  (*transport)->SetHandler(tag, handler);
  (*transport)->SetPeerHandler([events](PeerId id, PeerEvent event, const absl::Status&) {
    events->Add(id, event);
  });
  auto listening = (*transport)->Listen("127.0.0.1:0");
  if (!listening.ok()) return listening.status();
  *address = *listening;
  return transport;
}

// `n` bytes drawn from a generator seeded with `seed`.
inline std::vector<uint8_t> Bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> out(n);
  for (auto& b : out) b = static_cast<uint8_t>(rng());
  return out;
}

// A peer that hung: a socket on loopback that listens and never accepts or answers. Its
// kernel takes connections for it, so a connect gets as far as the handshake and waits
// there. Closed when this goes, or by Close() (a connect then fails).
class HungListener {
 public:
  HungListener() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(addr);
    if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        listen(fd_, 8) != 0 || getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &length) != 0) {
      return;
    }
    address_ = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  }
  ~HungListener() { Close(); }
  HungListener(const HungListener&) = delete;
  HungListener& operator=(const HungListener&) = delete;

  // "127.0.0.1:port"; empty if the socket could not be set up.
  const std::string& address() const { return address_; }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  std::string address_;
};

}  // namespace strata::transport

#endif  // STRATA_COMMON_TRANSPORT_TRANSPORT_TESTING_H_
