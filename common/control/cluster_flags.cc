#include "common/control/cluster_flags.h"

#include <cstdlib>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, cluster_secret_file, "",
          "File holding the deployment's shared secret (mode 0600, at least 16 bytes); every "
          "process of a deployment gets the same one. Required unless --insecure_control_plane");
ABSL_FLAG(bool, insecure_control_plane, false,
          "Run the control plane and data-plane bootstrap without a secret: anyone who can reach "
          "their ports can drive this process. Local experiments only");
ABSL_FLAG(std::string, control_tls_cert, "",
          "PEM certificate for mutual TLS on the control plane (with --control_tls_key and "
          "--control_tls_ca)");
ABSL_FLAG(std::string, control_tls_key, "", "PEM private key of --control_tls_cert");
ABSL_FLAG(std::string, control_tls_ca, "",
          "PEM CA certificate that signed every process's control-plane certificate");
ABSL_FLAG(std::string, control_tls_server_name, "",
          "Name to expect in the peers' certificates (default: the host of their address)");

namespace strata {

absl::StatusOr<std::shared_ptr<const ClusterAuth>> ClusterAuthFromFlags() {
  return ClusterAuth::Load(ClusterAuthOptionsFromFlags());
}

ClusterAuthOptions ClusterAuthOptionsFromFlags() {
  ClusterAuthOptions options;
  options.secret_file = absl::GetFlag(FLAGS_cluster_secret_file);
  options.insecure = absl::GetFlag(FLAGS_insecure_control_plane);
  options.tls_cert_file = absl::GetFlag(FLAGS_control_tls_cert);
  options.tls_key_file = absl::GetFlag(FLAGS_control_tls_key);
  options.tls_ca_file = absl::GetFlag(FLAGS_control_tls_ca);
  options.tls_server_name = absl::GetFlag(FLAGS_control_tls_server_name);
  return options;
}

absl::StatusOr<std::string> ApiKeyFromFlags(const std::string& key, const std::string& file,
                                            const char* env) {
  if (!key.empty() && !file.empty()) {
    return absl::InvalidArgumentError("--api_key and --api_key_file contradict each other");
  }
  if (!key.empty()) return key;
  if (!file.empty()) return ReadSecretFile(file, "--api_key_file", 1);
  const char* value = std::getenv(env);
  return std::string(value != nullptr ? value : "");
}

}  // namespace strata
