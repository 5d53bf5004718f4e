// The data plane: tagged messages between nodes (docs/architecture.md, "Planes").
//
// A message is a small header plus a payload, sent to a peer and handed to the receiver's
// handler for its tag. Messages to one peer arrive in the order they were sent. Every
// transport runs one thread of its own ("the transport thread") that drives the network
// and sleeps in a blocking wait (for UCX: its wakeup file descriptor in epoll) whenever
// nothing is in flight; it never spins. Handlers and completion callbacks run on that
// thread, or on a thread that progresses the transport itself for a bounded time
// (ProgressUntil), and must be short: they hand work to other threads.
//
// A receive is in two parts, so that large payloads can land where they are needed with
// no extra copy (UCX rendezvous): the handler first says where the payload goes (Place),
// then is told when it is there (Deliver).
//
// Backends (TransportConfig::backend):
//   - "ucx": UCX active messages over whatever UCX selects: tcp and shared memory here,
//     InfiniBand/RoCE verbs where present, and device memory where UCX is built with CUDA.
//     Connections are made through UCX's socket-address listener ("host:port").
//   - "inproc": queues between transports of one process, for tests. Addresses are names.
//
// Peer failure: a dead peer (its process exited, however it died) or one that disconnected
// is reported through the peer handler, and every send to it fails. UCX finds it on the
// connection where it can (error mode kPeer over tcp or verbs); over shared memory, which
// cannot, the connection's liveness socket finds it (ucx_bootstrap.h), on every transport
// alike. A hung peer is never detected by the transport: callers put deadlines on every
// wait.
//
// Thread-safety: all public methods may be called from any thread.
#ifndef STRATA_COMMON_TRANSPORT_TRANSPORT_H_
#define STRATA_COMMON_TRANSPORT_TRANSPORT_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/base/enum_names.h"

namespace strata::transport {

enum class Backend { kUcx, kInproc };
inline constexpr EnumName<Backend> kBackendNames[] = {{Backend::kUcx, "ucx"},
                                                      {Backend::kInproc, "inproc"}};
// UCX's own peer-failure handling: kPeer (tcp or IB); kNone allows shared memory, whose
// dead peers the liveness sockets find instead.
enum class ErrorMode { kPeer, kNone };
inline constexpr EnumName<ErrorMode> kErrorModeNames[] = {{ErrorMode::kPeer, "peer"},
                                                          {ErrorMode::kNone, "none"}};
inline bool AbslParseFlag(absl::string_view text, Backend* out, std::string* error) {
  return ParseEnumName(text, kBackendNames, out, error);
}
inline std::string AbslUnparseFlag(Backend b) { return EnumNameOf(b, kBackendNames); }
inline bool AbslParseFlag(absl::string_view text, ErrorMode* out, std::string* error) {
  return ParseEnumName(text, kErrorModeNames, out, error);
}
inline std::string AbslUnparseFlag(ErrorMode m) { return EnumNameOf(m, kErrorModeNames); }

// Whether a UCX_TLS list names one of UCX's shared-memory transports (sm, shm, posix,
// sysv), which need error mode kNone.
bool UcxTlsNamesSharedMemory(absl::string_view tls);

// A connection to one peer, local to one transport.
using PeerId = uint64_t;
// Message kinds; one handler per tag. Tag 0 is reserved for the transport's own handshake.
using Tag = uint16_t;
inline constexpr Tag kMaxTag = 15;

struct TransportConfig {
  Backend backend = Backend::kUcx;
  ErrorMode error_mode = ErrorMode::kPeer;  // UCX only
  // UCX configuration overrides, as UCX_<KEY> environment variables would set them
  // (e.g. {"TLS", "tcp"}, {"NET_DEVICES", "lo"}). The environment applies otherwise.
  std::map<std::string, std::string> ucx_options;
  // UCX: messages whose payload is at most this many bytes are always sent eagerly (copied
  // through UCX's buffers), never by rendezvous. A rendezvous handshake needs the sender's
  // transport thread to wake up again mid-message, which with blocking waits costs a
  // wake-up on each side; over shared memory two copies of a few hundred KiB are cheaper.
  // -1: 256 KiB where the UCX transports include shared memory (sm, posix, sysv), else 0;
  // 0: UCX's own thresholds.
  int64_t eager_max_bytes = -1;
  // How long Connect waits for the peer's handshake.
  absl::Duration connect_timeout = absl::Seconds(10);
  // UCX: key of the bootstrap's mutual HMAC challenge (the deployment's data-plane key,
  // common/control/cluster_auth.h). Both ends must hold the same key; "" is the key of
  // deployments run with --insecure_control_plane.
  std::string auth_key;
  // UCX: the largest payload a receiver holds a copy of (a message it must receive by
  // rendezvous or keep behind an earlier one, where the handler placed nothing). A larger
  // one is dropped unread and delivered as an error, so that a peer cannot make this
  // process allocate what it claims. The memory node's layer frames are at most 2 GiB.
  uint64_t max_held_bytes = (uint64_t{2} << 30) + (64 << 10);
};

// What a transport can do, reported at start-up and at registration.
struct Capabilities {
  std::string backend;  // "ucx" or "inproc"
  std::string details;  // e.g. UCX's selected transports and devices
  bool detects_dead_peers = false;
  bool one_sided_put = false;  // Put into a registered region plus a completion flag
  bool device_memory = false;  // can register GPU memory (UCX built with CUDA)
  std::string ToString() const;
};

enum class PeerEvent {
  kConnected,     // a peer connected to this transport's listener (server side)
  kDisconnected,  // the peer failed or closed; sends to it fail from now on
};

class MessageHandler {
 public:
  virtual ~MessageHandler() = default;
  // Where the payload of `payload_bytes` bytes goes: a span of exactly that size, or an
  // empty span to let the transport keep it in a buffer of its own (valid during Deliver).
  virtual std::span<uint8_t> Place(PeerId from, std::span<const uint8_t> header,
                                   size_t payload_bytes) = 0;
  // The payload is in place. When the receive failed, `status` says why and `payload` is
  // the span Place returned (or empty), with undefined contents. Every span Place returns
  // comes back in exactly one Deliver, also when its sender dies mid-transfer (with an
  // error), on a transport that detects dead peers: the handler may keep what backs the
  // span until then.
  virtual void Deliver(PeerId from, std::span<const uint8_t> header,
                       std::span<const uint8_t> payload, absl::Status status) = 0;
};

// Called once a send's buffers may be reused: OK, or why the message was not delivered.
using SendDone = std::function<void(absl::Status)>;
using PeerHandler = std::function<void(PeerId, PeerEvent, const absl::Status&)>;

// Remote access to a registered region (optional capability).
struct RemoteRegion {
  uint64_t address = 0;
  std::string key;  // packed remote key, opaque
};

class Transport {
 public:
  // A transport of `config.backend`. The backends are separate libraries
  // (//common/transport:ucx_transport, :inproc_transport); a binary has those it links, and
  // Create fails with FailedPrecondition for any other.
  static absl::StatusOr<std::unique_ptr<Transport>> Create(const TransportConfig& config);
  // Returns once the transport's own thread has ended, so that no handler runs on it
  // after. A handler still running there when the destructor begins may send on the
  // transport: the send fails, or its completion is dropped (transport_test,
  // AHandlerMaySendWhileItsTransportIsDestroyed).
  virtual ~Transport() = default;

  virtual Capabilities capabilities() const = 0;

  // Handlers are set before Listen or Connect and live as long as the transport.
  virtual void SetHandler(Tag tag, MessageHandler* handler) = 0;
  virtual void SetPeerHandler(PeerHandler handler) = 0;

  // Accepts connections at "host:port" (port 0 picks one); returns the bound address.
  virtual absl::StatusOr<std::string> Listen(const std::string& address) = 0;
  // Connects to a listening transport and completes a version handshake.
  virtual absl::StatusOr<PeerId> Connect(const std::string& address) = 0;
  // Makes every Connect in progress return at once (CANCELLED), and every later one fail:
  // for an owner about to destroy the transport while threads of its own still connect,
  // one of them perhaps to a peer that accepted the connection and hung.
  virtual void AbortConnects() {}
  // Closes the connection and returns once it is closed: pending sends complete with an
  // error and no payload of the peer lands in a placed buffer afterwards. Not for handlers.
  virtual void Disconnect(PeerId peer) = 0;
  // What carries traffic to `peer` (UCX: the transport and device of each lane), for logs.
  virtual std::string DescribePeer(PeerId peer) = 0;
  // 32 bytes that the two ends of the connection to `peer` share and nobody else learns,
  // fresh for every connection: UCX derives them from the bootstrap's nonces and the
  // deployment's key, the in-process backend draws them. For keys of a connection's own
  // (the step channel's seals, common/protocol/step_frame.h). Empty for an unknown peer.
  // Thread-safe, handlers included.
  virtual std::string PeerSecret(PeerId peer) = 0;

  // Sends `header` and the concatenation of `payload` to `peer`. The header is copied at
  // once; the payload buffers must stay valid until `done` runs.
  virtual void Send(PeerId peer, Tag tag, std::span<const uint8_t> header,
                    std::vector<std::span<const uint8_t>> payload, SendDone done) = 0;

  // One-sided put (Capabilities::one_sided_put): registers local memory for remote writes
  // (returns what a peer needs to write there), and writes `data` at `remote_address` of a
  // peer's region followed, in order, by the 8-byte `flag_value` at `flag_address`.
  virtual absl::StatusOr<RemoteRegion> RegisterRegion(void* base, size_t bytes);
  virtual void PutWithFlag(PeerId peer, const RemoteRegion& region, uint64_t remote_address,
                           std::span<const uint8_t> data, uint64_t flag_address,
                           uint64_t flag_value, SendDone done);

  // Progresses the transport on the calling thread until `done()` holds or `deadline`
  // passes, and returns done(). For a thread that expects an answer within microseconds
  // and would otherwise sleep and be woken for it through the transport thread (two
  // wake-ups; a compute node's step thread, once per layer). Handlers and completion
  // callbacks may run on this thread meanwhile; the caller holds no lock they take. Between
  // rounds the thread yields its core, so that a thread woken on the same core (a memory
  // node's, answering) runs at once. If a handler started a send meanwhile, it wakes the
  // transport thread on the way out, for a send left pending. On the transport thread,
  // inside a handler of another ProgressUntil, and by default (a backend with nothing to
  // progress) it checks done() once.
  virtual bool ProgressUntil(absl::FunctionRef<bool()> done, absl::Time deadline) { return done(); }

  // Times the transport's thread, asleep waiting for traffic while another thread used the
  // transport (a send it started itself, its own progress), was not woken by the work that
  // left and found it only when its safety bound on the sleep ran out (UCX: one second).
  // Each is a message that waited that long for nothing; anything but 0 is a bug. (Work
  // that the transport's own timers start, found at the bound, is not one: UCX runs its
  // keepalive rounds on the first progress after their interval.)
  virtual int64_t LostWakeups() const { return 0; }
};

// Makes `backend` available to Transport::Create. Each backend's library calls this from a
// static initializer (its target is alwayslink), so linking the library is what enables it.
using TransportFactory = absl::StatusOr<std::unique_ptr<Transport>> (*)(const TransportConfig&);
bool RegisterTransportBackend(Backend backend, TransportFactory factory);

// Convenience for tests and simple callers: blocks until `done` of a send runs.
absl::Status SendAndWait(Transport& transport, PeerId peer, Tag tag,
                         std::span<const uint8_t> header,
                         std::vector<std::span<const uint8_t>> payload, absl::Duration timeout);

}  // namespace strata::transport

#endif  // STRATA_COMMON_TRANSPORT_TRANSPORT_H_
