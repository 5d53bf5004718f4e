// The UCX backend of Transport: UCP active messages, one worker driven by the transport
// thread, connections bootstrapped over TCP by exchanging UCP worker addresses.
#include "common/transport/ucx_transport.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/crypto.h"
#include "common/base/logging.h"
#include "common/transport/handshake.h"
#include "common/transport/ucx_bootstrap.h"

namespace strata::transport {
namespace {

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

// A one-shot result that a caller thread waits for.
template <class T>
class Waiter {
 public:
  void Set(T value) {
    std::lock_guard<std::mutex> lock(mu_);
    if (value_.has_value()) return;
    value_ = std::move(value);
    cv_.notify_all();
  }
  std::optional<T> Wait(absl::Duration timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [&] { return value_.has_value(); });
    return value_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<T> value_;
};

class UcxTransport final : public Transport {
 public:
  explicit UcxTransport(TransportConfig config) : config_(std::move(config)) {}
  ~UcxTransport() override;

  absl::Status Init();
  Capabilities capabilities() const override { return capabilities_; }
  void SetHandler(Tag tag, MessageHandler* handler) override;
  void SetPeerHandler(PeerHandler handler) override;
  absl::StatusOr<std::string> Listen(const std::string& address) override;
  absl::StatusOr<PeerId> Connect(const std::string& address) override;
  void Disconnect(PeerId peer) override;
  std::string DescribePeer(PeerId peer) override;
  void Send(PeerId peer, Tag tag, std::span<const uint8_t> header,
            std::vector<std::span<const uint8_t>> payload, SendDone done) override;
  absl::StatusOr<RemoteRegion> RegisterRegion(void* base, size_t bytes) override;
  void PutWithFlag(PeerId peer, const RemoteRegion& region, uint64_t remote_address,
                   std::span<const uint8_t> data, uint64_t flag_address, uint64_t flag_value,
                   SendDone done) override;

 private:
  // A received message waiting for its payload or for earlier messages: deliveries keep
  // the order of arrival even when a rendezvous payload completes after later messages.
  struct RecvContext {
    UcxTransport* self;
    PeerId peer;
    Tag tag;
    uint64_t sequence;
    std::vector<uint8_t> header;
    std::vector<uint8_t> owned;
    std::span<uint8_t> dest;
    bool complete = false;
    absl::Status status;
  };
  struct Peer {
    PeerId id = 0;
    ucp_ep_h ep = nullptr;
    bool ready = false;                                              // handshake complete
    bool closed = false;                                             // failed or disconnected
    std::shared_ptr<Waiter<absl::StatusOr<PeerId>>> connect_waiter;  // client side
    std::unordered_map<std::string, ucp_rkey_h> rkeys;
    uint64_t next_arrival = 0;
    uint64_t next_delivery = 0;
    std::map<uint64_t, std::unique_ptr<RecvContext>> pending;  // by arrival sequence
  };
  struct ErrorArg {
    UcxTransport* self;
    PeerId peer;
  };
  struct SendContext {
    UcxTransport* self;
    PeerId peer;
    std::vector<uint8_t> header;
    std::vector<ucp_dt_iov_t> iov;
    uint64_t flag = 0;
    SendDone done;
  };
  struct TagArg {
    UcxTransport* self;
    Tag tag;
  };

  void Post(std::function<void()> fn);
  void Run();
  void RunCommands();
  Peer* FindPeer(PeerId id);
  PeerId AddPeer(ucp_ep_h ep);
  absl::StatusOr<ucp_ep_h> CreateEndpoint(ucp_ep_params_t params, PeerId id);
  void ClosePeer(PeerId id, const absl::Status& why);
  void StartSend(std::unique_ptr<SendContext> ctx, Tag tag);
  void HandleHandshake(PeerId peer, std::span<const uint8_t> header);
  MessageHandler* HandlerFor(Tag tag);
  // Delivers, in arrival order, every pending message of `peer` that is complete.
  void Flush(PeerId peer);

  void AcceptBootstrap();
  static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status);
  static ucs_status_t OnMessage(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param);
  static void OnSendDone(void* request, ucs_status_t status, void* user_data);
  static void OnRecvDone(void* request, ucs_status_t status, size_t length, void* user_data);

  TransportConfig config_;
  Capabilities capabilities_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int epoll_fd_ = -1;
  size_t eager_max_bytes_ = 0;  // TransportConfig::eager_max_bytes, resolved
  std::thread thread_;

  // Held by the transport thread except while it sleeps, and by a thread that starts a
  // send itself: UCX's worker is used by one thread at a time. Guards the peer maps.
  std::mutex worker_mu_;
  std::atomic<std::thread::id> thread_id_{};
  std::mutex mu_;
  std::deque<std::function<void()>> commands_;  // guarded by mu_
  bool stop_ = false;                           // guarded by mu_
  MessageHandler* handlers_[kMaxTag + 1] = {};  // set before traffic starts
  TagArg tag_args_[kMaxTag + 1];
  PeerHandler peer_handler_;

  // Transport-thread state.
  std::unordered_map<PeerId, Peer> peers_;
  std::unordered_map<ucp_ep_h, PeerId> by_endpoint_;
  std::unordered_map<PeerId, std::unique_ptr<ErrorArg>> error_args_;
  PeerId next_peer_ = 1;
  int listen_fd_ = -1;             // bootstrap listener
  std::string worker_address_;     // this worker's UCX address, for the bootstrap
  std::vector<void*> closing_;     // ucp_ep_close_nbx requests in flight
  std::vector<ucp_mem_h> mapped_;  // regions registered for one-sided puts
};

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
    bool shared_memory = false;
    for (absl::string_view tl : absl::StrSplit(option("TLS"), ',')) {
      shared_memory = shared_memory || tl == "sm" || tl == "shm" || tl == "posix" || tl == "sysv";
    }
    eager_max_bytes_ = shared_memory ? size_t{256} << 10 : 0;
  }
  capabilities_.backend = EnumNameOf(Backend::kUcx, kBackendNames);
  capabilities_.detects_dead_peers = config_.error_mode == ErrorMode::kPeer;
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
  thread_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

UcxTransport::~UcxTransport() {
  if (thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    ucp_worker_signal(worker_);
    thread_.join();
  }
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  if (context_ != nullptr) ucp_cleanup(context_);
  if (epoll_fd_ >= 0) close(epoll_fd_);
}

void UcxTransport::Post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    commands_.push_back(std::move(fn));
  }
  ucp_worker_signal(worker_);
}

void UcxTransport::RunCommands() {
  std::deque<std::function<void()>> commands;
  {
    std::lock_guard<std::mutex> lock(mu_);
    commands.swap(commands_);
  }
  for (auto& command : commands) command();
}

void UcxTransport::Run() {
  thread_id_ = std::this_thread::get_id();
  std::unique_lock<std::mutex> worker_lock(worker_mu_);
  while (true) {
    RunCommands();
    while (ucp_worker_progress(worker_) != 0) {
    }
    bool stop, pending;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop = stop_;
      pending = !commands_.empty();
    }
    if (stop) break;
    if (pending) continue;
    const ucs_status_t status = ucp_worker_arm(worker_);
    if (status == UCS_ERR_BUSY) continue;
    // Other threads may start sends while this one sleeps (Send).
    worker_lock.unlock();
    epoll_event events[4];
    const int n = epoll_wait(epoll_fd_, events, 4, 1000);
    worker_lock.lock();
    for (int i = 0; i < n; ++i) {
      if (events[i].data.fd == listen_fd_ && listen_fd_ >= 0) AcceptBootstrap();
    }
  }
  // Shutdown: close every endpoint and the listener, and let the closes finish.
  if (listen_fd_ >= 0) {
    close(listen_fd_);
    listen_fd_ = -1;
  }
  std::vector<PeerId> ids;
  for (const auto& [id, peer] : peers_) ids.push_back(id);
  for (PeerId id : ids) ClosePeer(id, absl::CancelledError("the transport is shutting down"));
  RunCommands();
  const absl::Time deadline = absl::Now() + absl::Seconds(2);
  while (absl::Now() < deadline) {
    ucp_worker_progress(worker_);
    bool done = true;
    for (void* request : closing_) {
      done = done && ucp_request_check_status(request) != UCS_INPROGRESS;
    }
    if (done) break;
  }
  for (void* request : closing_) ucp_request_free(request);
  closing_.clear();
  for (auto& [id, peer] : peers_) {
    if (peer.connect_waiter) peer.connect_waiter->Set(absl::CancelledError("shutting down"));
  }
  for (ucp_mem_h memh : mapped_) ucp_mem_unmap(context_, memh);
  mapped_.clear();
}

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
  const bool was_ready = peer->ready;
  peer->ready = false;
  if (peer->connect_waiter) {
    peer->connect_waiter->Set(why);
    peer->connect_waiter.reset();
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
  Post([this, waiter, fd] {
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
  });
  auto result = waiter->Wait(absl::Seconds(30));
  if (!result) return absl::DeadlineExceededError("the transport thread did not answer");
  if (!result->ok()) return *result;
  return FormatAddress(bound);
}

void UcxTransport::AcceptBootstrap() {
  while (true) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN: no more
    // The client answers at once; a slow or bogus one costs at most a second.
    SetSocketTimeouts(fd, absl::Seconds(1));
    absl::StatusOr<std::string> theirs = ServerBootstrap(fd, worker_address_, config_.auth_key);
    close(fd);
    if (!theirs.ok()) {
      if (absl::IsUnauthenticated(theirs.status())) ++ProcessAuthRefusals().data_plane;
      LOG_FIRST_N(WARNING, 10) << "refused a data-plane connection: " << theirs.status().message();
      continue;
    }
    const PeerId id = AddPeer(nullptr);
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    params.address = reinterpret_cast<const ucp_address_t*>(theirs->data());
    auto ep = CreateEndpoint(params, id);
    if (!ep.ok()) {
      LOG(WARNING) << "refused a data-plane connection: " << ep.status().message();
      peers_.erase(id);
      continue;
    }
    peers_[id].ep = *ep;
    by_endpoint_[*ep] = id;
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
  absl::StatusOr<std::string> theirs =
      BootstrapClient(*addr, length, worker_address_, config_.auth_key, config_.connect_timeout);
  if (!theirs.ok()) {
    // A refused secret keeps its code (UNAUTHENTICATED): retrying does not help.
    const absl::StatusCode code = absl::IsUnauthenticated(theirs.status())
                                      ? absl::StatusCode::kUnauthenticated
                                      : absl::StatusCode::kUnavailable;
    return absl::Status(
        code, absl::StrCat("cannot connect to ", address, ": ", theirs.status().message()));
  }
  auto waiter = std::make_shared<Waiter<absl::StatusOr<PeerId>>>();
  auto id_waiter = std::make_shared<Waiter<PeerId>>();
  Post([this, waiter, id_waiter, theirs = *theirs, address] {
    const PeerId id = AddPeer(nullptr);
    id_waiter->Set(id);
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    params.address = reinterpret_cast<const ucp_address_t*>(theirs.data());
    auto ep = CreateEndpoint(params, id);
    if (!ep.ok()) {
      peers_.erase(id);
      waiter->Set(ep.status());
      return;
    }
    Peer& peer = peers_[id];
    peer.ep = *ep;
    by_endpoint_[*ep] = id;
    peer.connect_waiter = waiter;
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
  auto result = waiter->Wait(config_.connect_timeout);
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
  return *result;
}

void UcxTransport::Disconnect(PeerId peer) {
  auto waiter = std::make_shared<Waiter<bool>>();
  Post([this, peer, waiter] {
    ClosePeer(peer, absl::CancelledError("disconnected"));
    waiter->Set(true);
  });
  waiter->Wait(absl::Seconds(10));
}

std::string UcxTransport::DescribePeer(PeerId id) {
  auto waiter = std::make_shared<Waiter<std::string>>();
  Post([this, id, waiter] {
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
  });
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

ucs_status_t UcxTransport::OnMessage(void* arg, const void* header, size_t header_length,
                                     void* data, size_t length, const ucp_am_recv_param_t* param) {
  auto* tag_arg = static_cast<TagArg*>(arg);
  UcxTransport* self = tag_arg->self;
  const Tag tag = tag_arg->tag;
  PeerId id = 0;
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) != 0) {
    auto it = self->by_endpoint_.find(param->reply_ep);
    if (it != self->by_endpoint_.end()) id = it->second;
  }
  const bool rendezvous = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  Peer* peer = id == 0 ? nullptr : self->FindPeer(id);
  if (peer == nullptr || peer->closed) {
    LOG_FIRST_N(WARNING, 10) << "dropped a data-plane message from an unknown endpoint";
    return UCS_OK;  // a rendezvous descriptor is dropped with it
  }
  const std::span<const uint8_t> header_bytes(static_cast<const uint8_t*>(header), header_length);
  if (tag == 0) {
    self->HandleHandshake(id, header_bytes);
    return UCS_OK;
  }
  MessageHandler* handler = self->HandlerFor(tag);
  if (handler == nullptr || !peer->ready) {
    LOG_FIRST_N(WARNING, 10) << "dropped a data-plane message with tag " << tag
                             << (handler == nullptr ? " (no handler)" : " (before handshake)");
    return UCS_OK;
  }
  const uint64_t sequence = peer->next_arrival++;
  std::span<uint8_t> dest = handler->Place(id, header_bytes, length);
  const bool bad_place = !dest.empty() && dest.size() != length;
  if (!rendezvous && !bad_place && sequence == peer->next_delivery) {
    // Nothing earlier is outstanding: deliver now, from UCX's buffer if nothing was placed.
    ++peer->next_delivery;
    if (dest.empty()) {
      handler->Deliver(id, header_bytes, {static_cast<const uint8_t*>(data), length},
                       absl::OkStatus());
    } else {
      std::memcpy(dest.data(), data, length);
      handler->Deliver(id, header_bytes, dest, absl::OkStatus());
    }
    self->Flush(id);
    return UCS_OK;
  }
  auto owned_ctx = std::make_unique<RecvContext>();
  RecvContext* ctx = owned_ctx.get();
  ctx->self = self;
  ctx->peer = id;
  ctx->tag = tag;
  ctx->sequence = sequence;
  ctx->header.assign(header_bytes.begin(), header_bytes.end());
  ctx->dest = dest;
  peer->pending[sequence] = std::move(owned_ctx);
  if (bad_place) {
    ctx->dest = {};
    ctx->complete = true;
    ctx->status = absl::InternalError("the receiver placed a payload at a wrong size");
    self->Flush(id);
    return UCS_OK;
  }
  if (ctx->dest.empty()) {
    ctx->owned.resize(length);
    ctx->dest = {ctx->owned.data(), length};
  }
  if (!rendezvous) {
    // Held behind an earlier message: keep a copy.
    std::memcpy(ctx->dest.data(), data, length);
    ctx->complete = true;
    self->Flush(id);
    return UCS_OK;
  }
  ucp_request_param_t recv{};
  recv.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE;
  recv.cb.recv_am = &UcxTransport::OnRecvDone;
  recv.user_data = ctx;
  recv.datatype = ucp_dt_make_contig(1);
  void* request = ucp_am_recv_data_nbx(self->worker_, data, ctx->dest.data(), length, &recv);
  if (request == nullptr) {
    OnRecvDone(nullptr, UCS_OK, length, ctx);
  } else if (UCS_PTR_IS_ERR(request)) {
    OnRecvDone(nullptr, UCS_PTR_STATUS(request), 0, ctx);
  }
  return UCS_INPROGRESS;
}

void UcxTransport::OnRecvDone(void* request, ucs_status_t status, size_t, void* user_data) {
  auto* ctx = static_cast<RecvContext*>(user_data);
  if (request != nullptr) ucp_request_free(request);
  ctx->complete = true;
  ctx->status = status == UCS_OK ? absl::OkStatus() : UcxError("receive failed", status);
  ctx->self->Flush(ctx->peer);
}

MessageHandler* UcxTransport::HandlerFor(Tag tag) {
  std::lock_guard<std::mutex> lock(mu_);
  return handlers_[tag];
}

void UcxTransport::Flush(PeerId id) {
  Peer* peer = FindPeer(id);
  if (peer == nullptr) return;
  while (!peer->pending.empty()) {
    auto it = peer->pending.begin();
    if (it->first != peer->next_delivery || !it->second->complete) return;
    std::unique_ptr<RecvContext> ctx = std::move(it->second);
    peer->pending.erase(it);
    ++peer->next_delivery;
    MessageHandler* handler = HandlerFor(ctx->tag);
    handler->Deliver(id, ctx->header, ctx->dest, ctx->status);
  }
}

void UcxTransport::Send(PeerId peer, Tag tag, std::span<const uint8_t> header,
                        std::vector<std::span<const uint8_t>> payload, SendDone done) {
  auto ctx = std::make_unique<SendContext>();
  ctx->self = this;
  ctx->peer = peer;
  ctx->header.assign(header.begin(), header.end());
  for (const auto& part : payload) {
    if (part.empty()) continue;
    ctx->iov.push_back({const_cast<uint8_t*>(part.data()), part.size()});
  }
  ctx->done = std::move(done);
  // On the transport thread (a handler answering), the worker is already ours.
  if (std::this_thread::get_id() == thread_id_) {
    StartSend(std::move(ctx), tag);
    return;
  }
  // Start the send on this thread when the worker is free and nothing is queued before
  // it (which keeps the order): the transport thread need not wake up for it.
  {
    std::unique_lock<std::mutex> worker_lock(worker_mu_, std::try_to_lock);
    if (worker_lock.owns_lock()) {
      bool queue_empty;
      {
        std::lock_guard<std::mutex> lock(mu_);
        queue_empty = commands_.empty() && !stop_;
      }
      if (queue_empty) {
        StartSend(std::move(ctx), tag);
        return;
      }
    }
  }
  Post([this, ctx = ctx.release(), tag]() mutable {
    StartSend(std::unique_ptr<SendContext>(ctx), tag);
  });
}

void UcxTransport::StartSend(std::unique_ptr<SendContext> ctx, Tag tag) {
  Peer* peer = FindPeer(ctx->peer);
  if (peer == nullptr || peer->closed || peer->ep == nullptr || (tag != 0 && !peer->ready)) {
    ctx->done(
        absl::UnavailableError(absl::StrCat("data-plane peer ", ctx->peer, " is not connected")));
    return;
  }
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                       UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_FLAGS;
  param.cb.send = &UcxTransport::OnSendDone;
  param.flags = UCP_AM_SEND_FLAG_REPLY;
  size_t payload_bytes = 0;
  for (const ucp_dt_iov_t& part : ctx->iov) payload_bytes += part.length;
  if (payload_bytes <= eager_max_bytes_) param.flags |= UCP_AM_SEND_FLAG_EAGER;
  const void* buffer = nullptr;
  size_t count = 0;
  if (ctx->iov.size() == 1) {
    param.datatype = ucp_dt_make_contig(1);
    buffer = ctx->iov[0].buffer;
    count = ctx->iov[0].length;
  } else if (ctx->iov.size() > 1) {
    param.datatype = ucp_dt_make_iov();
    buffer = ctx->iov.data();
    count = ctx->iov.size();
  } else {
    param.datatype = ucp_dt_make_contig(1);
  }
  SendContext* raw = ctx.release();
  param.user_data = raw;
  void* request =
      ucp_am_send_nbx(peer->ep, tag, raw->header.data(), raw->header.size(), buffer, count, &param);
  if (request == nullptr) {
    OnSendDone(nullptr, UCS_OK, raw);
  } else if (UCS_PTR_IS_ERR(request)) {
    OnSendDone(nullptr, UCS_PTR_STATUS(request), raw);
  }
}

void UcxTransport::OnSendDone(void* request, ucs_status_t status, void* user_data) {
  std::unique_ptr<SendContext> ctx(static_cast<SendContext*>(user_data));
  if (request != nullptr) ucp_request_free(request);
  ctx->done(status == UCS_OK ? absl::OkStatus() : UcxError("send failed", status));
}

absl::StatusOr<RemoteRegion> UcxTransport::RegisterRegion(void* base, size_t bytes) {
  auto waiter = std::make_shared<Waiter<absl::StatusOr<RemoteRegion>>>();
  Post([this, waiter, base, bytes] {
    ucp_mem_map_params_t params{};
    params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    params.address = base;
    params.length = bytes;
    ucp_mem_h memh = nullptr;
    ucs_status_t status = ucp_mem_map(context_, &params, &memh);
    if (status != UCS_OK) {
      waiter->Set(UcxError("ucp_mem_map", status));
      return;
    }
    void* packed = nullptr;
    size_t packed_size = 0;
    status = ucp_rkey_pack(context_, memh, &packed, &packed_size);
    if (status != UCS_OK) {
      waiter->Set(UcxError("ucp_rkey_pack", status));
      return;
    }
    RemoteRegion region;
    region.address = reinterpret_cast<uint64_t>(base);
    region.key.assign(static_cast<const char*>(packed), packed_size);
    ucp_rkey_buffer_release(packed);
    mapped_.push_back(memh);  // the mapping lives as long as the transport
    waiter->Set(region);
  });
  auto result = waiter->Wait(absl::Seconds(30));
  if (!result) return absl::DeadlineExceededError("the transport thread did not answer");
  return *result;
}

void UcxTransport::PutWithFlag(PeerId peer_id, const RemoteRegion& region, uint64_t remote_address,
                               std::span<const uint8_t> data, uint64_t flag_address,
                               uint64_t flag_value, SendDone done) {
  Post([this, peer_id, region, remote_address, data, flag_address, flag_value,
        done = std::move(done)]() mutable {
    Peer* peer = FindPeer(peer_id);
    if (peer == nullptr || peer->closed || !peer->ready) {
      done(absl::UnavailableError("data-plane peer is not connected"));
      return;
    }
    ucp_rkey_h& rkey = peer->rkeys[region.key];
    if (rkey == nullptr) {
      const ucs_status_t status = ucp_ep_rkey_unpack(peer->ep, region.key.data(), &rkey);
      if (status != UCS_OK) {
        peer->rkeys.erase(region.key);
        done(UcxError("ucp_ep_rkey_unpack", status));
        return;
      }
    }
    ucp_request_param_t plain{};
    void* request = ucp_put_nbx(peer->ep, data.data(), data.size(), remote_address, rkey, &plain);
    if (UCS_PTR_IS_ERR(request)) {
      done(UcxError("ucp_put_nbx", UCS_PTR_STATUS(request)));
      return;
    }
    if (request != nullptr) ucp_request_free(request);  // completes in order before the flag
    ucp_worker_fence(worker_);
    auto ctx = std::make_unique<SendContext>();
    ctx->self = this;
    ctx->peer = peer_id;
    ctx->flag = flag_value;
    ctx->done = std::move(done);
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send = &UcxTransport::OnSendDone;
    SendContext* raw = ctx.release();
    param.user_data = raw;
    request = ucp_put_nbx(peer->ep, &raw->flag, sizeof(raw->flag), flag_address, rkey, &param);
    if (request == nullptr) {
      OnSendDone(nullptr, UCS_OK, raw);
    } else if (UCS_PTR_IS_ERR(request)) {
      OnSendDone(nullptr, UCS_PTR_STATUS(request), raw);
    }
  });
}

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> CreateUcxTransport(const TransportConfig& config) {
  auto transport = std::make_unique<UcxTransport>(config);
  absl::Status status = transport->Init();
  if (!status.ok()) return status;
  return transport;
}

namespace {
[[maybe_unused]] const bool registered =
    RegisterTransportBackend(Backend::kUcx, &CreateUcxTransport);
}  // namespace

}  // namespace strata::transport
