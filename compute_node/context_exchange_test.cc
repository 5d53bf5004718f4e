// The context exchange of rotational pipelining over the in-process transport: a context
// sent by one replica arrives bit for bit at the other, and so does a failure sent in its
// place; a malformed frame (bad checksum,
// wrong size, wrong kind or dtype) is rejected and counted, a stale one (another epoch, or a
// step already finished with) is dropped and counted, and neither is ever taken for a
// context; the exchange keeps working after each.
#include "compute_node/context_exchange.h"

#include <atomic>
#include <chrono>
#include <future>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/transport/transport_testing.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using transport::FrameHeader;
using transport::FrameKind;

constexpr int64_t kHidden = 16;
constexpr uint64_t kEpoch = 9;
std::atomic<int> instance{0};

std::unique_ptr<ContextExchange> Make(std::atomic<int>* arrivals) {
  ContextExchangeOptions o;
  o.transport.backend = transport::Backend::kInproc;
  o.listen_address = absl::StrCat("context-exchange-test-", ++instance);
  o.hidden = kHidden;
  o.on_arrival = [arrivals] { ++*arrivals; };
  auto e = ContextExchange::Create(o);
  EXPECT_TRUE(e.ok()) << e.status();
  (*e)->SetEpoch(kEpoch);
  return std::move(*e);
}

// Waits until `pred` holds (frames are delivered on the transport thread).
template <typename Pred>
bool Eventually(Pred pred) {
  const absl::Time until = absl::Now() + absl::Seconds(5);
  while (absl::Now() < until) {
    if (pred()) return true;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return pred();
}

std::vector<float> Rows(int m, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> x(m * kHidden);
  for (float& f : x) f = d(rng);
  return x;
}

TEST(ContextExchangeTest, ContextArrivesBitForBit) {
  std::atomic<int> arrivals{0};
  auto a = Make(&arrivals), b = Make(&arrivals);
  const std::vector<float> x = Rows(5, 1);
  ASSERT_TRUE(a->Send(b->address(), 42, 3, 1, x.data(), 5).ok());
  ASSERT_TRUE(Eventually([&] { return b->Arrived(1, 42, 3); }));
  EXPECT_FALSE(b->Arrived(1, 42, 2));
  EXPECT_FALSE(b->Arrived(0, 42, 3));
  std::vector<float> got(5 * kHidden, 0.0f);
  ContextExchange::Taken taken;
  EXPECT_TRUE(absl::IsDataLoss(b->Take(1, 42, 3, got.data(), 4, &taken)));  // not the plan's rows
  ASSERT_TRUE(a->Send(b->address(), 42, 3, 1, x.data(), 5).ok());
  ASSERT_TRUE(Eventually([&] { return b->Arrived(1, 42, 3); }));
  ASSERT_TRUE(b->Take(1, 42, 3, got.data(), 5, &taken).ok());
  EXPECT_EQ(got, x);
  EXPECT_TRUE(absl::IsNotFound(b->Take(1, 42, 3, got.data(), 5, &taken)));  // taken once
  EXPECT_EQ(b->stats().received, 2u);
  EXPECT_EQ(b->stats().rejected, 0u);
}

// A context names the pools whose memory nodes failed the step so far, after its rows: the
// receiver sees that before taking it (its replica stops waiting for their answers) and
// takes the same pools with rows that are still bit for bit. A context without failed pools
// says so.
TEST(ContextExchangeTest, AContextNamesTheFailedPools) {
  std::atomic<int> arrivals{0};
  auto a = Make(&arrivals), b = Make(&arrivals);
  const std::vector<float> x = Rows(4, 5);
  const std::vector<PoolIndex> failed = {PoolIndex(3), PoolIndex(0)};
  ASSERT_TRUE(a->Send(b->address(), 7, 2, 1, x.data(), 4, failed).ok());
  ASSERT_TRUE(Eventually([&] { return b->Arrived(1, 7, 2); }));
  EXPECT_TRUE(b->ArrivedWithFailedPools(1, 7, 2));
  EXPECT_FALSE(b->FailureArrived(1, 7, 2));
  std::vector<float> got(4 * kHidden, 0.0f);
  ContextExchange::Taken taken;
  ASSERT_TRUE(b->Take(1, 7, 2, got.data(), 4, &taken).ok());
  EXPECT_EQ(got, x);
  EXPECT_EQ(taken.failed_pools, failed);

  ASSERT_TRUE(a->Send(b->address(), 8, 2, 1, x.data(), 4).ok());
  ASSERT_TRUE(Eventually([&] { return b->Arrived(1, 8, 2); }));
  EXPECT_FALSE(b->ArrivedWithFailedPools(1, 8, 2));
  ASSERT_TRUE(b->Take(1, 8, 2, got.data(), 4, &taken).ok());
  EXPECT_EQ(got, x);
  EXPECT_TRUE(taken.failed_pools.empty());
  // More than a context may name is refused at the sender.
  const std::vector<PoolIndex> too_many(ContextExchange::kMaxFailedPools + 1, PoolIndex(1));
  EXPECT_TRUE(absl::IsInvalidArgument(a->Send(b->address(), 9, 2, 1, x.data(), 4, too_many)));
  EXPECT_EQ(b->stats().rejected, 0u);
}

// A replica that gives up a step sends a failure in place of the context it owed: the
// receiver holds it as that context's arrival, and taking it gives the sender's status, so
// that the receiving replica gives up at once and passes it on. A forged failure with more
// text than an error frame carries is rejected like any malformed frame.
TEST(ContextExchangeTest, AFailureComesInPlaceOfAContext) {
  std::atomic<int> arrivals{0};
  auto a = Make(&arrivals), b = Make(&arrivals);
  const absl::Status why = absl::UnavailableError("memory node of pool 1 is dead or hung");
  ASSERT_TRUE(a->SendFailure(b->address(), 42, 3, 1, why).ok());
  ASSERT_TRUE(Eventually([&] { return b->Arrived(1, 42, 3); }));
  EXPECT_TRUE(b->FailureArrived(1, 42, 3));
  EXPECT_FALSE(b->FailureArrived(1, 42, 2));
  std::vector<float> got(5 * kHidden, 0.0f);
  ContextExchange::Taken taken;
  EXPECT_EQ(b->Take(1, 42, 3, got.data(), 5, &taken), why);
  EXPECT_FALSE(b->Arrived(1, 42, 3));  // taken once
  // A context still arrives as a context.
  const std::vector<float> x = Rows(5, 1);
  ASSERT_TRUE(a->Send(b->address(), 43, 3, 1, x.data(), 5).ok());
  ASSERT_TRUE(Eventually([&] { return b->Arrived(1, 43, 3); }));
  EXPECT_FALSE(b->FailureArrived(1, 43, 3));
  ASSERT_TRUE(b->Take(1, 43, 3, got.data(), 5, &taken).ok());
  EXPECT_EQ(got, x);

  auto raw = transport::Transport::Create({transport::Backend::kInproc});
  ASSERT_TRUE(raw.ok());
  auto peer = (*raw)->Connect(b->address());
  ASSERT_TRUE(peer.ok()) << peer.status();
  auto text = std::make_shared<std::string>(transport::kMaxErrorText + 1, 'x');
  FrameHeader h;
  h.kind = static_cast<uint16_t>(FrameKind::kError);
  h.step_id = 44;
  h.epoch = kEpoch;
  h.layer = 3;
  h.minibatch = 1;
  h.flags = static_cast<uint16_t>(absl::StatusCode::kUnavailable);
  const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(text->data()),
                                       text->size());
  h.payload_bytes = bytes.size();
  h.checksum = transport::PayloadChecksum(bytes);
  (*raw)->Send(*peer, transport::kFrameTag, transport::AsBytes(h), {bytes},
               [text](absl::Status) {});
  ASSERT_TRUE(Eventually([&] { return b->stats().rejected == 1; })) << b->stats().rejected;
  EXPECT_FALSE(b->Arrived(1, 44, 3));
  (*raw)->Disconnect(*peer);
}

// A replica that connected to this one introduces itself with the address it listens at;
// once its connection closes, that address has departed, and a replica back at it (a new
// hello) has not. A hello longer than an address is rejected.
TEST(ContextExchangeTest, AReplicaThatConnectedAndWentHasDeparted) {
  std::atomic<int> arrivals{0};
  auto a = Make(&arrivals), b = Make(&arrivals);
  const std::string a_address = a->address();
  const std::vector<float> x = Rows(2, 3);
  ASSERT_TRUE(a->Send(b->address(), 7, 1, 0, x.data(), 2).ok());
  ASSERT_TRUE(Eventually([&] { return b->Arrived(0, 7, 1); }));
  EXPECT_FALSE(b->Departed(a_address, 7));
  a.reset();  // its process ends: its connections close
  ASSERT_TRUE(Eventually([&] { return b->Departed(a_address, 7); }));
  EXPECT_FALSE(b->Departed(b->address(), 7));

  auto raw = transport::Transport::Create({transport::Backend::kInproc});
  ASSERT_TRUE(raw.ok());
  auto peer = (*raw)->Connect(b->address());
  ASSERT_TRUE(peer.ok()) << peer.status();
  auto hello = [&](const std::string& text) {
    auto keep = std::make_shared<std::string>(text);
    const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(keep->data()),
                                         keep->size());
    FrameHeader h;
    h.kind = static_cast<uint16_t>(FrameKind::kHello);
    h.payload_bytes = bytes.size();
    h.checksum = transport::PayloadChecksum(bytes);
    (*raw)->Send(*peer, transport::kFrameTag, transport::AsBytes(h), {bytes},
                 [keep](absl::Status) {});
  };
  hello(std::string(ContextExchange::kMaxHelloBytes + 1, 'x'));
  ASSERT_TRUE(Eventually([&] { return b->stats().rejected == 1; })) << b->stats().rejected;
  hello(a_address);  // back at the same address
  ASSERT_TRUE(Eventually([&] { return !b->Departed(a_address, 7); }));
  (*raw)->Disconnect(*peer);
  ASSERT_TRUE(Eventually([&] { return b->Departed(a_address, 7); }));
}

// A replica the scheduler declared dead (a hung one: its connection stays open) has
// departed for the steps it was sent, and for no later one; the declaration wakes the
// driver, and a new epoch (another scheduler's step ids) forgets it.
TEST(ContextExchangeTest, AReplicaTheSchedulerDeclaredDeadHasDepartedForItsSteps) {
  std::atomic<int> a_arrivals{0}, arrivals{0};
  auto a = Make(&a_arrivals), b = Make(&arrivals);
  const std::string a_address = a->address();
  const std::vector<float> x = Rows(2, 3);
  ASSERT_TRUE(a->Send(b->address(), 7, 1, 0, x.data(), 2).ok());  // it connected
  ASSERT_TRUE(Eventually([&] { return b->Arrived(0, 7, 1) && arrivals.load() == 1; }));
  const int before = arrivals.load();
  b->Depart(a_address, 9);
  EXPECT_EQ(arrivals.load(), before + 1) << "the driver was not woken";
  EXPECT_TRUE(b->Departed(a_address, 8));
  EXPECT_TRUE(b->Departed(a_address, 9));
  EXPECT_FALSE(b->Departed(a_address, 10)) << "a step sent after the declaration";
  EXPECT_FALSE(b->Departed(b->address(), 9));
  // Nothing more goes to it for those steps, not even a connection attempt (one to a hung
  // replica would wait for the connect timeout); later steps' contexts do.
  const absl::Status refused = b->Send(a_address, 9, 1, 0, x.data(), 2);
  EXPECT_TRUE(absl::IsUnavailable(refused)) << refused;
  EXPECT_TRUE(absl::IsUnavailable(b->SendFailure(a_address, 8, 1, 0, absl::AbortedError("x"))));
  ASSERT_TRUE(b->Send(a_address, 10, 1, 0, x.data(), 2).ok());
  ASSERT_TRUE(Eventually([&] { return a->Arrived(0, 10, 1); }));
  EXPECT_FALSE(a->Arrived(0, 9, 1));
  b->Depart(a_address, 4);  // an older declaration does not shorten it, nor wake anyone
  EXPECT_TRUE(b->Departed(a_address, 9));
  EXPECT_EQ(arrivals.load(), before + 1);
  b->Depart(a_address, 12);
  EXPECT_TRUE(b->Departed(a_address, 12));
  b->SetEpoch(kEpoch + 1);
  EXPECT_FALSE(b->Departed(a_address, 1)) << "another scheduler's steps";
  // The oldest declarations go beyond kMaxDepartures.
  for (size_t i = 0; i <= ContextExchange::kMaxDepartures; ++i) {
    b->Depart(absl::StrCat("replica-", i), 5);
  }
  EXPECT_FALSE(b->Departed("replica-0", 5));
  EXPECT_TRUE(b->Departed("replica-1", 5));
  EXPECT_TRUE(b->Departed(absl::StrCat("replica-", ContextExchange::kMaxDepartures), 5));
}

TEST(ContextExchangeTest, MalformedAndStaleFramesAreRejectedAndCounted) {
  std::atomic<int> arrivals{0};
  auto b = Make(&arrivals);
  // A raw sender, to forge frames.
  auto raw = transport::Transport::Create({transport::Backend::kInproc});
  ASSERT_TRUE(raw.ok());
  auto peer = (*raw)->Connect(b->address());
  ASSERT_TRUE(peer.ok()) << peer.status();
  const std::vector<float> x = Rows(3, 2);
  auto send = [&](FrameHeader h, std::vector<float> body) {
    auto keep = std::make_shared<std::vector<float>>(std::move(body));
    const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(keep->data()),
                                         keep->size() * sizeof(float));
    (*raw)->Send(*peer, transport::kFrameTag, transport::AsBytes(h), {bytes},
                 [keep](absl::Status) {});
  };
  auto good = [&](uint64_t step) {
    FrameHeader h;
    h.kind = static_cast<uint16_t>(FrameKind::kContext);
    h.step_id = step;
    h.epoch = kEpoch;
    h.layer = 1;
    h.minibatch = 0;
    h.rows = 3;
    h.dtype = static_cast<uint16_t>(transport::FrameDType::kF32);
    h.payload_bytes = x.size() * sizeof(float);
    h.checksum = transport::PayloadChecksum(std::span<const uint8_t>(
        reinterpret_cast<const uint8_t*>(x.data()), x.size() * sizeof(float)));
    return h;
  };
  FrameHeader bad_sum = good(10);
  bad_sum.checksum ^= 1;
  send(bad_sum, x);
  FrameHeader bad_rows = good(10);
  bad_rows.rows = 4;  // the payload holds 3
  send(bad_rows, x);
  FrameHeader bad_kind = good(10);
  bad_kind.kind = static_cast<uint16_t>(FrameKind::kLayer);
  send(bad_kind, x);
  FrameHeader bad_dtype = good(10);
  bad_dtype.dtype = static_cast<uint16_t>(transport::FrameDType::kBF16);
  send(bad_dtype, x);
  FrameHeader bad_pools = good(10);
  bad_pools.flags = 1;  // names a failed pool, but the payload holds the rows alone
  send(bad_pools, x);
  // No rows and one pool more than a context may name, in a payload of the size claimed.
  FrameHeader too_many_pools = good(10);
  too_many_pools.rows = 0;
  too_many_pools.flags = static_cast<uint16_t>(ContextExchange::kMaxFailedPools + 1);
  std::vector<float> pool_words(ContextExchange::kMaxFailedPools + 1, 0.0f);
  too_many_pools.payload_bytes = pool_words.size() * sizeof(float);
  too_many_pools.checksum = transport::PayloadChecksum(std::span<const uint8_t>(
      reinterpret_cast<const uint8_t*>(pool_words.data()), too_many_pools.payload_bytes));
  send(too_many_pools, pool_words);
  ASSERT_TRUE(Eventually([&] { return b->stats().rejected == 6; })) << b->stats().rejected;
  EXPECT_FALSE(b->Arrived(0, 10, 1));

  FrameHeader old_epoch = good(10);
  old_epoch.epoch = kEpoch - 1;
  send(old_epoch, x);
  ASSERT_TRUE(Eventually([&] { return b->stats().stale == 1; }));
  b->Retire(0, 10);  // done with step 10 of batch 0
  send(good(10), x);
  ASSERT_TRUE(Eventually([&] { return b->stats().stale == 2; }));
  EXPECT_FALSE(b->Arrived(0, 10, 1));

  // Still works.
  send(good(11), x);
  ASSERT_TRUE(Eventually([&] { return b->Arrived(0, 11, 1); }));
  std::vector<float> got(x.size());
  ContextExchange::Taken taken;
  ASSERT_TRUE(b->Take(0, 11, 1, got.data(), 3, &taken).ok());
  EXPECT_EQ(got, x);
  EXPECT_EQ(b->stats().received, 1u);
  (*raw)->Disconnect(*peer);
}

TEST(ContextExchangeTest, UnreachableReplicaIsAClearError) {
  std::atomic<int> arrivals{0};
  auto a = Make(&arrivals);
  const std::vector<float> x = Rows(1, 3);
  absl::Status s = a->Send("no-such-replica", 1, 1, 0, x.data(), 1);
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_NE(s.message().find("no-such-replica"), std::string::npos) << s;
}

// A replica that hung before this one ever connected to it: its listening socket takes the
// connection (the kernel answers for it) but nothing answers the handshake, so the attempt
// lasts until the connect timeout. A caller waiting for it gives up when the scheduler
// declares that replica dead for the caller's step, not at the timeout; the attempt goes on
// without it, and a later step's frame waits for that same attempt.
TEST(ContextExchangeTest, ACallerConnectingToAHungReplicaGivesUpWhenItIsDeclaredDead) {
  transport::HungListener listener;  // the hung replica
  const std::string hung = listener.address();
  ASSERT_FALSE(hung.empty());

  std::atomic<int> arrivals{0};
  ContextExchangeOptions o;
  o.transport.ucx_options = {{"TLS", "tcp"}, {"NET_DEVICES", "lo"}};
  o.transport.connect_timeout = absl::Seconds(20);
  o.hidden = kHidden;
  o.on_arrival = [&arrivals] { ++arrivals; };
  auto made = ContextExchange::Create(o);
  ASSERT_TRUE(made.ok()) << made.status();
  std::unique_ptr<ContextExchange> b = std::move(*made);
  b->SetEpoch(kEpoch);
  const std::vector<float> x = Rows(1, 3);
  std::promise<absl::Status> sent, later;
  std::thread sender([&] { sent.set_value(b->Send(hung, 5, 1, 0, x.data(), 1)); });
  std::thread later_sender([&] { later.set_value(b->Send(hung, 6, 1, 0, x.data(), 1)); });
  absl::SleepFor(absl::Milliseconds(300));  // both wait for the attempt
  b->Depart(hung, 5);
  std::future<absl::Status> outcome = sent.get_future();
  const bool gave_up = outcome.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  EXPECT_TRUE(gave_up) << "the caller waited for the connect timeout";
  if (gave_up) {
    const absl::Status status = outcome.get();
    EXPECT_TRUE(absl::IsUnavailable(status)) << status;
    EXPECT_NE(status.message().find("declared it dead"), std::string::npos) << status;
  }
  // Step 6 was sent after the declaration: it still waits for the attempt, which fails
  // once the socket closes.
  std::future<absl::Status> later_outcome = later.get_future();
  EXPECT_EQ(later_outcome.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
  listener.Close();
  sender.join();
  later_sender.join();
  EXPECT_TRUE(absl::IsUnavailable(later_outcome.get()));
}

// Destroying the exchange while its attempt at a hung replica is under way (the caller
// that waited for it gave up when the replica was declared dead) cuts the attempt short
// instead of waiting for the connect timeout.
TEST(ContextExchangeTest, DestroyingTheExchangeCutsAnAttemptAtAHungReplicaShort) {
  transport::HungListener listener;
  const std::string hung = listener.address();
  ASSERT_FALSE(hung.empty());

  ContextExchangeOptions o;
  o.transport.ucx_options = {{"TLS", "tcp"}, {"NET_DEVICES", "lo"}};
  o.transport.connect_timeout = absl::Seconds(30);
  o.hidden = kHidden;
  auto made = ContextExchange::Create(o);
  ASSERT_TRUE(made.ok()) << made.status();
  std::unique_ptr<ContextExchange> b = std::move(*made);
  b->SetEpoch(kEpoch);
  const std::vector<float> x = Rows(1, 3);
  std::promise<absl::Status> sent;
  std::thread sender([&] { sent.set_value(b->Send(hung, 5, 1, 0, x.data(), 1)); });
  absl::SleepFor(absl::Milliseconds(300));  // the attempt is under way
  b->Depart(hung, 5);
  sender.join();
  EXPECT_TRUE(absl::IsUnavailable(sent.get_future().get()));
  const absl::Time start = absl::Now();
  b.reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10))
      << "the exchange waited for its attempt's connect timeout (30 s)";
}

TEST(ContextExchangeTest, EndpointsDifferByReplicaAndSlot) {
  EXPECT_NE(RotationEndpoint("a:1", 0), RotationEndpoint("a:1", 1));
  EXPECT_NE(RotationEndpoint("a:1", 0), RotationEndpoint("a:2", 0));
  EXPECT_EQ(RotationEndpoint("a:1", 3), RotationEndpoint("a:1", 3));
  EXPECT_NE(RotationEndpoint("", 0), 0u);
}

}  // namespace
}  // namespace strata
