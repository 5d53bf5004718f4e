// Data-plane transport benchmark (prints figures; no assertion): round trips between two
// processes through strata's Transport, per backend and message size: the time to post a
// send, the round-trip latency of a message and its equally sized answer, and the
// bandwidth of a stream of one-way messages. Compare with ucx_perftest's figures for the
// same UCX transports (README, "Data plane").
//
//   bazel-bin/common/transport/bench/transport_bench --tls=sm,self,tcp --sizes=64,37000,300000
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/stopwatch.h"
#include "common/transport/frame.h"
#include "common/transport/transport.h"

ABSL_FLAG(std::string, tls, "tcp", "UCX transports (UCX_TLS), e.g. tcp or sm,self,tcp");
ABSL_FLAG(std::string, sizes, "64,4096,37000,300000,2000000", "Message sizes in bytes");
ABSL_FLAG(int, iters, 2000, "Round trips per size (fewer for large sizes)");

namespace strata::transport {
namespace {

// Echoes every message back to its sender.
class Echo : public MessageHandler {
 public:
  explicit Echo(Transport* t) : t_(t) {}
  std::span<uint8_t> Place(PeerId, std::span<const uint8_t>, size_t) override { return {}; }
  void Deliver(PeerId from, std::span<const uint8_t> header, std::span<const uint8_t> payload,
               absl::Status) override {
    auto copy = std::make_shared<std::vector<uint8_t>>(payload.begin(), payload.end());
    t_->Send(from, kFrameTag, header, {std::span<const uint8_t>(*copy)}, [copy](absl::Status) {});
  }

 private:
  Transport* t_;
};

class Counter : public MessageHandler {
 public:
  std::span<uint8_t> Place(PeerId, std::span<const uint8_t>, size_t bytes) override {
    if (buffer_.size() < bytes) buffer_.resize(bytes);
    return {buffer_.data(), bytes};
  }
  void Deliver(PeerId, std::span<const uint8_t>, std::span<const uint8_t>, absl::Status) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++count_;
    cv_.notify_all();
  }
  void WaitFor(int64_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return count_ >= n; });
  }

 private:
  std::vector<uint8_t> buffer_;
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t count_ = 0;
};

TransportConfig Config() {
  TransportConfig config;
  config.ucx_options = {{"TLS", absl::GetFlag(FLAGS_tls)}, {"NET_DEVICES", "lo"}};
  config.error_mode = absl::GetFlag(FLAGS_tls).find("sm") != std::string::npos
                          ? transport::ErrorMode::kNone
                          : transport::ErrorMode::kPeer;
  return config;
}

int Run() {
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return 1;
  const pid_t child = fork();
  if (child == 0) {
    // The echo server.
    auto t = Transport::Create(Config());
    if (!t.ok()) _exit(1);
    Echo echo(t->get());
    (*t)->SetHandler(kFrameTag, &echo);
    auto address = (*t)->Listen("127.0.0.1:0");
    if (!address.ok()) _exit(1);
    const std::string text = *address + "\n";
    if (write(pipe_fds[1], text.data(), text.size()) < 0) _exit(1);
    pause();
    _exit(0);
  }
  char buffer[256] = {};
  const ssize_t n = read(pipe_fds[0], buffer, sizeof(buffer) - 1);
  if (n <= 0) return 1;
  const std::string address(buffer, std::strchr(buffer, '\n') - buffer);
  auto t = Transport::Create(Config());
  if (!t.ok()) return 1;
  Counter counter;
  (*t)->SetHandler(kFrameTag, &counter);
  auto peer = (*t)->Connect(address);
  if (!peer.ok()) {
    std::fprintf(stderr, "%s\n", std::string(peer.status().message()).c_str());
    return 1;
  }
  std::printf("transport bench over %s\nlanes: %s\n", (*t)->capabilities().ToString().c_str(),
              (*t)->DescribePeer(*peer).c_str());
  std::printf("%10s %12s %12s %14s\n", "bytes", "post_us", "rtt_us", "stream_GB/s");
  int64_t received = 0;
  for (absl::string_view piece : absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',')) {
    size_t size = 0;
    if (!absl::SimpleAtoi(piece, &size)) continue;
    std::vector<uint8_t> payload(size, 7);
    FrameHeader header;
    const int iters = std::max(
        20, static_cast<int>(absl::GetFlag(FLAGS_iters) * 4096 / std::max<size_t>(4096, size)));
    double post = 0;
    const Stopwatch round_trips;
    for (int i = 0; i < iters; ++i) {
      const Stopwatch posting;
      (*t)->Send(*peer, kFrameTag, AsBytes(header), {payload}, [](absl::Status) {});
      post += posting.ElapsedSeconds();
      counter.WaitFor(++received);
    }
    const double rtt = round_trips.ElapsedSeconds() / iters;
    // One-way stream: many sends in flight, then wait for all the echoes.
    const Stopwatch streaming;
    for (int i = 0; i < iters; ++i) {
      (*t)->Send(*peer, kFrameTag, AsBytes(header), {payload}, [](absl::Status) {});
    }
    received += iters;
    counter.WaitFor(received);
    const double stream = streaming.ElapsedSeconds();
    std::printf("%10zu %12.1f %12.1f %14.2f\n", size, post / iters * 1e6, rtt * 1e6,
                2.0 * size * iters / stream / 1e9);
    std::fflush(stdout);
  }
  t->reset();
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  return 0;
}

}  // namespace
}  // namespace strata::transport

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return strata::transport::Run();
}
