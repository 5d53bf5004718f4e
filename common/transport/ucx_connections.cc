// The UCX backend (ucx_internal.h): listening, connecting and disconnecting, the peer
// table, and the handshake that authenticates a peer before its messages are delivered.
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/crypto.h"
#include "common/base/logging.h"
#include "common/transport/handshake.h"
#include "common/transport/ucx_bootstrap.h"
#include "common/transport/ucx_internal.h"

namespace strata::transport::ucx_internal {

UcxTransport::Peer* UcxTransport::FindPeer(PeerId id) {
  auto it = peers_.find(id);
  return it == peers_.end() ? nullptr : &it->second;
}

PeerId UcxTransport::AddPeer(ucp_ep_h ep) {
  const PeerId id = next_peer_++;
  Peer& peer = peers_[id];
  peer.id = id;
  peer.ep = ep;
  if (ep != nullptr) by_endpoint_[ep] = id;
  return id;
}

absl::StatusOr<ucp_ep_h> UcxTransport::CreateEndpoint(ucp_ep_params_t params, PeerId id) {
  auto arg = std::make_unique<ErrorArg>(ErrorArg{this, id});
  params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  params.err_mode = config_.error_mode == ErrorMode::kPeer ? UCP_ERR_HANDLING_MODE_PEER
                                                           : UCP_ERR_HANDLING_MODE_NONE;
  params.err_handler.cb = &UcxTransport::OnEndpointError;
  params.err_handler.arg = arg.get();
  ucp_ep_h ep = nullptr;
  const ucs_status_t status = ucp_ep_create(worker_, &params, &ep);
  if (status != UCS_OK) return UcxError("ucp_ep_create", status);
  error_args_[id] = std::move(arg);
  return ep;
}

void UcxTransport::ClosePeer(PeerId id, const absl::Status& why) {
  Peer* peer = FindPeer(id);
  if (peer == nullptr || peer->closed) return;
  peer->closed = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    secrets_.erase(id);
  }
  const bool was_ready = peer->ready;
  peer->ready = false;
  if (peer->connect_waiter) {
    peer->connect_waiter->Set(why);
    peer->connect_waiter.reset();
  }
  if (peer->liveness >= 0) {
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, peer->liveness, nullptr);
    by_liveness_.erase(peer->liveness);
    // The other side reads its end: a Disconnect reaches it (at shutdown, once the worker
    // is gone: liveness_at_shutdown_).
    if (shutting_down_) {
      liveness_at_shutdown_.push_back(peer->liveness);
    } else {
      close(peer->liveness);
    }
    peer->liveness = -1;
  }
  for (auto& [key, rkey] : peer->rkeys) ucp_rkey_destroy(rkey);
  peer->rkeys.clear();
  if (peer->ep != nullptr) {
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void* request = ucp_ep_close_nbx(peer->ep, &param);
    if (request != nullptr && !UCS_PTR_IS_ERR(request)) closing_.push_back(request);
    by_endpoint_.erase(peer->ep);
    peer->ep = nullptr;
  }
  if (was_ready && peer_handler_) peer_handler_(id, PeerEvent::kDisconnected, why);
}

void UcxTransport::WatchLiveness(PeerId id, int fd) {
  KeepAsLivenessSocket(fd);
  epoll_event event{};
  event.events = EPOLLIN | EPOLLRDHUP;
  event.data.fd = fd;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &event) != 0) {
    // The connection still works; only a dead peer would go unnoticed but for deadlines.
    LOG(WARNING) << "data-plane peer " << id
                 << ": cannot watch its liveness socket: " << std::strerror(errno);
    close(fd);
    return;
  }
  peers_[id].liveness = fd;
  by_liveness_[fd] = id;
}

void UcxTransport::OnLivenessEvent(int fd) {
  auto it = by_liveness_.find(fd);
  if (it == by_liveness_.end()) return;
  const PeerId id = it->second;
  char bytes[256];
  while (true) {
    const ssize_t n = recv(fd, bytes, sizeof(bytes), 0);
    if (n > 0) {
      LOG_FIRST_N(WARNING, 10) << "data-plane peer " << id << " sent " << n
                               << " bytes on its liveness socket; dropped";
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;  // still open
    break;                                                           // its end (0), or a reset
  }
  // Messages it sent before it went wait in the worker (a shared-memory FIFO, a socket's
  // buffer): they go to their handlers before the peer is reported gone.
  while (ucp_worker_progress(worker_) != 0) {
  }
  ClosePeer(id,
            absl::UnavailableError(absl::StrCat("data-plane peer ", id,
                                                " closed its connection (its process exited, or it "
                                                "disconnected)")));
}

void UcxTransport::SetPeerSecret(PeerId id, std::string secret) {
  std::lock_guard<std::mutex> lock(mu_);
  secrets_[id] = std::move(secret);
}

std::string UcxTransport::PeerSecret(PeerId id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = secrets_.find(id);
  return it == secrets_.end() ? std::string() : it->second;
}

void UcxTransport::SetHandler(Tag tag, MessageHandler* handler) {
  CHECK(tag > 0 && tag <= kMaxTag) << "tag " << tag;
  std::lock_guard<std::mutex> lock(mu_);
  handlers_[tag] = handler;
}

void UcxTransport::SetPeerHandler(PeerHandler handler) {
  std::lock_guard<std::mutex> lock(mu_);
  peer_handler_ = std::move(handler);
}

absl::StatusOr<std::string> UcxTransport::Listen(const std::string& address) {
  socklen_t length = 0;
  auto addr = Resolve(address, &length);
  if (!addr.ok()) return addr.status();
  const int fd = socket(addr->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError("socket() failed");
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, reinterpret_cast<const sockaddr*>(&*addr), length) != 0 || listen(fd, 64) != 0) {
    const int error = errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", address, ": ", std::strerror(error)));
  }
  sockaddr_storage bound{};
  socklen_t bound_length = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &bound_length);
  auto waiter = std::make_shared<Waiter<absl::Status>>();
  if (!Post([this, waiter, fd] {
        if (listen_fd_ >= 0) {
          close(fd);
          waiter->Set(absl::FailedPreconditionError("already listening"));
          return;
        }
        epoll_event event{};
        event.events = EPOLLIN;
        event.data.fd = fd;
        if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &event) != 0) {
          close(fd);
          waiter->Set(absl::InternalError("epoll_ctl failed"));
          return;
        }
        listen_fd_ = fd;
        waiter->Set(absl::OkStatus());
      })) {
    close(fd);
    waiter->Set(ShuttingDown());
  }
  auto result = waiter->Wait(absl::Seconds(30));
  if (!result) return absl::DeadlineExceededError("the transport thread did not answer");
  if (!result->ok()) return *result;
  return FormatAddress(bound);
}

void UcxTransport::AcceptBootstrap() {
  while (true) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN: no more
    // The client answers at once; a slow or bogus one costs at most about two seconds: a
    // second for the bootstrap's reads in all, and one read that started before it ran out.
    SetSocketTimeouts(fd, absl::Seconds(1));
    absl::StatusOr<Bootstrapped> theirs =
        ServerBootstrap(fd, worker_address_, config_.auth_key, absl::Seconds(1));
    if (!theirs.ok()) {
      close(fd);
      if (absl::IsUnauthenticated(theirs.status())) ++ProcessAuthRefusals().data_plane;
      LOG_FIRST_N(WARNING, 10) << "refused a data-plane connection: " << theirs.status().message();
      continue;
    }
    const PeerId id = AddPeer(nullptr);
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    params.address = reinterpret_cast<const ucp_address_t*>(theirs->address.data());
    auto ep = CreateEndpoint(params, id);
    if (!ep.ok()) {
      close(fd);
      LOG(WARNING) << "refused a data-plane connection: " << ep.status().message();
      peers_.erase(id);
      continue;
    }
    SetPeerSecret(id, std::move(theirs->secret));
    peers_[id].ep = *ep;
    by_endpoint_[*ep] = id;
    WatchLiveness(id, fd);
  }
}

void UcxTransport::OnEndpointError(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* error = static_cast<ErrorArg*>(arg);
  UcxTransport* self = error->self;
  const PeerId id = error->peer;
  // Closing from inside UCX's callback is not allowed; do it from the loop.
  self->Post([self, id, status] {
    self->ClosePeer(id, UcxError("the peer's connection failed", status));
  });
}

absl::StatusOr<PeerId> UcxTransport::Connect(const std::string& address) {
  socklen_t length = 0;
  auto addr = Resolve(address, &length);
  if (!addr.ok()) return addr.status();
  absl::StatusOr<Bootstrapped> theirs = BootstrapClient(
      *addr, length, worker_address_, config_.auth_key, config_.connect_timeout, &connect_sockets_);
  if (!theirs.ok()) {
    // A refused secret keeps its code (UNAUTHENTICATED): retrying does not help; so does an
    // abort (CANCELLED).
    const absl::StatusCode code =
        absl::IsUnauthenticated(theirs.status()) || absl::IsCancelled(theirs.status())
            ? theirs.status().code()
            : absl::StatusCode::kUnavailable;
    return absl::Status(
        code, absl::StrCat("cannot connect to ", address, ": ", theirs.status().message()));
  }
  auto waiter = std::make_shared<Waiter<absl::StatusOr<PeerId>>>();
  {
    std::lock_guard<std::mutex> lock(connects_mu_);
    // Read under connects_mu_: AbortConnects marks the sockets aborted before it takes the
    // lock to wake the waiters, so a waiter added here is either refused or woken.
    if (connect_sockets_.aborted()) {
      close(theirs->socket);
      return absl::CancelledError(absl::StrCat("cannot connect to ", address, ": aborted"));
    }
    connect_waits_.insert(waiter);
  }
  auto id_waiter = std::make_shared<Waiter<PeerId>>();
  const bool posted = Post([this, waiter, id_waiter, theirs = *theirs, address] {
    const PeerId id = AddPeer(nullptr);
    id_waiter->Set(id);
    SetPeerSecret(id, theirs.secret);
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    params.address = reinterpret_cast<const ucp_address_t*>(theirs.address.data());
    auto ep = CreateEndpoint(params, id);
    if (!ep.ok()) {
      close(theirs.socket);
      peers_.erase(id);
      waiter->Set(ep.status());
      return;
    }
    Peer& peer = peers_[id];
    peer.ep = *ep;
    by_endpoint_[*ep] = id;
    peer.connect_waiter = waiter;
    WatchLiveness(id, theirs.socket);
    auto ctx = std::make_unique<SendContext>();
    ctx->self = this;
    ctx->peer = id;
    Handshake hello;
    const auto bytes = AsBytes(hello);
    ctx->header.assign(bytes.begin(), bytes.end());
    ctx->done = [this, id, address](absl::Status status) {
      if (!status.ok()) {
        ClosePeer(id, absl::UnavailableError(
                          absl::StrCat("cannot connect to ", address, ": ", status.message())));
      }
    };
    StartSend(std::move(ctx), 0);
  });
  if (!posted) {
    close(theirs->socket);
    waiter->Set(ShuttingDown());
  }
  auto result = waiter->Wait(config_.connect_timeout);
  {
    std::lock_guard<std::mutex> lock(connects_mu_);
    connect_waits_.erase(waiter);
  }
  if (!result) {
    auto id = id_waiter->Wait(absl::Seconds(1));
    if (id) {
      const PeerId peer = *id;
      Post([this, peer] { ClosePeer(peer, absl::DeadlineExceededError("connect timed out")); });
    }
    return absl::DeadlineExceededError(absl::StrCat("no data-plane handshake from ", address,
                                                    " within ",
                                                    absl::FormatDuration(config_.connect_timeout)));
  }
  if (posted && absl::IsCancelled(result->status())) {
    // Aborted: the peer made for this connect (on the transport thread, soon if not yet) is
    // closed.
    if (auto id = id_waiter->Wait(absl::Seconds(1))) {
      const PeerId peer = *id;
      Post([this, peer] { ClosePeer(peer, absl::CancelledError("the connect was aborted")); });
    }
  }
  return *result;
}

void UcxTransport::AbortConnects() {
  connect_sockets_.Abort();  // first: Connect reads it under connects_mu_
  std::lock_guard<std::mutex> lock(connects_mu_);
  for (const auto& waiter : connect_waits_) {
    waiter->Set(absl::CancelledError("the connect was aborted"));
  }
}

void UcxTransport::Disconnect(PeerId peer) {
  auto waiter = std::make_shared<Waiter<bool>>();
  if (!Post([this, peer, waiter] {
        ClosePeer(peer, absl::CancelledError("disconnected"));
        waiter->Set(true);
      })) {
    waiter->Set(false);
  }
  waiter->Wait(absl::Seconds(10));
}

std::string UcxTransport::DescribePeer(PeerId id) {
  auto waiter = std::make_shared<Waiter<std::string>>();
  if (!Post([this, id, waiter] {
        Peer* peer = FindPeer(id);
        if (peer == nullptr || peer->ep == nullptr) {
          waiter->Set("not connected");
          return;
        }
        char* text = nullptr;
        size_t size = 0;
        FILE* stream = open_memstream(&text, &size);
        if (stream == nullptr) {
          waiter->Set("?");
          return;
        }
        ucp_ep_print_info(peer->ep, stream);
        fclose(stream);
        // Keep the lane lines ("lane[0]: 2:posix/memory.0 md[2] ... am am_bw ...").
        std::string summary;
        for (absl::string_view line : absl::StrSplit(absl::string_view(text, size), '\n')) {
          const size_t at = line.find("lane[");
          if (at == absl::string_view::npos) continue;
          if (!summary.empty()) summary += "; ";
          summary += std::string(absl::StripAsciiWhitespace(line.substr(at)));
        }
        free(text);
        waiter->Set(summary.empty() ? "no lanes yet" : summary);
      })) {
    waiter->Set("not connected");
  }
  return waiter->Wait(absl::Seconds(10)).value_or("the transport thread did not answer");
}

void UcxTransport::HandleHandshake(PeerId id, std::span<const uint8_t> header) {
  Peer* peer = FindPeer(id);
  if (peer == nullptr || peer->closed) return;
  Handshake message;
  absl::Status status = ParseHandshake(header, &message);
  if (!status.ok()) {
    LOG(WARNING) << "data-plane peer " << id << ": " << status.message();
    ClosePeer(id, status);
    return;
  }
  if (message.kind == Handshake::kHello) {
    status = CheckPeerVersion(message.version);
    Handshake answer;
    answer.kind = status.ok() ? Handshake::kAccept : Handshake::kRefuse;
    auto ctx = std::make_unique<SendContext>();
    ctx->self = this;
    ctx->peer = id;
    const auto bytes = AsBytes(answer);
    ctx->header.assign(bytes.begin(), bytes.end());
    if (status.ok()) {
      peer->ready = true;
      ctx->done = [](absl::Status) {};
      StartSend(std::move(ctx), 0);
      if (peer_handler_) peer_handler_(id, PeerEvent::kConnected, absl::OkStatus());
    } else {
      LOG(WARNING) << "refused a data-plane peer: " << status.message();
      ctx->done = [this, id, status](absl::Status) { ClosePeer(id, status); };
      StartSend(std::move(ctx), 0);
    }
    return;
  }
  if (!peer->connect_waiter) return;  // not connecting: ignore a stray answer
  if (message.kind == Handshake::kAccept) {
    status = CheckPeerVersion(message.version);
    if (status.ok()) {
      peer->ready = true;
      peer->connect_waiter->Set(id);
      peer->connect_waiter.reset();
      return;
    }
  } else {
    status = absl::FailedPreconditionError(absl::StrCat(
        "the peer refused this node (it speaks data-plane version ", message.version, ")"));
  }
  ClosePeer(id, status);
}

}  // namespace strata::transport::ucx_internal
