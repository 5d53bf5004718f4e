#include "common/transport/inproc_transport.h"

#include <condition_variable>
#include <map>
#include <mutex>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "common/base/crypto.h"
#include "common/base/event_loop.h"
#include "common/base/logging.h"

namespace strata::transport {
namespace {

// The part of a transport that peers hold: its event queue and thread.
class Core {
 public:
  Core() { loop_.Start(); }
  ~Core() { loop_.Stop(); }  // runs what is queued, then ends the thread
  // False once the owning transport is gone.
  bool Post(std::function<void()> fn) { return loop_.Post(std::move(fn)); }
  // Refuses new events; the queued ones still run.
  void Close() { loop_.Quit(); }
  // After Close(): waits for them and the thread to end.
  void Join() { loop_.Join(); }

 private:
  EventLoop loop_{"inproc-xport"};  // thread names keep 15 bytes
};

class InprocTransport;

// Listening transports by name.
std::mutex registry_mu;
std::map<std::string, InprocTransport*>& Registry() {
  static auto* registry = new std::map<std::string, InprocTransport*>;
  return *registry;
}

class InprocTransport final : public Transport {
 public:
  InprocTransport() : core_(std::make_shared<Core>()) {}
  ~InprocTransport() override;

  Capabilities capabilities() const override {
    Capabilities c;
    c.backend = EnumNameOf(Backend::kInproc, kBackendNames);
    c.details = "in-process queues";
    c.detects_dead_peers = true;
    return c;
  }
  void SetHandler(Tag tag, MessageHandler* handler) override {
    CHECK(tag > 0 && tag <= kMaxTag) << "tag " << tag;
    std::lock_guard<std::mutex> lock(mu_);
    handlers_[tag] = handler;
  }
  void SetPeerHandler(PeerHandler handler) override {
    std::lock_guard<std::mutex> lock(mu_);
    peer_handler_ = std::move(handler);
  }
  absl::StatusOr<std::string> Listen(const std::string& address) override;
  absl::StatusOr<PeerId> Connect(const std::string& address) override;
  void Disconnect(PeerId peer) override;
  std::string DescribePeer(PeerId peer) override { return absl::StrCat("inproc peer ", peer); }
  std::string PeerSecret(PeerId peer) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = links_.find(peer);
    return it == links_.end() ? std::string() : it->second.secret;
  }
  void Send(PeerId peer, Tag tag, std::span<const uint8_t> header,
            std::vector<std::span<const uint8_t>> payload, SendDone done) override;

 private:
  struct Link {
    std::weak_ptr<Core> remote_core;
    InprocTransport* remote = nullptr;  // valid while remote_core can be locked
    PeerId remote_peer = 0;
    bool closed = false;
    std::string secret;  // PeerSecret: drawn by the connecting side, shared with the other
  };

  // Accepts a connection from `remote`; returns this side's peer id.
  PeerId Accept(InprocTransport* remote, std::weak_ptr<Core> remote_core, PeerId remote_peer,
                const std::string& secret);
  void Receive(PeerId from, Tag tag, std::vector<uint8_t> header, std::vector<uint8_t> payload);
  void PeerClosed(PeerId peer);

  std::shared_ptr<Core> core_;
  std::mutex mu_;
  std::string name_;
  MessageHandler* handlers_[kMaxTag + 1] = {};
  PeerHandler peer_handler_;
  std::unordered_map<PeerId, Link> links_;
  PeerId next_peer_ = 1;
};

InprocTransport::~InprocTransport() {
  {
    std::lock_guard<std::mutex> lock(registry_mu);
    if (!name_.empty()) Registry().erase(name_);
  }
  core_->Close();  // no event of this transport runs after this returns... except the current
  std::unordered_map<PeerId, Link> links;
  {
    std::lock_guard<std::mutex> lock(mu_);
    links.swap(links_);
  }
  for (auto& [id, link] : links) {
    if (link.closed) continue;
    if (auto remote = link.remote_core.lock()) {
      InprocTransport* peer = link.remote;
      const PeerId remote_peer = link.remote_peer;
      remote->Post([peer, remote_peer] { peer->PeerClosed(remote_peer); });
    }
  }
  // Waits for the event in progress and the queued ones. core_ stays set until they have
  // run: a handler that sends meanwhile posts its completion through it (refused now).
  core_->Join();
}

absl::StatusOr<std::string> InprocTransport::Listen(const std::string& address) {
  std::lock_guard<std::mutex> lock(registry_mu);
  if (Registry().count(address)) {
    return absl::AlreadyExistsError(absl::StrCat("inproc address \"", address, "\" is taken"));
  }
  Registry()[address] = this;
  name_ = address;
  return address;
}

PeerId InprocTransport::Accept(InprocTransport* remote, std::weak_ptr<Core> remote_core,
                               PeerId remote_peer, const std::string& secret) {
  PeerId id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = next_peer_++;
    links_[id] = {std::move(remote_core), remote, remote_peer, false, secret};
  }
  core_->Post([this, id] {
    PeerHandler handler;
    {
      std::lock_guard<std::mutex> lock(mu_);
      handler = peer_handler_;
    }
    if (handler) handler(id, PeerEvent::kConnected, absl::OkStatus());
  });
  return id;
}

absl::StatusOr<PeerId> InprocTransport::Connect(const std::string& address) {
  std::lock_guard<std::mutex> registry_lock(registry_mu);
  auto it = Registry().find(address);
  if (it == Registry().end()) {
    return absl::UnavailableError(absl::StrCat("no inproc transport listens at \"", address, "\""));
  }
  InprocTransport* server = it->second;
  PeerId id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = next_peer_++;
    links_[id] = {};
  }
  const std::string secret = SecureRandomBytes(32);
  const PeerId remote_peer = server->Accept(this, core_, id, secret);
  std::lock_guard<std::mutex> lock(mu_);
  links_[id] = {server->core_, server, remote_peer, false, secret};
  return id;
}

void InprocTransport::Disconnect(PeerId peer) {
  Link link;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = links_.find(peer);
    if (it == links_.end() || it->second.closed) return;
    it->second.closed = true;
    link = it->second;
  }
  if (auto remote = link.remote_core.lock()) {
    InprocTransport* other = link.remote;
    const PeerId remote_peer = link.remote_peer;
    remote->Post([other, remote_peer] { other->PeerClosed(remote_peer); });
  }
  // A delivery already running on this transport's thread finishes before we return.
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  if (core_->Post([&] {
        std::lock_guard<std::mutex> lock(mu);
        done = true;
        cv.notify_all();
      })) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
  }
}

void InprocTransport::PeerClosed(PeerId peer) {
  PeerHandler handler;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = links_.find(peer);
    if (it == links_.end() || it->second.closed) return;
    it->second.closed = true;
    handler = peer_handler_;
  }
  if (handler) handler(peer, PeerEvent::kDisconnected, absl::UnavailableError("peer closed"));
}

void InprocTransport::Send(PeerId peer, Tag tag, std::span<const uint8_t> header,
                           std::vector<std::span<const uint8_t>> payload, SendDone done) {
  Link link;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = links_.find(peer);
    if (it != links_.end()) link = it->second;
  }
  std::vector<uint8_t> header_copy(header.begin(), header.end());
  std::vector<uint8_t> body;
  for (const auto& part : payload) body.insert(body.end(), part.begin(), part.end());
  absl::Status status = absl::OkStatus();
  auto remote = link.remote_core.lock();
  if (link.remote == nullptr || link.closed || remote == nullptr) {
    status = absl::UnavailableError(absl::StrCat("inproc peer ", peer, " is not connected"));
  } else {
    InprocTransport* other = link.remote;
    const PeerId from = link.remote_peer;
    if (!remote->Post(
            [other, from, tag, h = std::move(header_copy), b = std::move(body)]() mutable {
              other->Receive(from, tag, std::move(h), std::move(b));
            })) {
      status = absl::UnavailableError("inproc peer is gone");
    }
  }
  core_->Post([done = std::move(done), status] { done(status); });
}

void InprocTransport::Receive(PeerId from, Tag tag, std::vector<uint8_t> header,
                              std::vector<uint8_t> payload) {
  MessageHandler* handler;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = links_.find(from);
    if (it == links_.end() || it->second.closed) return;
    handler = tag <= kMaxTag ? handlers_[tag] : nullptr;
  }
  if (handler == nullptr) {
    LOG_FIRST_N(WARNING, 10) << "inproc: dropped a message with tag " << tag << " (no handler)";
    return;
  }
  std::span<uint8_t> dest = handler->Place(from, header, payload.size());
  if (dest.empty()) {
    handler->Deliver(from, header, payload, absl::OkStatus());
  } else if (dest.size() != payload.size()) {
    handler->Deliver(from, header, {},
                     absl::InternalError("the receiver placed a payload at a wrong size"));
  } else {
    std::copy(payload.begin(), payload.end(), dest.begin());
    handler->Deliver(from, header, dest, absl::OkStatus());
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> CreateInprocTransport(const TransportConfig&) {
  return std::unique_ptr<Transport>(new InprocTransport);
}

namespace {
[[maybe_unused]] const bool registered =
    RegisterTransportBackend(Backend::kInproc, &CreateInprocTransport);
}  // namespace

}  // namespace strata::transport
