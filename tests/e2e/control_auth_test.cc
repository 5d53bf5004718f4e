// The internal plane as an attacker sees it: a client built from proto/ that does not hold
// the deployment's secret calls every method of every control service (the scheduler's,
// a compute node's, a memory node's), tries the attacks that worked before authentication
// (Configure with another epoch, Shutdown, Register under a live node's name, heartbeats),
// and dials the data-plane bootstrap. Every call is refused with UNAUTHENTICATED and
// counted, and the deployment keeps serving. The processes also refuse to start without a
// usable secret, with errors that name the flag (after the model directory's errors).
#include <grpcpp/grpcpp.h>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/control/version.h"
#include "common/transport/handshake.h"
#include "common/transport/transport.h"
#include "gtest/gtest.h"
#include "kernels/cpu/isa.h"
#include "proto/control.grpc.pb.h"
#include "tests/common/deployment.h"
#include "tests/common/grpc_raw.h"
#include "tests/common/http_client.h"

namespace strata::testing {
namespace {

std::shared_ptr<grpc::Channel> Channel(int port) {
  return grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
}

// One message on any method (unary or streaming), then the call's status. `token`: the
// cluster-token metadata to send ("" for none).
grpc::Status Call(int port, const std::string& method, const std::string& token,
                  const std::string& bytes = "", std::string* reply_bytes = nullptr) {
  RawCallResult r = RawGrpcCall(port, method, bytes, [&](grpc::ClientContext* c) {
    if (!token.empty()) c->AddMetadata(kClusterTokenMetadata, token);
  });
  if (reply_bytes != nullptr) *reply_bytes = r.reply;
  return r.status;
}

std::vector<std::string> Methods(const google::protobuf::ServiceDescriptor* service) {
  std::vector<std::string> out;
  for (int i = 0; i < service->method_count(); ++i) {
    out.push_back(absl::StrCat("/", service->full_name(), "/", service->method(i)->name()));
  }
  return out;
}

// strata_unauthenticated_total{channel="control"} on a /metrics port.
double Refused(int metrics_port) {
  const HttpResponse r = HttpRequest(metrics_port, "GET", "/metrics");
  const std::string key = "strata_unauthenticated_total{channel=\"control\"} ";
  const size_t at = r.body.find(key);
  return at == std::string::npos ? -1 : std::stod(r.body.substr(at + key.size()));
}

// Register(node) on the scheduler at `port`, with the deployment's secret.
grpc::Status RegisterWithTheSecret(int port, const control::NodeInfo& node) {
  control::RegisterRequest request;
  *request.mutable_node() = node;
  grpc::ClientContext c;
  TestClusterAuth()->Attach(&c);
  control::RegisterResponse response;
  return control::Scheduler::NewStub(Channel(port))->Register(&c, request, &response);
}

int Generate(int http_port) {
  return HttpRequest(http_port, "POST", "/v1/completions",
                     R"({"model":"tiny","prompt":"Hello there","max_tokens":4})")
      .status;
}

TEST(ControlAuthTest, EveryInternalCallWithoutTheSecretIsRefused) {
  DeploymentOptions options;
  options.memory_nodes = 1;
  options.server_args = {"--served_model_name=tiny"};
  auto d = Deployment::Start(options);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(Generate((*d)->http_port()), 200);
  const int scheduler = (*d)->control_port();
  const int compute = (*d)->ControlPort("compute-0");
  const int memory = (*d)->ControlPort("memory-0");
  ASSERT_NE(compute, 0);
  ASSERT_NE(memory, 0);

  // Every method of every control service, with no token and with a forged one.
  const std::vector<std::pair<int, const google::protobuf::ServiceDescriptor*>> services = {
      {scheduler, control::RegisterRequest::descriptor()->file()->FindServiceByName("Scheduler")},
      {compute, control::RegisterRequest::descriptor()->file()->FindServiceByName("ComputeNode")},
      {memory, control::RegisterRequest::descriptor()->file()->FindServiceByName("MemoryNode")}};
  int calls = 0;
  for (const auto& [port, service] : services) {
    ASSERT_NE(service, nullptr);
    for (const std::string& method : Methods(service)) {
      for (const std::string& token : {std::string(), std::string(64, 'a')}) {
        const grpc::Status s = Call(port, method, token);
        EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED)
            << method << " with " << (token.empty() ? "no token" : "a forged token") << ": "
            << s.error_message();
        ++calls;
      }
    }
  }
  EXPECT_EQ(calls, 2 * (2 + 5 + 4));

  // The attacks of the review, as typed calls without credentials.
  {
    control::ComputeConfig config;
    config.set_epoch(12345);
    grpc::ClientContext c;
    control::ComputeConfigAck ack;
    EXPECT_EQ(
        control::ComputeNode::NewStub(Channel(compute))->Configure(&c, config, &ack).error_code(),
        grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    control::MemoryConfig config;
    config.set_epoch(12345);
    config.set_num_slots(10);
    grpc::ClientContext c;
    control::MemoryConfigAck ack;
    EXPECT_EQ(
        control::MemoryNode::NewStub(Channel(memory))->Configure(&c, config, &ack).error_code(),
        grpc::StatusCode::UNAUTHENTICATED);
  }
  for (const int port : {compute, memory}) {
    grpc::ClientContext c;
    control::ShutdownResponse r;
    const grpc::Status s = port == compute
                               ? control::ComputeNode::NewStub(Channel(port))->Shutdown(&c, {}, &r)
                               : control::MemoryNode::NewStub(Channel(port))->Shutdown(&c, {}, &r);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  for (int i = 0; i < 20; ++i) {
    control::RegisterRequest request;
    request.mutable_node()->set_name("compute-0");
    request.mutable_node()->set_role(control::ROLE_COMPUTE);
    request.mutable_node()->set_protocol_version(strata::kProtocolVersion);
    grpc::ClientContext c;
    control::RegisterResponse response;
    EXPECT_EQ(control::Scheduler::NewStub(Channel(scheduler))
                  ->Register(&c, request, &response)
                  .error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    absl::SleepFor(absl::Milliseconds(100));
  }

  // Even with the secret, a live node's name cannot be taken over.
  {
    control::NodeInfo node;
    node.set_name("memory-0");
    node.set_role(control::ROLE_MEMORY);
    node.set_protocol_version(strata::kProtocolVersion);
    node.set_cpu_isa("whatever");
    const grpc::Status s = RegisterWithTheSecret(scheduler, node);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::ALREADY_EXISTS) << s.error_message();
  }

  // grpc.health.v1 stays open for kubelet: Check({service: ""}) is SERVING (field 1 = 1).
  for (const int port : {compute, memory}) {
    std::string reply;
    const grpc::Status s = Call(port, "/grpc.health.v1.Health/Check", "", "", &reply);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(reply, std::string("\x08\x01", 2));
  }

  // The data-plane bootstrap of the memory node refuses a peer without the key.
  {
    grpc::ClientContext c;
    TestClusterAuth()->Attach(&c);
    control::HealthResponse health;
    ASSERT_TRUE(control::MemoryNode::NewStub(Channel(memory))->Health(&c, {}, &health).ok());
    transport::TransportConfig tc;
    tc.ucx_options = {{"TLS", "tcp"}, {"NET_DEVICES", "lo"}};
    tc.auth_key = "not this deployment's key";
    auto client = transport::Transport::Create(tc);
    ASSERT_TRUE(client.ok());
    auto peer = (*client)->Connect(health.node().data_address());
    ASSERT_FALSE(peer.ok());
    EXPECT_EQ(peer.status().code(), absl::StatusCode::kUnauthenticated) << peer.status();
  }

  // Fuzz of the scheduler's side, with credentials: random and mutated Register and
  // Heartbeat payloads. A heartbeat never revives or replaces a node (it needs the node's id,
  // epoch and session token), and a registration under a live node's name is refused, so
  // the deployment keeps serving with the nodes it had.
  {
    control::RegisterRequest real;
    real.mutable_node()->set_name("compute-0");
    real.mutable_node()->set_role(control::ROLE_COMPUTE);
    real.mutable_node()->set_protocol_version(strata::kProtocolVersion);
    const std::string seed = real.SerializeAsString();
    std::mt19937 rng(11);
    auto with_token = [](grpc::ClientContext* c) { TestClusterAuth()->Attach(c); };
    for (int i = 0; i < 100; ++i) {
      std::string payload(rng() % 600, '\0');
      for (char& ch : payload) ch = static_cast<char>(rng());
      if (i % 2 == 0) payload = seed.substr(0, rng() % (seed.size() + 1)) + payload;
      RawGrpcCall(scheduler, "/strata.control.Scheduler/Heartbeat", payload, with_token);
      const RawCallResult r =
          RawGrpcCall(scheduler, "/strata.control.Scheduler/Register", payload, with_token);
      EXPECT_NE(r.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    }
  }

  // With the secret, a node whose kernels would compute other bits is refused, naming the
  // node it disagrees with (server/kernel_agreement.h): one on the deployment's kernel path
  // whose attention fingerprint differs, and one on another path. (The real nodes reported
  // theirs when they registered above, and agreed.)
  for (const bool other_path : {false, true}) {
    control::NodeInfo node;
    node.set_name("memory-9");
    node.set_role(control::ROLE_MEMORY);
    node.set_protocol_version(strata::kProtocolVersion);
    node.set_cpu_isa(other_path ? "another-path" : kernels::CpuIsaName(kernels::ActiveCpuIsa()));
    node.set_attention_fingerprint("0123456789abcdef");
    const grpc::Status s = RegisterWithTheSecret(scheduler, node);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
    EXPECT_NE(s.error_message().find(other_path ? "mixed kernel paths"
                                                : "attention kernels compute different results"),
              std::string::npos)
        << s.error_message();
    // It names the live node it was compared with, whichever registered first.
    EXPECT_TRUE(s.error_message().find("memory-0") != std::string::npos ||
                s.error_message().find("compute-0") != std::string::npos)
        << s.error_message();
  }

  // With the secret, a node of another build is refused at registration and told both
  // versions: one of the control protocol's version before, and one whose control protocol
  // is this one's but whose data plane is of the version before (it used to register, and
  // every data-plane connection to it to be refused).
  for (const bool data_plane : {false, true}) {
    control::NodeInfo node;
    node.set_name(data_plane ? "compute-8" : "compute-9");
    node.set_role(control::ROLE_COMPUTE);
    node.set_protocol_version(data_plane ? strata::kProtocolVersion : strata::kProtocolVersion - 1);
    if (data_plane) node.set_data_plane_version(transport::kDataPlaneVersion - 1);
    const std::string want =
        data_plane ? absl::StrCat("speaks data-plane version ", transport::kDataPlaneVersion - 1,
                                  "; this scheduler speaks ", transport::kDataPlaneVersion)
                   : absl::StrCat("speaks protocol version ", strata::kProtocolVersion - 1,
                                  "; this scheduler speaks ", strata::kProtocolVersion);
    const grpc::Status s = RegisterWithTheSecret(scheduler, node);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
    EXPECT_NE(s.error_message().find(want), std::string::npos) << s.error_message();
  }

  // Refusals are counted in every process, and the deployment still serves.
  EXPECT_GE(Refused((*d)->MetricsPort("server")), 2 * 2 + 20);
  EXPECT_GE(Refused((*d)->MetricsPort("compute-0")), 2 * 5 + 2);
  EXPECT_GE(Refused((*d)->MetricsPort("memory-0")), 2 * 4 + 2);
  EXPECT_EQ(HttpRequest((*d)->http_port(), "GET", "/health").status, 200);
  EXPECT_EQ(Generate((*d)->http_port()), 200);
  EXPECT_EQ((*d)->Stop(), 0);
}

// Runs a binary with `args` and returns its exit status and combined output.
std::pair<int, std::string> RunToExit(const std::string& binary,
                                      const std::vector<std::string>& args) {
  std::string command = binary;
  for (const std::string& a : args) command += " '" + a + "'";
  command += " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  std::string output;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) output.append(buf, n);
  const int status = pclose(pipe);
  return {status, output};
}

std::string WriteFile(const std::string& name, const std::string& text, mode_t mode) {
  const std::string path = TestTmpDir() + "/" + name;
  std::filesystem::remove(path);
  std::ofstream(path) << text;
  chmod(path.c_str(), mode);
  return path;
}

TEST(ControlAuthTest, ProcessesRefuseToStartWithoutAUsableSecret) {
  auto model = TestModel("tiny");
  ASSERT_TRUE(model.ok()) << model.status();
  const std::string root = RunfilesRoot();
  const std::string server = root + "/server/server";
  const std::string compute = root + "/compute_node/compute_node";
  const std::string memory = root + "/memory_node/memory_node";
  const std::string model_flag = "--model=" + *model;
  const std::string open = "--cluster_secret_file=" + WriteFile("open", std::string(32, 'x'), 0644);
  const std::string empty = "--cluster_secret_file=" + WriteFile("empty", "", 0600);
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{server, model_flag, "--port=0", "--control_port=0"}, "--cluster_secret_file"},
      {{compute, model_flag}, "--cluster_secret_file"},
      {{memory, "--scheduler="}, "--cluster_secret_file"},
      {{server, model_flag, "--port=0", "--control_port=0", open}, "chmod 600"},
      {{compute, model_flag, open}, "chmod 600"},
      {{memory, empty}, "empty"},
      {{memory, "--cluster_secret_file=/nonexistent/secret"}, "/nonexistent/secret"},
      // The model directory's errors come before the secret's.
      {{server, "--model=/nonexistent/model", "--port=0", "--control_port=0"},
       "/nonexistent/model/config.json"},
      {{compute, "--model=/nonexistent/model"}, "/nonexistent/model/config.json"},
      {{server, model_flag, "--port=0", "--control_port=0", "--policy=bogus"}, "bogus"},
      {{server, model_flag, "--port=0", "--control_port=0", "--heartbeat_timeout_ms=600"},
       "--heartbeat_timeout_ms must be at least 1000"},
  };
  for (const auto& [argv, want] : cases) {
    const auto [status, output] =
        RunToExit(argv[0], std::vector<std::string>(argv.begin() + 1, argv.end()));
    std::string shown;
    for (const std::string& a : argv) shown += a + " ";
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0)
        << shown << "exited with status " << status;
    EXPECT_NE(output.find(want), std::string::npos) << shown << "\n" << output;
  }
}

// A bad config.json is a clear error naming the file and a non-zero exit (it was a
// segfault in the server, exit 139, for {} and for text that is not JSON).
TEST(ControlAuthTest, BadModelConfigIsAClearErrorNotACrash) {
  auto model = TestModel("tiny");
  ASSERT_TRUE(model.ok()) << model.status();
  const std::string root = RunfilesRoot();
  for (const std::string& config : {std::string("{}"), std::string("this is not json"),
                                    std::string(R"({"num_hidden_layers": "two"})")}) {
    const std::string dir = TestTmpDir() + "/bad-model";
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    std::filesystem::copy(*model, dir, std::filesystem::copy_options::recursive);
    std::ofstream(dir + "/config.json", std::ios::trunc) << config;
    for (const std::string& binary :
         {root + "/server/server", root + "/compute_node/compute_node"}) {
      std::vector<std::string> args = {"--model=" + dir, "--port=0", ClusterSecretFlag()};
      if (binary.ends_with("/server")) args.push_back("--control_port=0");
      const auto [status, output] = RunToExit(binary, args);
      EXPECT_TRUE(WIFEXITED(status)) << binary << " on " << config << ": status " << status << "\n"
                                     << output;
      EXPECT_NE(WEXITSTATUS(status), 0) << binary << " on " << config;
      EXPECT_NE(output.find("config.json"), std::string::npos) << binary << "\n" << output;
    }
  }
}

}  // namespace
}  // namespace strata::testing
