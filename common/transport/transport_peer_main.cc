// A data-plane peer in a process of its own, for the tests that kill one or that meet a
// node of another build (peer_process_test.cc): it connects to a listening transport and
// then either idles or sends one payload, or it listens itself; it never exits by itself
// once connected or listening.
//
//   transport_peer ADDRESS TLS idle [SECONDS] | send [BYTES]
//   transport_peer listen TLS [SECONDS]
//
// TLS is UCX's transport list (tcp: error mode peer; anything with sm: error mode none).
// It prints "connected" once the handshake is done, or "failed: WHY" and exits 1 where
// connecting failed; with send, "sending" once the send has started; with listen,
// "listening ADDRESS"; idle or listening with SECONDS, "lost wake-ups N" (LostWakeups) after
// that long. Each on a line of its own.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/transport/frame.h"
#include "common/transport/transport.h"
#include "common/transport/transport_testing.h"

namespace {

// Idles for good; after `report_s` seconds (0: never), prints the transport's lost wake-ups.
[[noreturn]] void Idle(const strata::transport::Transport& transport, int report_s) {
  if (report_s > 0) {
    sleep(report_s);
    std::printf("lost wake-ups %lld\n", static_cast<long long>(transport.LostWakeups()));
    std::fflush(stdout);
  }
  while (true) pause();
}

}  // namespace

int main(int argc, char** argv) {
  using namespace strata::transport;
  const bool listening = argc > 1 && std::string(argv[1]) == "listen";
  if (argc < (listening ? 3 : 4)) {
    std::fprintf(stderr,
                 "usage: transport_peer ADDRESS TLS idle [SECONDS] | send [BYTES]\n"
                 "       transport_peer listen TLS [SECONDS]\n");
    return 2;
  }
  const std::string tls = argv[2], mode = listening ? "" : argv[3];
  TransportConfig config;
  config.ucx_options = {{"TLS", tls}, {"NET_DEVICES", "lo"}};
  config.error_mode = tls.find("sm") != std::string::npos ? ErrorMode::kNone : ErrorMode::kPeer;
  config.auth_key = kTestKey;
  auto transport = Transport::Create(config);
  if (!transport.ok()) {
    std::fprintf(stderr, "%s\n", std::string(transport.status().message()).c_str());
    return 1;
  }
  if (listening) {
    auto address = (*transport)->Listen("127.0.0.1:0");
    if (!address.ok()) {
      std::printf("failed: %s\n", std::string(address.status().message()).c_str());
      return 1;
    }
    std::printf("listening %s\n", address->c_str());
    std::fflush(stdout);
    Idle(**transport, argc > 3 ? std::atoi(argv[3]) : 0);
  }
  auto peer = (*transport)->Connect(argv[1]);
  if (!peer.ok()) {
    std::printf("failed: %s\n", std::string(peer.status().message()).c_str());
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
    while (true) pause();
  }
  Idle(**transport, argc > 4 ? std::atoi(argv[4]) : 0);
}
