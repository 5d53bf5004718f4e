// Internal to common/transport: the UCX backend's class, shared by the files that
// implement it by role: ucx_transport.cc (set-up and the worker loop), ucx_connections.cc
// (listening, connecting, peers and their handshake), ucx_messages.cc (sending and
// receiving active messages) and ucx_put.cc (one-sided put). ucx_bootstrap.cc exchanges
// worker addresses over TCP.
//
// Thread-safety: see UcxTransport's members.
#ifndef STRATA_COMMON_TRANSPORT_UCX_INTERNAL_H_
#define STRATA_COMMON_TRANSPORT_UCX_INTERNAL_H_

#include <sys/socket.h>
#include <ucp/api/ucp.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/base/event_loop.h"
#include "common/transport/transport.h"
#include "common/transport/ucx_bootstrap.h"

namespace strata::transport::ucx_internal {

// Unavailable, "<what>: <UCX's description of status>".
absl::Status UcxError(const std::string& what, ucs_status_t status);
// "host:port" (IPv6 hosts in brackets) to a socket address.
absl::StatusOr<sockaddr_storage> Resolve(const std::string& address, socklen_t* length);
// A socket address as "host:port".
std::string FormatAddress(const sockaddr_storage& addr);
// What calls refused, and peers closed, at shutdown get.
inline absl::Status ShuttingDown() {
  return absl::CancelledError("the transport is shutting down");
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

// The transport thread is an EventLoop whose poller is the UCX worker: it progresses the
// worker before each batch of posted commands, and sleeps on the worker's event file
// descriptor (and the bootstrap listener) when there is nothing to do.
class UcxTransport final : public Transport, private EventLoop::Poller {
 public:
  explicit UcxTransport(TransportConfig config) : config_(std::move(config)) {}
  ~UcxTransport() override;

  absl::Status Init();
  Capabilities capabilities() const override { return capabilities_; }
  int64_t LostWakeups() const override { return lost_wakeups_.load(); }
  void SetHandler(Tag tag, MessageHandler* handler) override;
  void SetPeerHandler(PeerHandler handler) override;
  absl::StatusOr<std::string> Listen(const std::string& address) override;
  absl::StatusOr<PeerId> Connect(const std::string& address) override;
  void AbortConnects() override;
  void Disconnect(PeerId peer) override;
  std::string DescribePeer(PeerId peer) override;
  std::string PeerSecret(PeerId peer) override;
  void Send(PeerId peer, Tag tag, std::span<const uint8_t> header,
            std::vector<std::span<const uint8_t>> payload, SendDone done) override;
  absl::StatusOr<RemoteRegion> RegisterRegion(void* base, size_t bytes) override;
  void PutWithFlag(PeerId peer, const RemoteRegion& region, uint64_t remote_address,
                   std::span<const uint8_t> data, uint64_t flag_address, uint64_t flag_value,
                   SendDone done) override;
  bool ProgressUntil(absl::FunctionRef<bool()> done, absl::Time deadline) override;

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
    bool ready = false;   // handshake complete
    bool closed = false;  // failed or disconnected
    int liveness = -1;    // the bootstrap's socket, kept open (ucx_bootstrap.h); -1: none
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

  // Whether this thread uses the worker now: the transport thread, or a thread inside
  // ProgressUntil (whose handlers may send).
  bool WorkerIsOurs() const;
  // The transport whose worker this thread progresses inside ProgressUntil, if any, and
  // whether a handler started a send meanwhile.
  static thread_local const UcxTransport* progressing_;
  static thread_local bool sent_while_progressing_;
  // Runs `fn` on the transport thread; false (and `fn` dropped) once it is shutting down.
  bool Post(EventLoop::Closure fn);
  // EventLoop::Poller, on the transport thread.
  void Begin() override;
  void End() override;
  void Progress() override;
  void Wait(absl::Time deadline) override;
  void Wake() override;
  // On the transport thread, at shutdown: closes every endpoint and the listener, then
  // (posted after what the closes posted) waits for the closes and lets go of the rest.
  void ClosePeers();
  void FinishShutdown();
  Peer* FindPeer(PeerId id);
  PeerId AddPeer(ucp_ep_h ep);
  void SetPeerSecret(PeerId id, std::string secret);
  absl::StatusOr<ucp_ep_h> CreateEndpoint(ucp_ep_params_t params, PeerId id);
  void ClosePeer(PeerId id, const absl::Status& why);
  // Watches the peer's liveness socket (taking it over, KeepAsLivenessSocket): its end read
  // means the peer's process exited or it disconnected (OnLivenessEvent).
  void WatchLiveness(PeerId id, int fd);
  // The liveness socket `fd` is readable: the peer closed it, unless bytes came (a peer
  // never sends any, and they are dropped). What the peer sent before it went is delivered
  // first (the worker is progressed until idle), then the peer is closed.
  void OnLivenessEvent(int fd);
  // Starts a send on the worker (held by the caller). True if it is over already (sent in
  // place, or failed); false if it is pending on the worker.
  bool StartSend(std::unique_ptr<SendContext> ctx, Tag tag);
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
  EventLoop loop_{"ucx-transport"};
  bool started_ = false;  // the loop runs
  // Wait slept until its safety bound while another thread used the worker (transport
  // thread); what Progress then finds was lost by the wake-up (LostWakeups). Work found
  // after a sleep to the bound without such a use is UCX's own: its keepalive rounds run
  // on the first progress after their interval, which no event announces.
  bool slept_to_bound_ = false;
  std::atomic<int64_t> lost_wakeups_{0};
  // Uses of the worker by threads other than the transport thread: sends they started
  // themselves (Send), and ProgressUntil's progress.
  std::atomic<uint64_t> outside_uses_{0};

  // Held by the transport thread except while it sleeps, and by a thread that starts a
  // send itself: UCX's worker is used by one thread at a time. Guards the peer maps.
  std::mutex worker_mu_;
  std::unique_lock<std::mutex> worker_lock_{worker_mu_, std::defer_lock};  // transport thread
  // Connects in progress, for AbortConnects: their bootstrap sockets (whose aborted() says
  // whether AbortConnects ran), and the handshakes they wait for (guarded by connects_mu_).
  ClientSockets connect_sockets_;
  std::mutex connects_mu_;
  std::set<std::shared_ptr<Waiter<absl::StatusOr<PeerId>>>> connect_waits_;
  std::mutex mu_;
  MessageHandler* handlers_[kMaxTag + 1] = {};       // set before traffic starts; guarded by mu_
  std::unordered_map<PeerId, std::string> secrets_;  // PeerSecret; guarded by mu_
  TagArg tag_args_[kMaxTag + 1];
  PeerHandler peer_handler_;

  // Transport-thread state.
  std::unordered_map<PeerId, Peer> peers_;
  std::unordered_map<ucp_ep_h, PeerId> by_endpoint_;
  std::unordered_map<int, PeerId> by_liveness_;  // liveness sockets
  std::unordered_map<PeerId, std::unique_ptr<ErrorArg>> error_args_;
  PeerId next_peer_ = 1;
  int listen_fd_ = -1;          // bootstrap listener
  std::string worker_address_;  // this worker's UCX address, for the bootstrap
  std::vector<void*> closing_;  // ucp_ep_close_nbx requests in flight
  // Shutting down (ClosePeers ran): the worker is progressed no more, and the peers'
  // liveness sockets close only after ucp_worker_destroy (the destructor). Progressing a
  // force-closed tcp endpoint with a rendezvous send under way while its peer closed its
  // side crashed UCX 1.13 (uct_tcp_iface_progress; tcp_ep.c's assertions), about once in
  // 20 runs of transport_test with other processes on the cores, and the more often the
  // longer the worker was progressed.
  bool shutting_down_ = false;
  std::vector<int> liveness_at_shutdown_;
  std::vector<ucp_mem_h> mapped_;  // regions registered for one-sided puts
};

}  // namespace strata::transport::ucx_internal

#endif  // STRATA_COMMON_TRANSPORT_UCX_INTERNAL_H_
