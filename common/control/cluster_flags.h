// The flags that give a process its deployment's credentials, shared by the server, the
// compute node and the memory node (see cluster_auth.h):
//   --cluster_secret_file=FILE   the deployment's shared secret (mode 0600)
//   --insecure_control_plane     run without one (local experiments; warns)
//   --control_tls_cert/--control_tls_key/--control_tls_ca/--control_tls_server_name
//                                mutual TLS on the control plane
#ifndef STRATA_COMMON_CONTROL_CLUSTER_FLAGS_H_
#define STRATA_COMMON_CONTROL_CLUSTER_FLAGS_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/control/cluster_auth.h"

namespace strata {

// What the flags say; ClusterAuth::Load reads the files.
ClusterAuthOptions ClusterAuthOptionsFromFlags();
// Loads the credentials the flags name. Call after the flags and the model are checked, so
// that their errors come first.
absl::StatusOr<std::shared_ptr<const ClusterAuth>> ClusterAuthFromFlags();

// The user-facing API key: from `key` (a flag), else from `file` (trailing whitespace
// dropped; must not be accessible to group or others), else from the environment variable
// `env`; "" when none is given. Giving both the flag and the file is an error.
absl::StatusOr<std::string> ApiKeyFromFlags(const std::string& key, const std::string& file,
                                            const char* env);

}  // namespace strata

#endif  // STRATA_COMMON_CONTROL_CLUSTER_FLAGS_H_
