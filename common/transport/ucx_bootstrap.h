// The bootstrap of a UCX data-plane connection (internal to the UCX backend).
//
// Connections are bootstrapped over a plain TCP socket that swaps UCX worker addresses;
// both sides then create UCP endpoints from those addresses. (UCX 1.13's socket-address
// connection manager aborts the process on some peer failures, in an assertion of its
// connection-manager lane; endpoints made from worker addresses have no such lane.)
//
// The swap is authenticated both ways with the deployment's data-plane key K (see
// TransportConfig::auth_key), so only processes that hold the secret learn a worker address
// or get an endpoint (messages from endpoints made any other way are dropped, OnMessage):
//   client -> server  magic, client nonce Nc (16 bytes)
//   server -> client  magic, server nonce Ns, HMAC(K, "server" Nc Ns)
//   client -> server  magic, HMAC(K, "client" Nc Ns A), |A|, A      (A: client's address)
//   server -> client  magic, HMAC(K, "address" Nc Ns B), |B|, B     (B: server's address)
// Each side checks the other's MAC before it sends its address, and the MACs cover the
// addresses, so a man in the middle can neither learn nor swap them. Both sides then hold
// HMAC(K, "session" Nc Ns), a secret of this connection alone (Transport::PeerSecret).
//
// The socket stays open for as long as the connection lasts, with nothing more sent on it:
// the liveness socket. When either process exits, however it dies, its kernel closes the
// socket and the other side reads its end. That is how a dead peer is found over UCX
// transports that cannot find one themselves (shared memory, error mode none), and how a
// Disconnect reaches the other side over any of them (UcxTransport::OnLivenessEvent).
#ifndef STRATA_COMMON_TRANSPORT_UCX_BOOTSTRAP_H_
#define STRATA_COMMON_TRANSPORT_UCX_BOOTSTRAP_H_

#include <sys/socket.h>

#include <mutex>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace strata::transport {

// Send and receive timeouts on a blocking socket.
void SetSocketTimeouts(int fd, absl::Duration timeout);

// What a bootstrap gives each side: the other's worker address, and the connection's
// secret, HMAC(K, "session" Nc Ns).
struct Bootstrapped {
  std::string address;
  std::string secret;
  int socket = -1;  // BootstrapClient: the liveness socket, the caller's to close
};

// Turns the bootstrap's socket into the connection's liveness socket: non-blocking, with
// TCP keepalive (a peer whose host is gone, or a path that dropped the connection, is
// found within about two minutes, and idle connections stay known to middleboxes).
void KeepAsLivenessSocket(int fd);

// The server's side on an accepted socket: the client's worker address once the client
// proved that it holds `key`; UNAUTHENTICATED when it did not, DEADLINE_EXCEEDED when its
// reads took past `budget` in all (each read is bounded by the socket's timeout besides).
absl::StatusOr<Bootstrapped> ServerBootstrap(int fd, const std::string& ours,
                                             const std::string& key, absl::Duration budget);

// The sockets of the bootstraps in progress on the client's side, so that they can be cut
// short: Abort shuts each down (its connect or read returns at once) and makes later ones
// fail before they start. Thread-safe.
class ClientSockets {
 public:
  // False (nothing added) once aborted.
  bool Add(int fd);
  // Before `fd` is closed or handed on.
  void Remove(int fd);
  void Abort();
  bool aborted();

 private:
  std::mutex mu_;
  std::set<int> fds_;
  bool aborted_ = false;
};

// Connects to `addr` (with a deadline), runs the client's side: the server's worker
// address, and the socket, to keep as the liveness socket; UNAUTHENTICATED when the server
// does not hold `key`; CANCELLED when `sockets` (if given) was aborted before or meanwhile.
absl::StatusOr<Bootstrapped> BootstrapClient(const sockaddr_storage& addr, socklen_t length,
                                             const std::string& ours, const std::string& key,
                                             absl::Duration timeout,
                                             ClientSockets* sockets = nullptr);

}  // namespace strata::transport

#endif  // STRATA_COMMON_TRANSPORT_UCX_BOOTSTRAP_H_
