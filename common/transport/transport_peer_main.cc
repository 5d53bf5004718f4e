// A data-plane peer in a process of its own, for the tests that kill one
// (peer_process_test.cc): it connects to a listening transport and then either idles or
// sends one payload, and never exits by itself.
//
//   transport_peer ADDRESS TLS idle|send [BYTES]
//
// TLS is UCX's transport list (tcp: error mode peer; anything with sm: error mode none).
// It prints "connected" once the handshake is done and, with send, "sending" once the send
// has started, each on a line of its own.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/transport/frame.h"
#include "common/transport/transport.h"
#include "common/transport/transport_testing.h"

int main(int argc, char** argv) {
  using namespace strata::transport;
  if (argc < 4) {
    std::fprintf(stderr, "usage: transport_peer ADDRESS TLS idle|send [BYTES]\n");
    return 2;
  }
  const std::string tls = argv[2], mode = argv[3];
  TransportConfig config;
  config.ucx_options = {{"TLS", tls}, {"NET_DEVICES", "lo"}};
  config.error_mode = tls.find("sm") != std::string::npos ? ErrorMode::kNone : ErrorMode::kPeer;
  config.auth_key = kTestKey;
  auto transport = Transport::Create(config);
  if (!transport.ok()) {
    std::fprintf(stderr, "%s\n", std::string(transport.status().message()).c_str());
    return 1;
  }
  auto peer = (*transport)->Connect(argv[1]);
  if (!peer.ok()) {
    std::fprintf(stderr, "%s\n", std::string(peer.status().message()).c_str());
    return 1;
  }
  std::printf("connected\n");
  std::fflush(stdout);
  std::vector<uint8_t> payload;
  if (mode == "send") {
    payload.assign(argc > 4 ? std::strtoull(argv[4], nullptr, 10) : 1 << 20, 0x5a);
    const uint8_t header[8] = {7};
    (*transport)->Send(*peer, kFrameTag + 1, header, {payload}, [](absl::Status) {});
    std::printf("sending\n");
    std::fflush(stdout);
  }
  while (true) pause();
}
