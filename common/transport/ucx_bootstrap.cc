#include "common/transport/ucx_bootstrap.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <initializer_list>
#include <string_view>

#include "absl/status/status.h"
#include "common/base/crypto.h"

namespace strata::transport {
namespace {

constexpr uint32_t kBootstrapMagic = 0x53545242;  // "STRB"
constexpr uint32_t kMaxWorkerAddress = 1 << 20;
constexpr size_t kNonceBytes = 16;

absl::Status WriteAll(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = send(fd, p, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::UnavailableError(std::strerror(errno));
    p += n;
    size -= n;
  }
  return absl::OkStatus();
}

// The whole bootstrap's deadline on this thread (ServerBootstrap, ClientBootstrap): each
// recv is bounded by the socket's timeout, but a peer that sends a byte now and then would
// otherwise keep the reads going, and the server's bootstrap runs on the transport thread.
thread_local absl::Time read_deadline = absl::InfiniteFuture();

class BootstrapDeadline {
 public:
  explicit BootstrapDeadline(absl::Duration budget) { read_deadline = absl::Now() + budget; }
  ~BootstrapDeadline() { read_deadline = absl::InfiniteFuture(); }
};

absl::Status ReadAll(int fd, void* data, size_t size) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    if (absl::Now() > read_deadline) {
      return absl::DeadlineExceededError("the peer's bootstrap took too long");
    }
    const ssize_t n = recv(fd, p, size, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) return absl::UnavailableError("the peer closed the bootstrap connection");
    if (n < 0) return absl::UnavailableError(std::strerror(errno));
    p += n;
    size -= n;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadBytes(int fd, size_t size) {
  std::string out(size, '\0');
  absl::Status s = ReadAll(fd, out.data(), size);
  if (!s.ok()) return s;
  return out;
}

absl::Status ReadMagic(int fd) {
  uint32_t magic = 0;
  absl::Status s = ReadAll(fd, &magic, sizeof(magic));
  if (!s.ok()) return s;
  if (magic != kBootstrapMagic) {
    return absl::InvalidArgumentError("not a strata data-plane peer (bad bootstrap magic)");
  }
  return absl::OkStatus();
}

// magic, then the parts as they are.
absl::Status SendParts(int fd, std::initializer_list<std::string_view> parts) {
  std::string message(sizeof(kBootstrapMagic), '\0');
  std::memcpy(message.data(), &kBootstrapMagic, sizeof(kBootstrapMagic));
  for (std::string_view part : parts) message.append(part);
  return WriteAll(fd, message.data(), message.size());
}

std::string LengthBytes(const std::string& address) {
  const uint32_t size = static_cast<uint32_t>(address.size());
  return std::string(reinterpret_cast<const char*>(&size), sizeof(size));
}

std::string Mac(const std::string& key, std::string_view label, const std::string& nonces,
                std::string_view address = {}) {
  std::string message(label);
  message += nonces;
  message += address;
  return HmacSha256(key, message);
}

// A MAC and a worker address: MAC, byte count, address. The MAC covers the address.
absl::StatusOr<std::string> ReceiveSignedAddress(int fd, const std::string& key,
                                                 std::string_view label,
                                                 const std::string& nonces) {
  absl::Status s = ReadMagic(fd);
  if (!s.ok()) return s;
  auto mac = ReadBytes(fd, kHmacSha256Bytes);
  if (!mac.ok()) return mac.status();
  uint32_t size = 0;
  s = ReadAll(fd, &size, sizeof(size));
  if (!s.ok()) return s;
  if (size == 0 || size > kMaxWorkerAddress) {
    return absl::InvalidArgumentError("bootstrap worker address of a bad size");
  }
  auto address = ReadBytes(fd, size);
  if (!address.ok()) return address.status();
  if (!ConstantTimeEquals(*mac, Mac(key, label, nonces, *address))) {
    return absl::UnauthenticatedError(
        "the peer does not hold this deployment's secret (data-plane bootstrap MAC mismatch)");
  }
  return address;
}

std::string SessionSecret(const std::string& key, const std::string& nonces) {
  return Mac(key, "session", nonces);
}

// The client's side of the bootstrap on a connected socket.
absl::StatusOr<Bootstrapped> ClientBootstrap(int fd, const std::string& ours,
                                             const std::string& key, absl::Duration budget) {
  const BootstrapDeadline deadline(budget);
  const std::string client_nonce = SecureRandomBytes(kNonceBytes);
  absl::Status s = SendParts(fd, {client_nonce});
  if (!s.ok()) return s;
  s = ReadMagic(fd);
  if (!s.ok()) return s;
  auto server_nonce = ReadBytes(fd, kNonceBytes);
  if (!server_nonce.ok()) return server_nonce.status();
  auto server_mac = ReadBytes(fd, kHmacSha256Bytes);
  if (!server_mac.ok()) return server_mac.status();
  const std::string nonces = client_nonce + *server_nonce;
  if (!ConstantTimeEquals(*server_mac, Mac(key, "server", nonces))) {
    return absl::UnauthenticatedError(
        "the peer does not hold this deployment's secret (data-plane bootstrap MAC mismatch)");
  }
  s = SendParts(fd, {Mac(key, "client", nonces, ours), LengthBytes(ours), ours});
  if (!s.ok()) return s;
  auto theirs = ReceiveSignedAddress(fd, key, "address", nonces);
  if (!theirs.ok()) return theirs.status();
  return Bootstrapped{std::move(*theirs), SessionSecret(key, nonces)};
}

}  // namespace

void SetSocketTimeouts(int fd, absl::Duration timeout) {
  timeval tv;
  tv.tv_sec = absl::ToInt64Seconds(timeout);
  tv.tv_usec = absl::ToInt64Microseconds(timeout) % 1000000;
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

void KeepAsLivenessSocket(int fd) {
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  const int on = 1, idle_s = 60, interval_s = 10, probes = 6;
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof(idle_s));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval_s, sizeof(interval_s));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof(probes));
}

absl::StatusOr<Bootstrapped> ServerBootstrap(int fd, const std::string& ours,
                                             const std::string& key, absl::Duration budget) {
  const BootstrapDeadline deadline(budget);
  absl::Status s = ReadMagic(fd);
  if (!s.ok()) return s;
  auto client_nonce = ReadBytes(fd, kNonceBytes);
  if (!client_nonce.ok()) return client_nonce.status();
  const std::string server_nonce = SecureRandomBytes(kNonceBytes);
  const std::string nonces = *client_nonce + server_nonce;
  s = SendParts(fd, {server_nonce, Mac(key, "server", nonces)});
  if (!s.ok()) return s;
  auto theirs = ReceiveSignedAddress(fd, key, "client", nonces);
  if (!theirs.ok()) return theirs.status();
  s = SendParts(fd, {Mac(key, "address", nonces, ours), LengthBytes(ours), ours});
  if (!s.ok()) return s;
  return Bootstrapped{std::move(*theirs), SessionSecret(key, nonces)};
}

bool ClientSockets::Add(int fd) {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) return false;
  fds_.insert(fd);
  return true;
}

void ClientSockets::Remove(int fd) {
  std::lock_guard<std::mutex> lock(mu_);
  fds_.erase(fd);
}

void ClientSockets::Abort() {
  std::lock_guard<std::mutex> lock(mu_);
  aborted_ = true;
  // Under the lock: a socket is removed before it is closed, so its number is not reused.
  for (int fd : fds_) shutdown(fd, SHUT_RDWR);
}

bool ClientSockets::aborted() {
  std::lock_guard<std::mutex> lock(mu_);
  return aborted_;
}

absl::StatusOr<Bootstrapped> BootstrapClient(const sockaddr_storage& addr, socklen_t length,
                                             const std::string& ours, const std::string& key,
                                             absl::Duration timeout, ClientSockets* sockets) {
  const int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError("socket() failed");
  if (sockets != nullptr && !sockets->Add(fd)) {
    close(fd);
    return absl::CancelledError("the connect was aborted");
  }
  auto fail = [&](absl::Status status) {
    if (sockets != nullptr) {
      sockets->Remove(fd);
      if (sockets->aborted()) status = absl::CancelledError("the connect was aborted");
    }
    close(fd);
    return status;
  };
  int rc = connect(fd, reinterpret_cast<const sockaddr*>(&addr), length);
  if (rc != 0 && errno == EINPROGRESS) {
    // In slices, so that an abort (which cannot wake a connect in progress) ends it soon.
    const absl::Time deadline = absl::Now() + timeout;
    pollfd p{fd, POLLOUT, 0};
    do {
      const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
      rc = poll(&p, 1, static_cast<int>(std::clamp<int64_t>(left, 0, 100)));
    } while (rc == 0 && absl::Now() < deadline && (sockets == nullptr || !sockets->aborted()));
    if (rc == 1) {
      int error = 0;
      socklen_t size = sizeof(error);
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size);
      errno = error;
      rc = error == 0 ? 0 : -1;
    } else {
      errno = rc == 0 ? ETIMEDOUT : errno;
      rc = -1;
    }
  }
  if (rc != 0) return fail(absl::UnavailableError(std::strerror(errno)));
  const int flags = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  SetSocketTimeouts(fd, timeout);
  absl::StatusOr<Bootstrapped> theirs = ClientBootstrap(fd, ours, key, timeout);
  if (!theirs.ok()) return fail(theirs.status());
  if (sockets != nullptr) sockets->Remove(fd);
  theirs->socket = fd;
  return theirs;
}

}  // namespace strata::transport
