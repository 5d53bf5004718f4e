#include "common/control/cluster_auth.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/crypto.h"
#include "proto/control.grpc.pb.h"

namespace strata {
namespace {

std::string TmpDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

std::string WriteFile(const std::string& name, const std::string& text, mode_t mode) {
  const std::string path = TmpDir() + "/" + name;
  std::filesystem::remove(path);
  std::ofstream(path) << text;
  chmod(path.c_str(), mode);
  return path;
}

absl::Status LoadError(ClusterAuthOptions options) {
  auto auth = ClusterAuth::Load(options);
  return auth.ok() ? absl::OkStatus() : auth.status();
}

TEST(ClusterAuthTest, SecretFileErrorsNameTheFlagAndTheFile) {
  ClusterAuthOptions none;
  absl::Status s = LoadError(none);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--cluster_secret_file"), std::string::npos) << s;
  EXPECT_NE(s.message().find("--insecure_control_plane"), std::string::npos) << s;

  ClusterAuthOptions missing{.secret_file = TmpDir() + "/no-such-secret"};
  s = LoadError(missing);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("no-such-secret"), std::string::npos) << s;

  ClusterAuthOptions empty{.secret_file = WriteFile("empty", "\n", 0600)};
  s = LoadError(empty);
  EXPECT_NE(s.message().find("empty"), std::string::npos) << s;

  ClusterAuthOptions short_secret{.secret_file = WriteFile("short", "abc\n", 0600)};
  s = LoadError(short_secret);
  EXPECT_NE(s.message().find("at least 16"), std::string::npos) << s;

  for (const mode_t mode : {0644, 0640, 0604, 0620}) {
    ClusterAuthOptions open{.secret_file = WriteFile("open", std::string(32, 'x'), mode)};
    s = LoadError(open);
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << std::oct << mode;
    EXPECT_NE(s.message().find("chmod 600"), std::string::npos) << s;
  }

  ClusterAuthOptions dir{.secret_file = TmpDir()};
  EXPECT_FALSE(LoadError(dir).ok());

  ClusterAuthOptions both{.secret_file = WriteFile("both", std::string(32, 'x'), 0600),
                          .insecure = true};
  s = LoadError(both);
  EXPECT_NE(s.message().find("contradict"), std::string::npos) << s;

  ClusterAuthOptions half_tls{.secret_file = WriteFile("s", std::string(32, 'x'), 0600),
                              .tls_cert_file = "/x"};
  s = LoadError(half_tls);
  EXPECT_NE(s.message().find("--control_tls_key"), std::string::npos) << s;
}

TEST(ClusterAuthTest, GoodSecretsLoad) {
  ClusterAuthOptions ok{.secret_file = WriteFile("good", std::string(32, 'q') + "\n", 0600)};
  auto auth = ClusterAuth::Load(ok);
  ASSERT_TRUE(auth.ok()) << auth.status();
  EXPECT_FALSE((*auth)->insecure());
  EXPECT_EQ((*auth)->data_plane_key().size(), 32u);
  // Trailing whitespace (a newline from echo) does not change the secret.
  EXPECT_EQ((*auth)->data_plane_key(),
            ClusterAuth::ForSecret(std::string(32, 'q'))->data_plane_key());
  ClusterAuthOptions read_only{.secret_file = WriteFile("ro", std::string(32, 'q'), 0400)};
  EXPECT_TRUE(ClusterAuth::Load(read_only).ok());
  ClusterAuthOptions insecure{.insecure = true};
  auth = ClusterAuth::Load(insecure);
  ASSERT_TRUE(auth.ok());
  EXPECT_TRUE((*auth)->insecure());
  EXPECT_TRUE((*auth)->data_plane_key().empty());
}

// A Scheduler service whose handlers only check credentials: the thing under test is the
// credential plumbing through a real gRPC server and channel.
class CheckingService final : public control::Scheduler::Service {
 public:
  explicit CheckingService(std::shared_ptr<const ClusterAuth> auth) : auth_(std::move(auth)) {}
  grpc::Status Register(grpc::ServerContext* context, const control::RegisterRequest*,
                        control::RegisterResponse* response) override {
    if (grpc::Status s = auth_->Check(context); !s.ok()) return s;
    response->set_node_id(7);
    return grpc::Status::OK;
  }

 private:
  std::shared_ptr<const ClusterAuth> auth_;
};

struct TestServer {
  TestServer(std::shared_ptr<const ClusterAuth> auth) : service(auth) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", auth->ServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
  }
  ~TestServer() { server->Shutdown(); }
  CheckingService service;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

grpc::Status Call(const ClusterAuth& client, int port, bool attach = true) {
  auto stub = control::Scheduler::NewStub(client.CreateChannel(absl::StrCat("127.0.0.1:", port)));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  if (attach) client.Attach(&context);
  control::RegisterResponse response;
  return stub->Register(&context, control::RegisterRequest(), &response);
}

TEST(ClusterAuthTest, CallsNeedTheDeploymentsToken) {
  auto auth = ClusterAuth::ForSecret("the deployment's secret, 32 bytes");
  TestServer server(auth);
  ASSERT_NE(server.port, 0);
  const uint64_t refused_before = ProcessAuthRefusals().control.load();
  EXPECT_TRUE(Call(*auth, server.port).ok());
  EXPECT_EQ(Call(*auth, server.port, /*attach=*/false).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Call(*ClusterAuth::Insecure(), server.port).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  const grpc::Status wrong =
      Call(*ClusterAuth::ForSecret("another deployment's secret....."), server.port);
  EXPECT_EQ(wrong.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(wrong.error_message().find("wrong cluster token"), std::string::npos);
  EXPECT_EQ(ProcessAuthRefusals().control.load(), refused_before + 3);
  // The server keeps serving after refusals.
  EXPECT_TRUE(Call(*auth, server.port).ok());
}

TEST(ClusterAuthTest, InsecureServerAcceptsAnyone) {
  auto auth = ClusterAuth::Insecure();
  TestServer server(auth);
  EXPECT_TRUE(Call(*auth, server.port).ok());
  EXPECT_TRUE(Call(*ClusterAuth::ForSecret("some secret of 16+ bytes"), server.port).ok());
}

// Mutual TLS with certificates made by the openssl tool: a CA, and one certificate for
// every process (SAN 127.0.0.1), as a cluster's CA would issue them.
class ClusterAuthTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TmpDir() + "/tls";
    std::filesystem::create_directories(dir_);
    if (std::system("openssl version >/dev/null 2>&1") != 0) GTEST_SKIP() << "no openssl tool";
    const std::string script = absl::StrCat(
        "cd ", dir_, " && set -e; exec >/dev/null 2>&1; ",
        "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 "
        "-subj /CN=strata-test-ca; ",
        "for n in node other; do openssl req -newkey rsa:2048 -nodes -keyout $n.key -out $n.csr "
        "-subj /CN=strata-$n; printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > ext; ",
        "openssl x509 -req -in $n.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out $n.pem "
        "-days 2 -extfile ext; done; ",
        "openssl req -x509 -newkey rsa:2048 -nodes -keyout rogue.key -out rogue.pem -days 2 "
        "-subj /CN=rogue -addext subjectAltName=IP:127.0.0.1; ",
        "chmod 600 *.key");
    ASSERT_EQ(std::system(script.c_str()), 0) << "openssl failed";
  }
  absl::StatusOr<std::shared_ptr<const ClusterAuth>> Load(const std::string& name,
                                                          const std::string& ca = "ca") {
    ClusterAuthOptions o{.secret_file = WriteFile("tls-secret", std::string(24, 's'), 0600),
                         .tls_cert_file = dir_ + "/" + name + ".pem",
                         .tls_key_file = dir_ + "/" + name + ".key",
                         .tls_ca_file = dir_ + "/" + ca + ".pem"};
    return ClusterAuth::Load(o);
  }
  std::string dir_;
};

TEST_F(ClusterAuthTlsTest, MutualTlsAdmitsOnlyCertificatesOfTheCa) {
  auto server_auth = Load("node");
  ASSERT_TRUE(server_auth.ok()) << server_auth.status();
  EXPECT_TRUE((*server_auth)->tls());
  TestServer server(*server_auth);
  ASSERT_NE(server.port, 0);
  auto client = Load("other");
  ASSERT_TRUE(client.ok());
  EXPECT_TRUE(Call(**client, server.port).ok());
  // Plaintext, and a certificate from another CA, never get through the handshake.
  auto plaintext = ClusterAuth::ForSecret(std::string(24, 's'));
  EXPECT_EQ(Call(*plaintext, server.port).error_code(), grpc::StatusCode::UNAVAILABLE);
  auto rogue = Load("rogue", "ca");
  ASSERT_TRUE(rogue.ok());
  EXPECT_FALSE(Call(**rogue, server.port).ok());
  // TLS does not replace the token.
  EXPECT_EQ(Call(**client, server.port, /*attach=*/false).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(ClusterAuthTlsTest, NonPemFilesAreRefused) {
  ClusterAuthOptions o{.secret_file = WriteFile("tls-secret2", std::string(24, 's'), 0600),
                       .tls_cert_file = WriteFile("garbage.pem", "not a certificate", 0600),
                       .tls_key_file = dir_ + "/node.key",
                       .tls_ca_file = dir_ + "/ca.pem"};
  auto auth = ClusterAuth::Load(o);
  ASSERT_FALSE(auth.ok());
  EXPECT_NE(auth.status().message().find("--control_tls_cert"), std::string::npos);
}

}  // namespace
}  // namespace strata
