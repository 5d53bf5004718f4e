// The UCX backend of Transport: UCP active messages, one worker driven by the transport
// thread, connections bootstrapped over TCP by exchanging UCP worker addresses. This file:
// set-up, the worker loop and the factory; the rest is split by role (ucx_internal.h).
#include "common/transport/ucx_transport.h"

#include <fcntl.h>
#include <netdb.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/logging.h"
#include "common/transport/ucx_bootstrap.h"
#include "common/transport/ucx_internal.h"

namespace strata::transport::ucx_internal {

absl::Status UcxError(const std::string& what, ucs_status_t status) {
  return absl::UnavailableError(absl::StrCat(what, ": ", ucs_status_string(status)));
}

// "host:port" (IPv6 hosts in brackets) to a socket address.
absl::StatusOr<sockaddr_storage> Resolve(const std::string& address, socklen_t* length) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("address \"", address, "\" is not host:port"));
  }
  std::string host = address.substr(0, colon);
  int port = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("address \"", address, "\" has a bad port"));
  }
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), nullptr, &hints, &result);
  if (rc != 0 || result == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve \"", host, "\": ", gai_strerror(rc)));
  }
  sockaddr_storage out{};
  std::memcpy(&out, result->ai_addr, result->ai_addrlen);
  *length = result->ai_addrlen;
  freeaddrinfo(result);
  if (out.ss_family == AF_INET) {
    reinterpret_cast<sockaddr_in*>(&out)->sin_port = htons(port);
  } else {
    reinterpret_cast<sockaddr_in6*>(&out)->sin6_port = htons(port);
  }
  return out;
}

std::string FormatAddress(const sockaddr_storage& addr) {
  char host[NI_MAXHOST], port[NI_MAXSERV];
  const socklen_t length = addr.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), length, host, sizeof(host), port,
                  sizeof(port), NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "?";
  }
  return addr.ss_family == AF_INET6 ? absl::StrCat("[", host, "]:", port)
                                    : absl::StrCat(host, ":", port);
}

absl::Status UcxTransport::Init() {
  ucp_config_t* ucp_config = nullptr;
  ucs_status_t status = ucp_config_read(nullptr, nullptr, &ucp_config);
  if (status != UCS_OK) return UcxError("ucp_config_read", status);
  for (const auto& [key, value] : config_.ucx_options) {
    status = ucp_config_modify(ucp_config, key.c_str(), value.c_str());
    if (status != UCS_OK) {
      ucp_config_release(ucp_config);
      return UcxError(absl::StrCat("UCX option ", key, "=", value), status);
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP | UCP_FEATURE_RMA;
  status = ucp_init(&params, ucp_config, &context_);
  ucp_config_release(ucp_config);
  if (status != UCS_OK) return UcxError("ucp_init", status);

  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  // Only the transport thread calls UCX, but UCX's own async thread handles connection
  // events, which single-thread mode does not allow.
  worker_params.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  status = ucp_worker_create(context_, &worker_params, &worker_);
  if (status != UCS_OK) return UcxError("ucp_worker_create", status);
  ucp_address_t* address = nullptr;
  size_t address_length = 0;
  status = ucp_worker_get_address(worker_, &address, &address_length);
  if (status != UCS_OK) return UcxError("ucp_worker_get_address", status);
  worker_address_.assign(reinterpret_cast<const char*>(address), address_length);
  ucp_worker_release_address(worker_, address);
  int efd = -1;
  status = ucp_worker_get_efd(worker_, &efd);
  if (status != UCS_OK) return UcxError("ucp_worker_get_efd", status);
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) return absl::InternalError("epoll_create1 failed");
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.fd = efd;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, efd, &event) != 0) {
    return absl::InternalError("epoll_ctl failed");
  }

  ucp_worker_attr_t worker_attr{};
  worker_attr.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
  ucp_worker_query(worker_, &worker_attr);
  ucp_context_attr_t context_attr{};
  context_attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  ucp_context_query(context_, &context_attr);
  unsigned major = 0, minor = 0, release = 0;
  ucp_get_version(&major, &minor, &release);
  auto option = [&](const std::string& key) {
    auto it = config_.ucx_options.find(key);
    if (it != config_.ucx_options.end()) return it->second;
    const char* env = std::getenv(("UCX_" + key).c_str());
    return std::string(env != nullptr ? env : "all");
  };
  eager_max_bytes_ = static_cast<size_t>(std::max<int64_t>(0, config_.eager_max_bytes));
  if (config_.eager_max_bytes < 0) {
    eager_max_bytes_ = UcxTlsNamesSharedMemory(option("TLS")) ? size_t{256} << 10 : 0;
  }
  capabilities_.backend = EnumNameOf(Backend::kUcx, kBackendNames);
  // UCX's error mode peer, or else every connection's liveness socket (ucx_bootstrap.h).
  capabilities_.detects_dead_peers = true;
  capabilities_.one_sided_put = true;
  capabilities_.device_memory = (context_attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
  capabilities_.details = absl::StrCat(
      "UCX ", major, ".", minor, ".", release, ", TLS=", option("TLS"),
      ", NET_DEVICES=", option("NET_DEVICES"), ", error mode ", AbslUnparseFlag(config_.error_mode),
      ", max AM header ", worker_attr.max_am_header, " bytes",
      eager_max_bytes_ > 0 ? absl::StrCat(", eager up to ", eager_max_bytes_, " bytes")
                           : std::string());

  for (Tag tag = 0; tag <= kMaxTag; ++tag) {
    tag_args_[tag] = {this, tag};
    ucp_am_handler_param_t handler{};
    handler.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                         UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    handler.id = tag;
    handler.flags = UCP_AM_FLAG_WHOLE_MSG;
    handler.cb = &UcxTransport::OnMessage;
    handler.arg = &tag_args_[tag];
    status = ucp_worker_set_am_recv_handler(worker_, &handler);
    if (status != UCS_OK) return UcxError("ucp_worker_set_am_recv_handler", status);
  }
  loop_.SetPoller(this);
  loop_.Start();
  started_ = true;
  return absl::OkStatus();
}

UcxTransport::~UcxTransport() {
  if (started_) {
    loop_.Post([this] { ClosePeers(); });
    loop_.Join();
  }
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  for (int fd : liveness_at_shutdown_) close(fd);
  if (context_ != nullptr) ucp_cleanup(context_);
  if (epoll_fd_ >= 0) close(epoll_fd_);
}

bool UcxTransport::Post(EventLoop::Closure fn) { return loop_.Post(std::move(fn)); }

void UcxTransport::Begin() { worker_lock_.lock(); }

void UcxTransport::End() { worker_lock_.unlock(); }

void UcxTransport::Progress() {
  if (shutting_down_) return;  // (liveness_at_shutdown_)
  int events = 0;
  while (ucp_worker_progress(worker_) != 0) ++events;
  if (slept_to_bound_ && events > 0) {
    lost_wakeups_.fetch_add(1);
    LOG(WARNING) << "UCX transport: traffic waited for the one-second bound on the transport "
                    "thread's sleep (a lost wake-up)";
  }
  slept_to_bound_ = false;
}

void UcxTransport::Wait(absl::Time deadline) {
  // Busy: events came since the last progress, or Wake() signalled the worker.
  if (ucp_worker_arm(worker_) == UCS_ERR_BUSY) return;
  // At most a second, in case an event is missed; other threads may start sends while
  // this one sleeps (Send).
  const absl::Duration left = deadline - absl::Now();
  const int timeout_ms = left >= absl::Seconds(1)
                             ? 1000
                             : static_cast<int>(std::max<int64_t>(
                                   0, absl::ToInt64Milliseconds(left + absl::Milliseconds(1))));
  const uint64_t outside_uses = outside_uses_.load();
  worker_lock_.unlock();
  epoll_event events[4];
  const int n = epoll_wait(epoll_fd_, events, 4, timeout_ms);
  worker_lock_.lock();
  slept_to_bound_ = n == 0 && timeout_ms == 1000 && outside_uses_.load() != outside_uses;
  for (int i = 0; i < n; ++i) {
    if (events[i].data.fd == listen_fd_ && listen_fd_ >= 0) {
      AcceptBootstrap();
    } else if (by_liveness_.count(events[i].data.fd) != 0) {
      OnLivenessEvent(events[i].data.fd);
    }
  }
}

void UcxTransport::Wake() { ucp_worker_signal(worker_); }

thread_local const UcxTransport* UcxTransport::progressing_ = nullptr;
thread_local bool UcxTransport::sent_while_progressing_ = false;

bool UcxTransport::WorkerIsOurs() const { return loop_.InLoopThread() || progressing_ == this; }

bool UcxTransport::ProgressUntil(absl::FunctionRef<bool()> done, absl::Time deadline) {
  // The transport thread, or a handler inside another ProgressUntil, holds the worker
  // already: nothing to add.
  if (WorkerIsOurs()) return done();
  sent_while_progressing_ = false;
  bool settled = done();
  while (!settled && absl::Now() < deadline) {
    bool progressed = false;
    // Work posted to the transport thread (a send that found the worker busy) goes first,
    // there: progressing here meanwhile could deliver an answer to it before it is sent.
    if (loop_.NothingPosted()) {
      std::unique_lock<std::mutex> worker_lock(worker_mu_, std::try_to_lock);
      if (worker_lock.owns_lock()) {
        outside_uses_.fetch_add(1);
        progressing_ = this;
        while (ucp_worker_progress(worker_) != 0) progressed = true;
        progressing_ = nullptr;
      }
    }
    settled = done();
    // The transport thread, woken by the same traffic, takes the worker when it is free;
    // a thread of a peer on this core runs now rather than after this one's time slice.
    if (!settled && !progressed) sched_yield();
  }
  // A send a handler started here that found the peer's FIFO full and stayed pending
  // needs the worker progressed again, which no event announces, so the transport thread
  // does it (as after a pending Send from another thread). The rest of what progressing left
  // (a rendezvous acknowledgement, say) is in hand of the transport thread anyway: the
  // traffic that this thread took woke it if it slept.
  if (sent_while_progressing_) Wake();
  return settled;
}

void UcxTransport::ClosePeers() {
  if (listen_fd_ >= 0) {
    close(listen_fd_);
    listen_fd_ = -1;
  }
  std::vector<PeerId> ids;
  for (const auto& [id, peer] : peers_) ids.push_back(id);
  shutting_down_ = true;
  for (PeerId id : ids) ClosePeer(id, ShuttingDown());
  // After whatever the closes posted; nothing posted after this is run.
  loop_.Post([this] { FinishShutdown(); });
  loop_.Quit();
}

void UcxTransport::FinishShutdown() {
  // The closes' requests are let go unprogressed; ucp_worker_destroy ends the endpoints.
  for (void* request : closing_) ucp_request_free(request);
  closing_.clear();
  for (auto& [id, peer] : peers_) {
    if (peer.connect_waiter) peer.connect_waiter->Set(absl::CancelledError("shutting down"));
  }
  for (ucp_mem_h memh : mapped_) ucp_mem_unmap(context_, memh);
  mapped_.clear();
}

}  // namespace strata::transport::ucx_internal

namespace strata::transport {

absl::StatusOr<std::unique_ptr<Transport>> CreateUcxTransport(const TransportConfig& config) {
  auto transport = std::make_unique<ucx_internal::UcxTransport>(config);
  absl::Status status = transport->Init();
  if (!status.ok()) return status;
  return transport;
}

namespace {
[[maybe_unused]] const bool registered =
    RegisterTransportBackend(Backend::kUcx, &CreateUcxTransport);
}  // namespace

}  // namespace strata::transport
