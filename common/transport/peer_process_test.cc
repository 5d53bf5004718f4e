// A data-plane peer in another process that dies (SIGKILL) is reported, over UCX's tcp
// with error mode peer and over shared memory with error mode none, where only the
// connection's liveness socket can find it (ucx_bootstrap.h): the peer handler hears of it,
// sends to it fail, and a payload it was sending into a placed buffer is delivered once.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/transport/frame.h"
#include "common/transport/transport.h"
#include "common/transport/transport_testing.h"
#include "gtest/gtest.h"

extern char** environ;

namespace strata::transport {
namespace {

struct Tls {
  std::string name;  // UCX_TLS
  ErrorMode mode;
};

// The transport_peer binary (transport_peer_main.cc) connected to `address`: its pid, and
// its stdout.
class PeerProcess {
 public:
  PeerProcess(const std::string& address, const std::string& tls, const std::string& mode,
              size_t bytes) {
    const char* srcdir = std::getenv("TEST_SRCDIR");
    const std::string binary =
        std::string(srcdir != nullptr ? srcdir : ".") + "/strata/common/transport/transport_peer";
    int fds[2];
    if (pipe(fds) != 0) return;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&actions, fds[0]);
    const std::string size = absl::StrCat(bytes);
    std::vector<char*> argv = {
        const_cast<char*>(binary.c_str()), const_cast<char*>(address.c_str()),
        const_cast<char*>(tls.c_str()),    const_cast<char*>(mode.c_str()),
        const_cast<char*>(size.c_str()),   nullptr};
    if (posix_spawn(&pid_, binary.c_str(), &actions, nullptr, argv.data(), environ) != 0) {
      pid_ = -1;
    }
    posix_spawn_file_actions_destroy(&actions);
    close(fds[1]);
    out_ = fdopen(fds[0], "r");
  }
  ~PeerProcess() {
    Kill();
    if (out_ != nullptr) fclose(out_);
  }
  bool started() const { return pid_ > 0 && out_ != nullptr; }
  // True once it printed `line` (false if it exited first).
  bool Said(const std::string& line) {
    char buffer[256];
    while (fgets(buffer, sizeof(buffer), out_) != nullptr) {
      if (line + "\n" == buffer) return true;
    }
    return false;
  }
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  FILE* out_ = nullptr;
};

class PeerProcessTest : public ::testing::TestWithParam<Tls> {
 protected:
  void SetUp() override {
    TransportConfig config;
    config.ucx_options = {{"TLS", GetParam().name}, {"NET_DEVICES", "lo"}};
    config.error_mode = GetParam().mode;
    config.auth_key = kTestKey;
    auto server = ListeningTransport(config, kFrameTag + 1, &receiver_, &events_, &address_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }
  void TearDown() override { server_.reset(); }

  PeerId ConnectedPeer() {
    EXPECT_TRUE(events_.WaitFor(PeerEvent::kConnected));
    std::lock_guard<std::mutex> lock(events_.mu);
    return events_.events.empty() ? 0 : events_.events[0].first;
  }

  PlacingCounter receiver_;
  PeerEvents events_;
  std::unique_ptr<Transport> server_;
  std::string address_;
};

TEST_P(PeerProcessTest, APeerKilledIsReportedAndSendsToItFail) {
  PeerProcess peer(address_, GetParam().name, "idle", 0);
  ASSERT_TRUE(peer.started());
  ASSERT_TRUE(peer.Said("connected"));
  const PeerId id = ConnectedPeer();
  const uint8_t header[4] = {};
  ASSERT_TRUE(SendAndWait(*server_, id, kFrameTag, header, {}, absl::Seconds(5)).ok());
  peer.Kill();
  ASSERT_TRUE(events_.WaitFor(PeerEvent::kDisconnected)) << "the dead peer was never reported";
  EXPECT_FALSE(SendAndWait(*server_, id, kFrameTag, header, {}, absl::Seconds(5)).ok());
}

// Every span Place hands out comes back in one Deliver, also when the sender dies with its
// payload under way (the memory server keeps a frame buffer until then).
TEST_P(PeerProcessTest, APayloadCutOffByTheSendersDeathIsDeliveredOnce) {
  PeerProcess peer(address_, GetParam().name, "send", size_t{256} << 20);
  ASSERT_TRUE(peer.started());
  ASSERT_TRUE(peer.Said("sending"));
  ASSERT_TRUE(receiver_.WaitFor([](int placed, int) { return placed >= 1; }))
      << "the payload was never placed";
  peer.Kill();
  ASSERT_TRUE(events_.WaitFor(PeerEvent::kDisconnected)) << "the dead peer was never reported";
  ASSERT_TRUE(receiver_.WaitFor([](int placed, int delivered) { return delivered >= placed; }))
      << "a placed payload was never delivered";
  absl::SleepFor(absl::Milliseconds(100));  // time for a second delivery, were there one
  EXPECT_TRUE(receiver_.WaitFor([](int placed, int delivered) {
    EXPECT_EQ(placed, 1);
    EXPECT_EQ(delivered, 1);
    return true;
  }));
  EXPECT_EQ(receiver_.misplaced(), 0) << "a placed payload delivered elsewhere";
}

INSTANTIATE_TEST_SUITE_P(Ucx, PeerProcessTest,
                         ::testing::Values(Tls{"tcp", ErrorMode::kPeer},
                                           Tls{"sm,self,tcp", ErrorMode::kNone}),
                         [](const ::testing::TestParamInfo<Tls>& info) {
                           return info.param.mode == ErrorMode::kPeer ? std::string("tcp")
                                                                      : std::string("sm");
                         });

}  // namespace
}  // namespace strata::transport
