// The data plane against peers it cannot trust: the bootstrap admits only a peer that holds
// the deployment's key and gives up on one that drags it out, and a receiver does not
// allocate what an admitted peer's message claims past its limit.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/crypto.h"
#include "common/transport/frame.h"
#include "common/transport/transport.h"
#include "common/transport/transport_testing.h"
#include "gtest/gtest.h"

namespace strata::transport {
namespace {

// The data-plane bootstrap: only a peer with the same key gets an endpoint.
class BootstrapAuthTest : public ::testing::Test {
 protected:
  TransportConfig Config(const std::string& key) {
    TransportConfig c;
    c.ucx_options = {{"TLS", "tcp"}, {"NET_DEVICES", "lo"}};
    c.connect_timeout = absl::Seconds(5);
    c.auth_key = key;
    return c;
  }
  void SetUp() override {
    auto server = ListeningTransport(Config(kTestKey), kFrameTag, &rx_, &events_, &address_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }
  void TearDown() override { server_.reset(); }
  int Connected() {
    std::lock_guard<std::mutex> lock(events_.mu);
    int n = 0;
    for (const auto& [id, e] : events_.events) n += e == PeerEvent::kConnected;
    return n;
  }
  // A raw TCP connection to the bootstrap port.
  int Dial() {
    const size_t colon = address_.rfind(':');
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(std::stoi(address_.substr(colon + 1))));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    timeval tv{3, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
  }
  // Everything the server sends until it closes the connection.
  static std::string ReadToEnd(int fd) {
    std::string out;
    char buf[4096];
    ssize_t n;
    while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) out.append(buf, n);
    close(fd);
    return out;
  }

  Recorder rx_;
  PeerEvents events_;
  std::unique_ptr<Transport> server_;
  std::string address_;
};

TEST_F(BootstrapAuthTest, PeersWithTheKeyConnectAndOthersAreRefused) {
  const uint64_t refused = ProcessAuthRefusals().data_plane.load();
  for (const std::string& wrong :
       {std::string("another deployment's key........."), std::string()}) {
    auto client = Transport::Create(Config(wrong));
    ASSERT_TRUE(client.ok());
    auto peer = (*client)->Connect(address_);
    ASSERT_FALSE(peer.ok());
    EXPECT_EQ(peer.status().code(), absl::StatusCode::kUnauthenticated) << peer.status();
    EXPECT_NE(peer.status().message().find("secret"), std::string::npos) << peer.status();
  }
  // The client checks the server's proof first, so the server never sees their addresses.
  EXPECT_EQ(ProcessAuthRefusals().data_plane.load(), refused);
  EXPECT_EQ(Connected(), 0);
  // The server keeps serving: a client with the key connects and its messages arrive.
  auto good = Transport::Create(Config(kTestKey));
  ASSERT_TRUE(good.ok());
  auto peer = (*good)->Connect(address_);
  ASSERT_TRUE(peer.ok()) << peer.status();
  const uint8_t header[4] = {9, 8, 7, 6};
  EXPECT_TRUE(SendAndWait(**good, *peer, kFrameTag, header, {}, absl::Seconds(10)).ok());
  EXPECT_TRUE(rx_.WaitFor(1));
  EXPECT_EQ(Connected(), 1);
}

// A client that sends its bootstrap a byte at a time, each within the socket's timeout,
// would hold the transport thread (which runs the server's bootstrap) for as long as it
// likes without a deadline on the whole: the server gives up after about two seconds.
TEST_F(BootstrapAuthTest, AClientThatTricklesItsBootstrapIsCutOff) {
  const int fd = Dial();
  const uint32_t magic = 0x53545242;
  std::string hello(4, '\0');
  std::memcpy(hello.data(), &magic, 4);
  hello += std::string(16, 'n');
  ASSERT_EQ(send(fd, hello.data(), hello.size(), 0), static_cast<ssize_t>(hello.size()));
  std::string challenge(52, '\0');
  ASSERT_EQ(recv(fd, challenge.data(), challenge.size(), MSG_WAITALL), 52);
  // The answer's magic at once, then its MAC a byte at a time.
  ASSERT_EQ(send(fd, &magic, 4, 0), 4);
  const absl::Time start = absl::Now();
  bool cut_off = false;
  for (int i = 0; i < 40 && !cut_off; ++i) {  // 40 x 0.4 s: far past the budget
    absl::SleepFor(absl::Milliseconds(400));
    cut_off = send(fd, "m", 1, MSG_NOSIGNAL) != 1;
  }
  // The server closed the socket: a later send fails (the first after the close may still
  // be accepted by the kernel).
  EXPECT_TRUE(cut_off);
  EXPECT_LT(absl::Now() - start, absl::Seconds(6));
  close(fd);
  // And it serves a client with the key.
  auto good = Transport::Create(Config(kTestKey));
  ASSERT_TRUE(good.ok());
  auto peer = (*good)->Connect(address_);
  ASSERT_TRUE(peer.ok()) << peer.status();
}

TEST_F(BootstrapAuthTest, AClientWithoutTheKeyNeverLearnsTheWorkerAddress) {
  const uint64_t refused = ProcessAuthRefusals().data_plane.load();
  // The bootstrap of an earlier version: magic, address size, address. The bytes after the
  // magic are taken as a nonce; the server's challenge comes back, and nothing else.
  {
    const int fd = Dial();
    const uint32_t old[2] = {0x53545242, 4};
    ASSERT_EQ(send(fd, old, sizeof(old), 0), 8);
    ASSERT_EQ(send(fd, "addr", 4, 0), 4);
    ASSERT_EQ(send(fd, std::string(8, 'x').data(), 8, 0), 8);
    const std::string reply = ReadToEnd(fd);
    EXPECT_EQ(reply.size(), 4u + 16u + 32u);  // magic, server nonce, server MAC
  }
  // A client that answers the challenge with a forged MAC.
  {
    const int fd = Dial();
    std::string hello(4, '\0');
    const uint32_t magic = 0x53545242;
    std::memcpy(hello.data(), &magic, 4);
    hello += std::string(16, 'n');
    ASSERT_EQ(send(fd, hello.data(), hello.size(), 0), static_cast<ssize_t>(hello.size()));
    std::string challenge(52, '\0');
    ASSERT_EQ(recv(fd, challenge.data(), challenge.size(), MSG_WAITALL), 52);
    std::string answer(4, '\0');
    std::memcpy(answer.data(), &magic, 4);
    answer += std::string(32, 'm');
    const uint32_t size = 8;
    answer.append(reinterpret_cast<const char*>(&size), 4);
    answer += "fakeaddr";
    ASSERT_EQ(send(fd, answer.data(), answer.size(), 0), static_cast<ssize_t>(answer.size()));
    EXPECT_EQ(ReadToEnd(fd), "");  // closed without the server's address
  }
  // Junk.
  {
    const int fd = Dial();
    ASSERT_EQ(send(fd, "GET / HTTP/1.1\r\n\r\n", 18, 0), 18);
    EXPECT_EQ(ReadToEnd(fd), "");
  }
  EXPECT_EQ(ProcessAuthRefusals().data_plane.load(), refused + 1);  // the forged MAC
  EXPECT_EQ(Connected(), 0);
  auto good = Transport::Create(Config(kTestKey));
  ASSERT_TRUE(good.ok());
  EXPECT_TRUE((*good)->Connect(address_).ok());
}

// A message larger than the receiver holds (max_held_bytes), where its handler placed
// nothing, is dropped unread and delivered as an error; the next one arrives as usual.
TEST(Transport, AMessagePastTheReceiversLimitIsAnErrorNotAnAllocation) {
  TransportConfig config;
  config.ucx_options = {{"TLS", "tcp"}, {"NET_DEVICES", "lo"}};
  config.connect_timeout = absl::Seconds(5);
  config.auth_key = kTestKey;
  TransportConfig small = config;
  small.max_held_bytes = 1 << 20;
  auto server = Transport::Create(small);
  ASSERT_TRUE(server.ok()) << server.status();
  Recorder rx;
  (*server)->SetHandler(kFrameTag, &rx);
  auto address = (*server)->Listen("127.0.0.1:0");
  ASSERT_TRUE(address.ok()) << address.status();
  auto client = Transport::Create(config);
  ASSERT_TRUE(client.ok());
  auto peer = (*client)->Connect(*address);
  ASSERT_TRUE(peer.ok()) << peer.status();
  const uint8_t header[4] = {1, 2, 3, 4};
  const std::vector<uint8_t> big((4 << 20) + 1, 7), fine(1000, 8);
  ASSERT_TRUE(SendAndWait(**client, *peer, kFrameTag, header, {big}, absl::Seconds(20)).ok());
  ASSERT_TRUE(SendAndWait(**client, *peer, kFrameTag, header, {fine}, absl::Seconds(20)).ok());
  ASSERT_TRUE(rx.WaitFor(2));
  const auto messages = rx.messages();
  EXPECT_EQ(messages[0].status.code(), absl::StatusCode::kInvalidArgument) << messages[0].status;
  EXPECT_TRUE(messages[0].payload.empty());
  EXPECT_TRUE(messages[1].status.ok()) << messages[1].status;
  EXPECT_EQ(messages[1].payload, fine);
}

}  // namespace
}  // namespace strata::transport
