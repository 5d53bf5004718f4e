#include "common/transport/transport.h"

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <iostream>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/crypto.h"
#include "common/transport/frame.h"
#include "common/transport/transport_testing.h"
#include "gtest/gtest.h"

namespace strata::transport {
namespace {

struct Backend {
  std::string name;
  TransportConfig config;
};

std::vector<Backend> Backends() {
  std::vector<Backend> out;
  TransportConfig inproc;
  inproc.backend = transport::Backend::kInproc;
  out.push_back({"inproc", inproc});
  TransportConfig tcp;
  tcp.ucx_options = {{"TLS", "tcp"}, {"NET_DEVICES", "lo"}};
  tcp.connect_timeout = absl::Seconds(10);
  tcp.auth_key = kTestKey;
  out.push_back({"ucx_tcp", tcp});
  TransportConfig sm;
  sm.ucx_options = {{"TLS", "sm,self,tcp"}, {"NET_DEVICES", "lo"}};
  sm.error_mode = transport::ErrorMode::kNone;
  sm.auth_key = kTestKey;
  out.push_back({"ucx_sm", sm});
  // A deployment run with --insecure_control_plane: the empty key on both sides.
  TransportConfig insecure = tcp;
  insecure.auth_key = "";
  out.push_back({"ucx_tcp_insecure", insecure});
  // Forced eager sends over tcp too, past UCX's own threshold.
  TransportConfig tcp_eager = tcp;
  tcp_eager.eager_max_bytes = 1 << 20;
  out.push_back({"ucx_tcp_eager", tcp_eager});
  return out;
}

int counter = 0;

class TransportTest : public ::testing::TestWithParam<Backend> {
 protected:
  std::string ListenAddress() {
    return GetParam().config.backend == transport::Backend::kInproc
               ? absl::StrCat("test-", ++counter)
               : "127.0.0.1:0";
  }
  // A connected pair: server listens, client connects. Returns the client's peer id.
  // `server_ping` handles the server's messages of tag kFrameTag + 1; `client_frames`, if
  // given, the client's of kFrameTag in place of client_rx_.
  void MakePair(MessageHandler* server_ping = nullptr, MessageHandler* client_frames = nullptr) {
    auto server = Transport::Create(GetParam().config);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    auto client = Transport::Create(GetParam().config);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
    server_->SetHandler(kFrameTag, &server_rx_);
    if (server_ping != nullptr) server_->SetHandler(kFrameTag + 1, server_ping);
    client_->SetHandler(kFrameTag, client_frames != nullptr ? client_frames : &client_rx_);
    server_->SetPeerHandler(
        [this](PeerId id, PeerEvent event, const absl::Status&) { server_events_.Add(id, event); });
    auto address = server_->Listen(ListenAddress());
    ASSERT_TRUE(address.ok()) << address.status();
    server_address_ = *address;
    auto peer = client_->Connect(*address);
    ASSERT_TRUE(peer.ok()) << peer.status();
    to_server_ = *peer;
    ASSERT_TRUE(server_events_.WaitFor(PeerEvent::kConnected));
    // Under its lock: a disconnect may be recorded at any time (the liveness sockets report
    // it over every transport).
    std::lock_guard<std::mutex> lock(server_events_.mu);
    server_peer_ = server_events_.events[0].first;
  }

  // Handlers must outlive the transports that call them.
  void TearDown() override {
    client_.reset();
    server_.reset();
  }

  Recorder server_rx_, client_rx_;
  PeerEvents server_events_;
  std::unique_ptr<Transport> server_, client_;
  std::string server_address_;
  PeerId to_server_ = 0, server_peer_ = 0;
};

TEST_P(TransportTest, RoundTripOfHeaderAndGatheredPayload) {
  MakePair();
  const auto header = Bytes(64, 1);
  const auto a = Bytes(1000, 2), b = Bytes(77, 3), c = Bytes(5, 4);
  ASSERT_TRUE(
      SendAndWait(*client_, to_server_, kFrameTag, header, {a, b, c}, absl::Seconds(20)).ok());
  ASSERT_TRUE(server_rx_.WaitFor(1));
  const auto got = server_rx_.messages()[0];
  EXPECT_TRUE(got.status.ok()) << got.status;
  EXPECT_EQ(got.header, header);
  std::vector<uint8_t> want = a;
  want.insert(want.end(), b.begin(), b.end());
  want.insert(want.end(), c.begin(), c.end());
  EXPECT_EQ(got.payload, want);
  // The server answers on the peer the message came from.
  const auto reply = Bytes(32, 5);
  ASSERT_TRUE(SendAndWait(*server_, got.from, kFrameTag, reply, {}, absl::Seconds(20)).ok());
  ASSERT_TRUE(client_rx_.WaitFor(1));
  EXPECT_EQ(client_rx_.messages()[0].header, reply);
  EXPECT_EQ(client_rx_.messages()[0].from, to_server_);
}

TEST_P(TransportTest, LargePayloadsLandInPlaceAndInOrder) {
  MakePair();
  server_rx_.set_place_into_buffer(true);
  // Sizes cross UCX's eager/rendezvous threshold, and the forced-eager limit of shared
  // memory (256 KiB: 200000 and 262144 go eagerly in many fragments, 262145 does not).
  const std::vector<size_t> sizes = {16, 4096, 300000, 4 << 20, 200000, 262144, 262145, 100};
  std::vector<std::vector<uint8_t>> payloads;
  for (size_t i = 0; i < sizes.size(); ++i) payloads.push_back(Bytes(sizes[i], 10 + i));
  std::atomic<int> done{0};
  for (size_t i = 0; i < sizes.size(); ++i) {
    uint8_t header[8];
    std::memcpy(header, &i, sizeof(i));
    const size_t half = sizes[i] / 2;
    client_->Send(to_server_, kFrameTag, header,
                  {std::span<const uint8_t>(payloads[i]).first(half),
                   std::span<const uint8_t>(payloads[i]).subspan(half)},
                  [&](absl::Status s) {
                    EXPECT_TRUE(s.ok()) << s;
                    ++done;
                  });
  }
  ASSERT_TRUE(server_rx_.WaitFor(sizes.size()));
  const auto got = server_rx_.messages();
  for (size_t i = 0; i < sizes.size(); ++i) {
    size_t index;
    std::memcpy(&index, got[i].header.data(), sizeof(index));
    EXPECT_EQ(index, i) << "out of order";
    EXPECT_TRUE(got[i].status.ok()) << got[i].status;
    EXPECT_TRUE(got[i].placed) << "payload " << i << " not delivered where it was placed";
    EXPECT_EQ(got[i].payload, payloads[i]) << "payload " << i;
  }
  for (int i = 0; i < 200 && done.load() < static_cast<int>(sizes.size()); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(done.load(), static_cast<int>(sizes.size()));
}

TEST_P(TransportTest, ManySmallMessagesKeepTheirOrder) {
  MakePair();
  const int n = 2000;
  for (int i = 0; i < n; ++i) {
    uint8_t header[4];
    std::memcpy(header, &i, 4);
    client_->Send(to_server_, kFrameTag, header, {}, [](absl::Status) {});
  }
  ASSERT_TRUE(server_rx_.WaitFor(n));
  const auto got = server_rx_.messages();
  for (int i = 0; i < n; ++i) {
    int index;
    std::memcpy(&index, got[i].header.data(), 4);
    ASSERT_EQ(index, i);
  }
}

// Bursts of sends towards a peer too busy to take them at once (its thread is held up in
// a handler), so that sends are still waiting for room when the sender's transport thread
// goes to sleep: what is not out yet must go out when the peer catches up, not when the
// sender's transport thread next wakes for some other reason. The client's bursts start on
// the test's thread, the server's answers on its transport thread (in a handler).
TEST_P(TransportTest, SendsToABusyPeerLoseNoWakeUp) {
  constexpr int kBurst = 400;
  const auto payload = Bytes(8000, 7);  // about one shared-memory FIFO element
  class Slow : public MessageHandler {
   public:
    std::span<uint8_t> Place(PeerId, std::span<const uint8_t>, size_t) override { return {}; }
    void Deliver(PeerId from, std::span<const uint8_t>, std::span<const uint8_t>,
                 absl::Status) override {
      const int c = count_.fetch_add(1);
      if (c % kBurst == 0) absl::SleepFor(absl::Milliseconds(100));  // busy as a burst starts
      if (c % kBurst == kBurst - 1 && after_burst) after_burst(from);
    }
    int count() const { return count_.load(); }
    std::function<void(PeerId)> after_burst;

   private:
    std::atomic<int> count_{0};
  } server_side, client_side;
  auto burst = [&](Transport& from, PeerId to, Tag tag) {
    for (int i = 0; i < kBurst; ++i) {
      uint8_t header[4];
      std::memcpy(header, &i, 4);
      from.Send(to, tag, header, {payload}, [](absl::Status s) { EXPECT_TRUE(s.ok()) << s; });
    }
  };
  // The server's transport thread reads the server through an atomic: the only order
  // between that thread and this one's writes runs through UCX's shared memory, which
  // ThreadSanitizer cannot see (tests/thread_checks).
  std::atomic<Transport*> server{nullptr};
  server_side.after_burst = [&](PeerId from) { burst(*server.load(), from, kFrameTag); };
  MakePair(&server_side, &client_side);
  server.store(server_.get());
  // The transports go before the handlers and the payload they use, however the test ends.
  absl::Cleanup close = [&] {
    client_.reset();
    server_.reset();
  };
  for (int round = 1; round <= 3; ++round) {
    burst(*client_, to_server_, kFrameTag + 1);
    for (int i = 0; i < 2000 && client_side.count() < round * kBurst; ++i) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    ASSERT_EQ(server_side.count(), round * kBurst);
    ASSERT_EQ(client_side.count(), round * kBurst);
  }
  EXPECT_EQ(client_->LostWakeups(), 0);
  EXPECT_EQ(server_->LostWakeups(), 0);
}

// Round trips whose answers the sender takes off the transport on its own thread
// (ProgressUntil), as a compute node's step thread does once per layer, while the
// transport thread, woken by the same traffic, competes for them. The client's handler
// acknowledges each answer with a send of its own, from whichever thread it runs on. Every
// answer and every acknowledgement arrives once and in order, and with UCX some answers
// were delivered on the test's thread.
TEST_P(TransportTest, AnswersTakenOnTheWaitingThreadArriveOnceAndInOrder) {
  constexpr int kRounds = 300;
  class Echo : public MessageHandler {
   public:
    std::span<uint8_t> Place(PeerId, std::span<const uint8_t>, size_t) override { return {}; }
    void Deliver(PeerId from, std::span<const uint8_t> header, std::span<const uint8_t>,
                 absl::Status) override {
      transport.load()->Send(from, kFrameTag, header, {},
                             [](absl::Status s) { EXPECT_TRUE(s.ok()) << s; });
    }
    std::atomic<Transport*> transport{nullptr};  // see SendsToABusyPeerLoseNoWakeUp
  } echo;
  class Answers : public MessageHandler {
   public:
    std::span<uint8_t> Place(PeerId, std::span<const uint8_t>, size_t) override { return {}; }
    void Deliver(PeerId from, std::span<const uint8_t> header, std::span<const uint8_t>,
                 absl::Status status) override {
      EXPECT_TRUE(status.ok()) << status;
      int index;
      std::memcpy(&index, header.data(), 4);
      {
        std::lock_guard<std::mutex> lock(mu);
        indices.push_back(index);
        on_waiting_thread += std::this_thread::get_id() == waiting_thread ? 1 : 0;
      }
      // The acknowledgement, sent from inside the handler.
      transport.load()->Send(from, kFrameTag, header, {},
                             [](absl::Status s) { EXPECT_TRUE(s.ok()) << s; });
    }
    int count() {
      std::lock_guard<std::mutex> lock(mu);
      return static_cast<int>(indices.size());
    }
    std::mutex mu;
    std::vector<int> indices;
    int on_waiting_thread = 0;
    std::thread::id waiting_thread = std::this_thread::get_id();
    std::atomic<Transport*> transport{nullptr};  // see SendsToABusyPeerLoseNoWakeUp
  } answers;
  MakePair(&echo, &answers);
  absl::Cleanup close = [&] {
    client_.reset();
    server_.reset();
  };
  echo.transport.store(server_.get());
  answers.transport.store(client_.get());
  for (int i = 0; i < kRounds; ++i) {
    uint8_t header[4];
    std::memcpy(header, &i, 4);
    client_->Send(to_server_, kFrameTag + 1, header, {},
                  [](absl::Status s) { EXPECT_TRUE(s.ok()); });
    const absl::Time give_up = absl::Now() + absl::Seconds(20);
    // Short spins, some of which run out, so that both threads take answers.
    while (!client_->ProgressUntil([&] { return answers.count() > i; },
                                   absl::Now() + absl::Microseconds(i % 3 == 0 ? 5 : 200))) {
      ASSERT_LT(absl::Now(), give_up) << "no answer to message " << i;
    }
  }
  ASSERT_TRUE(server_rx_.WaitFor(kRounds));
  const auto acks = server_rx_.messages();
  std::lock_guard<std::mutex> lock(answers.mu);
  ASSERT_EQ(answers.indices.size(), kRounds);
  for (int i = 0; i < kRounds; ++i) {
    ASSERT_EQ(answers.indices[i], i);
    int index;
    std::memcpy(&index, acks[i].header.data(), 4);
    ASSERT_EQ(index, i);
  }
  if (GetParam().config.backend == transport::Backend::kUcx) {
    EXPECT_GT(answers.on_waiting_thread, 0);
  } else {
    EXPECT_EQ(answers.on_waiting_thread, 0);  // inproc progresses nothing on the caller
  }
  EXPECT_EQ(client_->LostWakeups(), 0);
}

// A handler still running when its transport is destroyed may send on it: the send fails
// or is dropped, and nothing crashes. (A fake compute node answering as its inproc transport
// went down once crashed data_plane_executor_test: the transport let go of its event queue
// before the delivery in progress had finished.)
TEST_P(TransportTest, AHandlerMaySendWhileItsTransportIsDestroyed) {
  class AnswersLate : public MessageHandler {
   public:
    std::span<uint8_t> Place(PeerId, std::span<const uint8_t>, size_t) override { return {}; }
    void Deliver(PeerId from, std::span<const uint8_t>, std::span<const uint8_t>,
                 absl::Status) override {
      if (entered.exchange(true)) return;
      absl::SleepFor(absl::Milliseconds(200));  // the transport's destructor starts meanwhile
      const uint8_t header[4] = {};
      transport.load()->Send(from, kFrameTag, header, {}, [](absl::Status) {});
      sent.store(true);
    }
    std::atomic<Transport*> transport{nullptr};
    std::atomic<bool> entered{false}, sent{false};
  } late;
  MakePair(&late);
  late.transport.store(server_.get());
  const uint8_t header[4] = {};
  client_->Send(to_server_, kFrameTag + 1, header, {}, [](absl::Status) {});
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (!late.entered.load() && absl::Now() < deadline) absl::SleepFor(absl::Microseconds(100));
  ASSERT_TRUE(late.entered.load());
  server_.reset();  // returns once the delivery in progress has finished
  EXPECT_TRUE(late.sent.load());
}

// Nothing comes: ProgressUntil gives up at its deadline, not before.
TEST_P(TransportTest, ProgressUntilReturnsFalseAtItsDeadline) {
  MakePair();
  const absl::Time deadline = absl::Now() + absl::Milliseconds(2);
  EXPECT_FALSE(client_->ProgressUntil([] { return false; }, deadline));
  if (GetParam().config.backend == transport::Backend::kUcx) EXPECT_GE(absl::Now(), deadline);
  EXPECT_TRUE(client_->ProgressUntil([] { return true; }, deadline));
}

TEST_P(TransportTest, SendToUnknownPeerFails) {
  MakePair();
  const uint8_t header[4] = {1, 2, 3, 4};
  const absl::Status status =
      SendAndWait(*client_, to_server_ + 1000, kFrameTag, header, {}, absl::Seconds(20));
  EXPECT_FALSE(status.ok());
}

// Each connection holds a socket of its own for as long as it lasts (UCX's liveness socket,
// ucx_bootstrap.h): connections that come and go leave none behind, on either side.
TEST_P(TransportTest, ConnectionsThatComeAndGoLeaveNoFileDescriptors) {
  auto open_fds = [] {
    return std::distance(std::filesystem::directory_iterator("/proc/self/fd"),
                         std::filesystem::directory_iterator());
  };
  MakePair();
  const uint8_t header[4] = {};
  ASSERT_TRUE(SendAndWait(*client_, to_server_, kFrameTag, header, {}, absl::Seconds(20)).ok());
  const auto before = open_fds();
  for (int i = 0; i < 20; ++i) {
    auto peer = client_->Connect(server_address_);
    ASSERT_TRUE(peer.ok()) << peer.status();
    ASSERT_TRUE(SendAndWait(*client_, *peer, kFrameTag, header, {}, absl::Seconds(20)).ok());
    client_->Disconnect(*peer);
  }
  // The server closes its ends once it reads the client's: a Disconnect reaches it.
  ASSERT_TRUE(server_events_.WaitFor(PeerEvent::kDisconnected));
  bool settled = false;
  for (int i = 0; i < 200 && !settled; ++i) {
    {
      std::lock_guard<std::mutex> lock(server_events_.mu);
      int gone = 0;
      for (const auto& [id, event] : server_events_.events)
        gone += event == PeerEvent::kDisconnected;
      settled = gone == 20;
    }
    if (!settled) absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_TRUE(settled) << "the server did not hear of every disconnect";
  // UCX closes a tcp endpoint's own sockets once its close completes on the transport
  // thread, a moment after the Disconnect returns: the count comes back, not at once.
  auto now = open_fds();
  for (int i = 0; i < 250 && now > before; ++i) {
    absl::SleepFor(absl::Milliseconds(20));
    now = open_fds();
  }
  EXPECT_LE(now, before) << "connections left file descriptors open";
  // The first connection still works.
  EXPECT_TRUE(SendAndWait(*client_, to_server_, kFrameTag, header, {}, absl::Seconds(20)).ok());
}

TEST_P(TransportTest, DeadPeerIsReported) {
  MakePair();
  client_.reset();  // the client goes away: its connection closes
  EXPECT_TRUE(server_events_.WaitFor(PeerEvent::kDisconnected));
  const uint8_t header[4] = {};
  // Sends to it fail (possibly after the transport learns of the failure).
  absl::Status status;
  for (int i = 0; i < 100; ++i) {
    status = SendAndWait(*server_, server_peer_, kFrameTag, header, {}, absl::Seconds(5));
    if (!status.ok()) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_FALSE(status.ok());
}

// A payload the receiver placed whose sender dies mid-transfer is still delivered, with an
// error: every span Place hands out is given back by one Deliver, so a receiver that keeps
// the buffer behind the span until then (the memory server's pool of frame buffers) never
// keeps it for good.
TEST_P(TransportTest, APlacedPayloadCutOffByTheSendersDeathIsStillDelivered) {
  PlacingCounter receiver;
  MakePair(&receiver);
  absl::Cleanup close = [&] {
    client_.reset();
    server_.reset();
  };
  // Large enough to be mid-transfer for a while over loopback tcp (about 0.6 GB/s).
  const std::vector<uint8_t> payload(size_t{256} << 20, 0x5a);
  const uint8_t header[8] = {7};
  client_->Send(to_server_, kFrameTag + 1, header, {payload}, [](absl::Status) {});
  ASSERT_TRUE(receiver.WaitFor([](int placed, int) { return placed >= 1; }))
      << "the payload was never placed";
  client_.reset();  // the sender dies with its payload under way
  ASSERT_TRUE(server_events_.WaitFor(PeerEvent::kDisconnected));
  ASSERT_TRUE(receiver.WaitFor([](int placed, int delivered) { return delivered >= placed; }))
      << "a placed payload was never delivered";
  // Once: one place, one delivery. Usually with an error over UCX, the sender gone before
  // its payload is all sent; a slow run (ThreadSanitizer) may see the send finish first, so
  // the status is not checked.
  absl::SleepFor(absl::Milliseconds(100));  // time for a second delivery, were there one
  EXPECT_TRUE(receiver.WaitFor([&](int placed, int delivered) {
    EXPECT_EQ(placed, 1);
    EXPECT_EQ(delivered, 1);
    return true;
  }));
  EXPECT_EQ(receiver.misplaced(), 0) << "a placed payload delivered elsewhere";
}

// A send's completion, counted: how many times `done` ran (its status is not checked: the
// send may finish before the Disconnect).
struct SendCompletions {
  std::mutex mu;
  std::condition_variable cv;
  int calls = 0;
  SendDone Callback() {
    return [this](absl::Status) {
      std::lock_guard<std::mutex> lock(mu);
      ++calls;
      cv.notify_all();
    };
  }
  bool WaitForCall() {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(20), [&] { return calls > 0; });
  }
  int Calls() {
    std::lock_guard<std::mutex> lock(mu);
    return calls;
  }
};

// Disconnect of a live peer in the middle of a large transfer, by either end: the sender's
// completion runs once, the receiver's placed span comes back in exactly one Deliver, the
// other end learns of the disconnect, and both transports go on serving new connections.
//
// Not over UCX's tcp transport by default: there UCX 1.13 (Debian 12's) crashes the
// sender's transport thread after its endpoint is force-closed with a rendezvous send
// under way, whichever end closed (segfaults, and endless spins, in uct_tcp_iface_progress
// and ucp_ep_create; 7 runs in 30 of BySender over the three tcp backends). Changing the
// close (flushing the sends first, then an orderly close) ended the crash but left each
// closed connection's sockets open; see docs/architecture.md, "Faults".
// STRATA_TEST_TCP_MID_TRANSFER=1 runs the tcp backends too, to reproduce it.
class DisconnectMidTransfer : public TransportTest {
 protected:
  void Run(bool by_sender) {
    PlacingCounter receiver;
    MakePair(&receiver);
    // Large enough to be mid-transfer for a while over loopback tcp (about 0.6 GB/s); over
    // shared memory it may be done before the Disconnect, which is allowed.
    const std::vector<uint8_t> payload(size_t{256} << 20, 0x3c);
    const uint8_t header[8] = {9};
    SendCompletions sent;
    client_->Send(to_server_, kFrameTag + 1, header, {payload}, sent.Callback());
    ASSERT_TRUE(receiver.WaitFor([](int placed, int) { return placed >= 1; }))
        << "the payload was never placed";
    if (by_sender) {
      client_->Disconnect(to_server_);
      ASSERT_TRUE(server_events_.WaitFor(PeerEvent::kDisconnected));
    } else {
      server_->Disconnect(server_peer_);
    }
    ASSERT_TRUE(sent.WaitForCall()) << "the send never completed";
    ASSERT_TRUE(receiver.WaitFor([](int placed, int delivered) { return delivered >= placed; }))
        << "a placed payload was never delivered";
    absl::SleepFor(absl::Milliseconds(100));  // time for a second call, were there one
    EXPECT_EQ(sent.Calls(), 1);
    EXPECT_TRUE(receiver.WaitFor([&](int placed, int delivered) {
      EXPECT_EQ(placed, 1);
      EXPECT_EQ(delivered, 1);
      return true;
    }));
    EXPECT_EQ(receiver.misplaced(), 0) << "a placed payload delivered elsewhere";
    // Sends to the closed peer fail.
    const uint8_t small[4] = {1, 2, 3, 4};
    EXPECT_FALSE(
        SendAndWait(*client_, to_server_, kFrameTag + 1, small, {}, absl::Seconds(20)).ok());
    // Both ends still serve: a new connection carries a round trip.
    auto again = client_->Connect(server_address_);
    ASSERT_TRUE(again.ok()) << again.status();
    ASSERT_TRUE(SendAndWait(*client_, *again, kFrameTag, small, {}, absl::Seconds(20)).ok());
    ASSERT_TRUE(server_rx_.WaitFor(1));
    EXPECT_EQ(server_rx_.messages()[0].header, std::vector<uint8_t>(small, small + 4));
  }
};

TEST_P(DisconnectMidTransfer, BySender) { Run(/*by_sender=*/true); }
TEST_P(DisconnectMidTransfer, ByReceiver) { Run(/*by_sender=*/false); }

TEST_P(TransportTest, ConnectToNobodyFails) {
  auto client = Transport::Create(GetParam().config);
  ASSERT_TRUE(client.ok());
  // A port nobody listens on (bound by no one after the probe transport closes).
  const std::string address =
      GetParam().config.backend == transport::Backend::kInproc ? "nobody-here" : "127.0.0.1:1";
  auto peer = (*client)->Connect(address);
  EXPECT_FALSE(peer.ok());
}

// A connect to a peer that took the connection and never answers (a hung process: its
// kernel accepts for it) lasts until the connect timeout, unless its owner aborts it; then
// it ends at once, and a later connect fails without trying.
TEST_P(TransportTest, AbortedConnectsEndAtOnce) {
  if (GetParam().config.backend == transport::Backend::kInproc) {
    GTEST_SKIP() << "in-process connects never wait on a peer";
  }
  HungListener listener;
  const std::string& hung = listener.address();
  ASSERT_FALSE(hung.empty());

  TransportConfig config = GetParam().config;
  config.connect_timeout = absl::Seconds(30);
  auto client = Transport::Create(config);
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<PeerId> first = absl::UnknownError("not returned");
  absl::Time returned;
  std::thread connecting([&] {
    first = (*client)->Connect(hung);
    returned = absl::Now();
  });
  absl::SleepFor(absl::Milliseconds(300));
  const absl::Time aborted = absl::Now();
  (*client)->AbortConnects();
  connecting.join();
  EXPECT_TRUE(absl::IsCancelled(first.status())) << first.status();
  EXPECT_LT(returned - aborted, absl::Seconds(5)) << "the connect waited for its timeout";
  const absl::Time again = absl::Now();
  auto later = (*client)->Connect(hung);
  EXPECT_TRUE(absl::IsCancelled(later.status())) << later.status();
  EXPECT_LT(absl::Now() - again, absl::Seconds(1));
}

TEST_P(TransportTest, ReportsCapabilities) {
  auto t = Transport::Create(GetParam().config);
  ASSERT_TRUE(t.ok());
  const Capabilities c = (*t)->capabilities();
  EXPECT_EQ(c.backend, AbslUnparseFlag(GetParam().config.backend));
  EXPECT_FALSE(c.ToString().empty());
  // Shared memory too: the connections' liveness sockets find its dead peers.
  EXPECT_TRUE(c.detects_dead_peers);
  if (GetParam().config.backend == transport::Backend::kUcx) {
    EXPECT_NE(c.details.find(GetParam().config.ucx_options.at("TLS")), std::string::npos)
        << c.details;
    // Shared memory sends up to 256 KiB eagerly by default; tcp leaves it to UCX.
    EXPECT_EQ(c.details.find("eager up to 262144 bytes") != std::string::npos,
              GetParam().name == "ucx_sm")
        << c.details;
  }
}

TEST_P(TransportTest, DescribesWhatCarriesAPeer) {
  MakePair();
  const std::string lanes = client_->DescribePeer(to_server_);
  if (GetParam().name == "ucx_sm") {
    // Shared memory carries the data; tcp only sets the connection up.
    EXPECT_TRUE(lanes.find("posix") != std::string::npos ||
                lanes.find("sysv") != std::string::npos || lanes.find("cma") != std::string::npos)
        << lanes;
  } else if (GetParam().name == "ucx_tcp") {
    EXPECT_NE(lanes.find("tcp"), std::string::npos) << lanes;
  }
  EXPECT_EQ(client_->DescribePeer(to_server_ + 99).find("lane["), std::string::npos);
  std::cout << GetParam().name << ": " << lanes << "\n";
}

// Both ends of a connection hold the same 32-byte secret; another connection, even between
// the same two transports, has another (the step channel's seals rely on both).
TEST_P(TransportTest, BothEndsShareASecretOfTheirConnectionAlone) {
  MakePair();
  const std::string client_side = client_->PeerSecret(to_server_);
  EXPECT_EQ(client_side.size(), 32u);
  EXPECT_EQ(server_->PeerSecret(server_peer_), client_side);
  auto again = client_->Connect(server_address_);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(client_->PeerSecret(*again).size(), 32u);
  EXPECT_NE(client_->PeerSecret(*again), client_side);
  EXPECT_EQ(client_->PeerSecret(to_server_ + 99), "");
}

TEST_P(TransportTest, OneSidedPutWritesDataThenFlag) {
  MakePair();
  if (!server_->capabilities().one_sided_put) {
    EXPECT_FALSE(server_->RegisterRegion(nullptr, 0).ok());
    GTEST_SKIP() << GetParam().name << " has no one-sided put";
  }
  // One region: 1 MiB of data followed by an 8-byte completion flag.
  const size_t bytes = 1 << 20;
  std::vector<uint64_t> target(bytes / 8 + 1, 0);
  auto region = server_->RegisterRegion(target.data(), target.size() * 8);
  ASSERT_TRUE(region.ok()) << region.status();
  const auto data = Bytes(bytes, 42);
  std::mutex mu;
  std::condition_variable cv;
  std::optional<absl::Status> result;
  client_->PutWithFlag(to_server_, *region, region->address, data, region->address + bytes, 7,
                       [&](absl::Status s) {
                         std::lock_guard<std::mutex> lock(mu);
                         result = s;
                         cv.notify_all();
                       });
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, absl::ToChronoNanoseconds(absl::Seconds(20)),
                            [&] { return result.has_value(); }));
  }
  ASSERT_TRUE(result->ok()) << *result;
  const volatile uint64_t* flag = &target[bytes / 8];
  for (int i = 0; i < 5000 && *flag != 7; ++i) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(*flag, 7u);
  EXPECT_EQ(std::memcmp(target.data(), data.data(), bytes), 0);
}

INSTANTIATE_TEST_SUITE_P(Backends, TransportTest, ::testing::ValuesIn(Backends()),
                         [](const auto& info) { return info.param.name; });
std::vector<Backend> MidTransferBackends() {
  if (getenv("STRATA_TEST_TCP_MID_TRANSFER") != nullptr) return Backends();
  std::vector<Backend> out;
  for (const Backend& b : Backends()) {
    if (b.name == "inproc" || b.name == "ucx_sm") out.push_back(b);
  }
  return out;
}
INSTANTIATE_TEST_SUITE_P(Backends, DisconnectMidTransfer,
                         ::testing::ValuesIn(MidTransferBackends()),
                         [](const auto& info) { return info.param.name; });

TEST(Transport, BackendAndErrorModeNamesParseAndBadOnesAreRefused) {
  transport::Backend backend;
  ErrorMode mode;
  std::string error;
  EXPECT_TRUE(AbslParseFlag("inproc", &backend, &error));
  EXPECT_EQ(backend, transport::Backend::kInproc);
  EXPECT_TRUE(AbslParseFlag("none", &mode, &error));
  EXPECT_EQ(mode, ErrorMode::kNone);
  EXPECT_FALSE(AbslParseFlag("carrier-pigeon", &backend, &error));
  EXPECT_NE(error.find("ucx, inproc"), std::string::npos) << error;
  EXPECT_FALSE(AbslParseFlag("sometimes", &mode, &error));
  EXPECT_NE(error.find("peer, none"), std::string::npos) << error;
  for (transport::Backend b : {transport::Backend::kUcx, transport::Backend::kInproc}) {
    ASSERT_TRUE(AbslParseFlag(AbslUnparseFlag(b), &backend, &error));
    EXPECT_EQ(backend, b);
  }
}

TEST(Transport, BadUcxOptionIsAnError) {
  TransportConfig config;
  config.ucx_options = {{"RNDV_THRESH", "a lot"}};  // a size that does not parse
  EXPECT_FALSE(Transport::Create(config).ok());
}

}  // namespace
}  // namespace strata::transport
