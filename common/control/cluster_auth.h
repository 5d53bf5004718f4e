// Authentication of the deployment's own processes to each other: the scheduler, compute
// nodes and memory nodes share one secret per deployment (--cluster_secret_file), and every
// internal channel proves knowledge of it:
//   - gRPC control calls, both directions, carry a token derived from the secret in the
//     "x-strata-cluster-token" metadata; a call without it is refused with UNAUTHENTICATED
//     and counted (strata_unauthenticated_total{channel="control"}).
//   - The data-plane bootstrap runs a mutual HMAC challenge over the connection's nonces and
//     UCX worker addresses (common/transport/ucx_transport.cc), keyed by data_plane_key().
// grpc.health.v1.Health, which kubelet probes call without credentials, stays open.
//
// The token never changes during a deployment, so on a network that others can sniff it
// must travel inside TLS: --control_tls_cert/--control_tls_key/--control_tls_ca turn on
// mutual TLS for the control plane (README.md, "Security").
//
// Thread-safety: immutable after Load; shared by every thread of a process.
#ifndef STRATA_COMMON_CONTROL_CLUSTER_AUTH_H_
#define STRATA_COMMON_CONTROL_CLUSTER_AUTH_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace strata {

inline constexpr char kClusterTokenMetadata[] = "x-strata-cluster-token";
// Shortest secret accepted, in bytes (after trailing whitespace is dropped).
inline constexpr size_t kMinClusterSecretBytes = 16;

struct ClusterAuthOptions {
  std::string secret_file;      // the deployment's secret; mode 0600 or stricter
  bool insecure = false;        // no secret: anyone who reaches a port is trusted
  std::string tls_cert_file;    // PEM certificate of this process (server and client)
  std::string tls_key_file;     // its private key
  std::string tls_ca_file;      // CA that signed every process's certificate
  std::string tls_server_name;  // name to expect in servers' certificates ("": the host)
};

// Reads a secret from a file that only its owner may access: a clear error, naming `flag`
// and the file, when it is missing, not a regular file, accessible to group or others, empty
// or shorter than `min_bytes`. Trailing whitespace is dropped.
absl::StatusOr<std::string> ReadSecretFile(const std::string& path, const std::string& flag,
                                           size_t min_bytes);

// Writes a new random secret (32 bytes, hex) to `path`, which must not exist, with mode 0600.
absl::Status WriteClusterSecret(const std::string& path);

class ClusterAuth {
 public:
  // Reads and checks the secret file (and the TLS files when given). Errors name the file
  // and the flag: no secret and no --insecure_control_plane, a missing, empty, too short or
  // group/other-accessible file, a secret given together with --insecure_control_plane.
  static absl::StatusOr<std::shared_ptr<const ClusterAuth>> Load(const ClusterAuthOptions& options);
  // For tests and benchmarks in one process.
  static std::shared_ptr<const ClusterAuth> ForSecret(const std::string& secret);
  static std::shared_ptr<const ClusterAuth> Insecure();

  bool insecure() const { return token_.empty(); }
  bool tls() const { return !tls_cert_.empty(); }
  // Key of the data-plane bootstrap's HMAC ("" when insecure).
  const std::string& data_plane_key() const { return data_plane_key_; }

  // Credentials for the control plane's listening ports and channels (TLS when configured).
  std::shared_ptr<grpc::ServerCredentials> ServerCredentials() const;
  std::shared_ptr<grpc::Channel> CreateChannel(const std::string& target,
                                               grpc::ChannelArguments args = {}) const;
  // Adds this deployment's token to an outgoing call.
  void Attach(grpc::ClientContext* context) const;
  // OK for a call that carries the token (always, when insecure); UNAUTHENTICATED, logged
  // once in a while and counted, otherwise.
  grpc::Status Check(const grpc::ServerContext* context) const;

 private:
  ClusterAuth() = default;
  void SetSecret(const std::string& secret);

  std::string token_;  // hex HMAC of a fixed label under the secret; "" when insecure
  std::string data_plane_key_;
  std::string tls_cert_, tls_key_, tls_ca_, tls_server_name_;
};

}  // namespace strata

#endif  // STRATA_COMMON_CONTROL_CLUSTER_AUTH_H_
