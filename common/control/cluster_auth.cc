#include "common/control/cluster_auth.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/crypto.h"
#include "common/base/file.h"
#include "common/base/logging.h"

namespace strata {
namespace {

// Labels that separate the keys derived from one secret.
constexpr char kControlLabel[] = "strata control-plane token v1";
constexpr char kDataPlaneLabel[] = "strata data-plane bootstrap key v1";

// The file's contents; errors name the flag that gave the path.
absl::StatusOr<std::string> ReadFile(const std::string& path, const std::string& flag) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) {
    return absl::Status(text.status().code(), absl::StrCat(flag, "=", text.status().message()));
  }
  return text;
}

}  // namespace

absl::StatusOr<std::string> ReadSecretFile(const std::string& path, const std::string& flag,
                                           size_t min_bytes) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(
        absl::StrCat(flag, "=", path, ": no such file (", std::strerror(errno), ")"));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, "=", path, ": not a regular file"));
  }
  if ((st.st_mode & 077) != 0) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "%s=%s: the secret is accessible to group or others (mode %04o); run chmod 600 on it", flag,
        path, st.st_mode & 07777));
  }
  auto text = ReadFile(path, flag);
  if (!text.ok()) return text.status();
  std::string secret(absl::StripTrailingAsciiWhitespace(*text));
  if (secret.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, "=", path, ": the file is empty"));
  }
  if (secret.size() < min_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, "=", path, ": the secret has ", secret.size(), " bytes; use at least ",
                     min_bytes, " (e.g. head -c 32 /dev/urandom | base64)"));
  }
  return secret;
}

absl::Status WriteClusterSecret(const std::string& path) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot create the cluster secret ", path, ": ", std::strerror(errno)));
  }
  const std::string secret = HexEncode(SecureRandomBytes(32)) + "\n";
  const bool written =
      write(fd, secret.data(), secret.size()) == static_cast<ssize_t>(secret.size());
  const bool closed = close(fd) == 0;
  if (!written || !closed) {
    return absl::UnavailableError(absl::StrCat("cannot write the cluster secret ", path));
  }
  return absl::OkStatus();
}

void ClusterAuth::SetSecret(const std::string& secret) {
  token_ = HexEncode(HmacSha256(secret, kControlLabel));
  data_plane_key_ = HmacSha256(secret, kDataPlaneLabel);
}

absl::StatusOr<std::shared_ptr<const ClusterAuth>> ClusterAuth::Load(
    const ClusterAuthOptions& options) {
  auto auth = std::shared_ptr<ClusterAuth>(new ClusterAuth);
  if (options.insecure && !options.secret_file.empty()) {
    return absl::InvalidArgumentError(
        "--insecure_control_plane and --cluster_secret_file contradict each other; pass one");
  }
  if (options.insecure) {
    LOG(WARNING) << "--insecure_control_plane: the control plane and data-plane bootstrap "
                    "accept anyone who can reach their ports; use it for local experiments only";
  } else if (options.secret_file.empty()) {
    return absl::InvalidArgumentError(
        "no cluster secret: pass --cluster_secret_file=FILE (the deployment's shared secret, "
        "a file of mode 0600; deploy/local/serve makes one per run), or "
        "--insecure_control_plane for a local experiment");
  } else {
    auto secret =
        ReadSecretFile(options.secret_file, "--cluster_secret_file", kMinClusterSecretBytes);
    if (!secret.ok()) return secret.status();
    auth->SetSecret(*secret);
  }
  const bool any_tls = !options.tls_cert_file.empty() || !options.tls_key_file.empty() ||
                       !options.tls_ca_file.empty();
  if (any_tls) {
    if (options.tls_cert_file.empty() || options.tls_key_file.empty() ||
        options.tls_ca_file.empty()) {
      return absl::InvalidArgumentError(
          "control-plane TLS needs all of --control_tls_cert, --control_tls_key and "
          "--control_tls_ca");
    }
    auto cert = ReadFile(options.tls_cert_file, "--control_tls_cert");
    if (!cert.ok()) return cert.status();
    auto key = ReadFile(options.tls_key_file, "--control_tls_key");
    if (!key.ok()) return key.status();
    auto ca = ReadFile(options.tls_ca_file, "--control_tls_ca");
    if (!ca.ok()) return ca.status();
    for (const auto& [text, flag] : {std::pair{&*cert, "--control_tls_cert"},
                                     {&*key, "--control_tls_key"},
                                     {&*ca, "--control_tls_ca"}}) {
      if (text->find("-----BEGIN ") == std::string::npos) {
        return absl::InvalidArgumentError(absl::StrCat(flag, ": not a PEM file"));
      }
    }
    auth->tls_cert_ = *cert;
    auth->tls_key_ = *key;
    auth->tls_ca_ = *ca;
    auth->tls_server_name_ = options.tls_server_name;
  }
  return std::shared_ptr<const ClusterAuth>(std::move(auth));
}

std::shared_ptr<const ClusterAuth> ClusterAuth::ForSecret(const std::string& secret) {
  auto auth = std::shared_ptr<ClusterAuth>(new ClusterAuth);
  auth->SetSecret(secret);
  return auth;
}

std::shared_ptr<const ClusterAuth> ClusterAuth::Insecure() {
  return std::shared_ptr<const ClusterAuth>(new ClusterAuth);
}

std::shared_ptr<grpc::ServerCredentials> ClusterAuth::ServerCredentials() const {
  if (!tls()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions ssl(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  ssl.pem_root_certs = tls_ca_;
  ssl.pem_key_cert_pairs.push_back({tls_key_, tls_cert_});
  return grpc::SslServerCredentials(ssl);
}

std::shared_ptr<grpc::Channel> ClusterAuth::CreateChannel(const std::string& target,
                                                          grpc::ChannelArguments args) const {
  if (!tls()) return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = tls_ca_;
  ssl.pem_private_key = tls_key_;
  ssl.pem_cert_chain = tls_cert_;
  if (!tls_server_name_.empty()) args.SetSslTargetNameOverride(tls_server_name_);
  return grpc::CreateCustomChannel(target, grpc::SslCredentials(ssl), args);
}

void ClusterAuth::Attach(grpc::ClientContext* context) const {
  if (!token_.empty()) context->AddMetadata(kClusterTokenMetadata, token_);
}

grpc::Status ClusterAuth::Check(const grpc::ServerContext* context) const {
  if (token_.empty()) return grpc::Status::OK;
  const auto& metadata = context->client_metadata();
  auto it = metadata.find(kClusterTokenMetadata);
  if (it != metadata.end() &&
      ConstantTimeEquals(std::string_view(it->second.data(), it->second.size()), token_)) {
    return grpc::Status::OK;
  }
  const uint64_t refused = ++ProcessAuthRefusals().control;
  const bool log = refused <= 10 || (refused & (refused - 1)) == 0;  // then powers of two
  LOG_IF(WARNING, log) << "refused a control-plane call from " << context->peer() << " ("
                       << (it == metadata.end() ? "no cluster token" : "a wrong cluster token")
                       << "; " << refused << " refused so far)";
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      it == metadata.end()
                          ? "this deployment's control plane needs its cluster token"
                          : "wrong cluster token: the caller has another deployment's secret");
}

}  // namespace strata
