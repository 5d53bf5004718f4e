#include "memory_node/load_gate.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

TEST(LoadGateTest, ALayerInDramPassesAtOnce) {
  LoadGate gate;
  ASSERT_TRUE(gate.Expect(7, absl::Now() + absl::Seconds(10)));
  gate.Advance(7, 3);
  const uint64_t tickets[] = {7};
  gate.Wait(tickets, 2);
  EXPECT_EQ(gate.stats().ready_layers, 1u);
  EXPECT_EQ(gate.stats().waited_layers, 0u);
  EXPECT_TRUE(gate.Finish(7, true));
}

TEST(LoadGateTest, AttentionWaitsForItsLayerThenGoesOn) {
  LoadGate gate;
  ASSERT_TRUE(gate.Expect(1, absl::Now() + absl::Seconds(30)));
  ASSERT_TRUE(gate.Expect(2, absl::Now() + absl::Seconds(30)));
  std::atomic<int> passed{-1};
  std::thread step([&] {
    const uint64_t tickets[] = {1, 2};
    for (int layer = 0; layer < 4; ++layer) {
      gate.Wait(tickets, layer);
      passed = layer;
    }
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(passed.load(), -1);  // nothing of either load is in DRAM
  gate.Advance(1, 2);
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(passed.load(), -1);  // ticket 2 holds layer 0 back
  gate.Advance(2, 1);
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(passed.load(), 0);
  gate.Advance(2, 4);
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(passed.load(), 1);  // ticket 1 has only layers 0 and 1
  EXPECT_TRUE(gate.Finish(1, true));
  step.join();
  EXPECT_EQ(passed.load(), 3);
  EXPECT_TRUE(gate.Finish(2, true));
  EXPECT_GE(gate.stats().waited_layers, 2u);
  EXPECT_EQ(gate.stats().abandoned, 0u);
}

TEST(LoadGateTest, AFailedLoadReleasesItsWaitersAndStaysFailed) {
  LoadGate gate;
  ASSERT_TRUE(gate.Expect(5, absl::Now() + absl::Seconds(30)));
  std::thread step([&] {
    const uint64_t tickets[] = {5};
    gate.Wait(tickets, 10);
  });
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_FALSE(gate.Finish(5, false));
  step.join();
  EXPECT_EQ(gate.stats().abandoned, 0u);
}

TEST(LoadGateTest, AStepBeforeItsMovesWaitsForThem) {
  LoadGate gate;
  std::atomic<bool> done{false};
  std::thread step([&] {
    const uint64_t tickets[] = {9};
    gate.Wait(tickets, 0);
    done = true;
  });
  absl::SleepFor(absl::Milliseconds(30));
  EXPECT_FALSE(done.load());
  ASSERT_TRUE(gate.Expect(9, absl::Now() + absl::Seconds(30)));
  gate.Advance(9, 1);
  step.join();
  EXPECT_TRUE(gate.Finish(9, true));
}

TEST(LoadGateTest, AtTheDeadlineTheStepGivesUpAndTheLoadCannotSucceed) {
  LoadGate gate;
  ASSERT_TRUE(gate.Expect(3, absl::Now() + absl::Milliseconds(50)));
  const uint64_t tickets[] = {3};
  gate.Wait(tickets, 0);  // returns at the deadline
  EXPECT_EQ(gate.stats().abandoned, 1u);
  gate.Advance(3, 8);
  // What the step read was not the load's: the load must report failure.
  EXPECT_FALSE(gate.Finish(3, true));
}

TEST(LoadGateTest, MovesThatNeverCameAreAbandonedAndRefusedLater) {
  LoadGate gate(absl::Milliseconds(40));
  const uint64_t tickets[] = {4};
  gate.Wait(tickets, 0);
  EXPECT_EQ(gate.stats().abandoned, 1u);
  EXPECT_FALSE(gate.Expect(4, absl::Now() + absl::Seconds(30)));
  EXPECT_FALSE(gate.Finish(4, true));
}

// Tickets come from compute nodes' descriptors. Unknown ones a step gave up on are
// forgotten `keep` later, and the gate holds at most max_entries: a step naming an unknown
// ticket when it is full fails at once (nothing is waited for or kept), while the
// scheduler's own moves still get in and their steps still pass.
TEST(LoadGateTest, UnknownTicketsAreBoundedAndForgotten) {
  LoadGate gate(absl::Milliseconds(30), absl::Milliseconds(50), 8);
  std::vector<uint64_t> made_up;
  for (uint64_t t = 1; t <= 8; ++t) made_up.push_back(1000 + t);
  const absl::Time start = absl::Now();
  EXPECT_TRUE(gate.Wait(made_up, 0).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(2)) << "each unknown ticket waited in turn";
  EXPECT_EQ(gate.stats().abandoned, 8u);
  EXPECT_EQ(gate.entries(), 8u);

  const uint64_t one_more[] = {2000};
  const absl::Status full = gate.Wait(one_more, 0);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_EQ(gate.stats().refused, 1u);
  EXPECT_EQ(gate.entries(), 8u);

  // The scheduler's moves are not refused, and their step passes once the layer is in.
  ASSERT_TRUE(gate.Expect(7, absl::Now() + absl::Seconds(10)));
  gate.Advance(7, 1);
  const uint64_t real[] = {7};
  EXPECT_TRUE(gate.Wait(real, 0).ok());
  EXPECT_TRUE(gate.Finish(7, true));

  // `keep` later the abandoned ones are gone, and a new unknown ticket is waited for again.
  absl::SleepFor(absl::Milliseconds(120));
  EXPECT_TRUE(gate.Wait(one_more, 0).ok());
  EXPECT_EQ(gate.entries(), 1u);
  EXPECT_EQ(gate.stats().abandoned, 9u);
}

// One owner's made-up tickets fill only its own share of the gate: past it its steps fail,
// and another owner's unknown tickets are still waited for. Moves that arrive, and entries
// forgotten, give the share back.
TEST(LoadGateTest, OneOwnersUnknownTicketsFillOnlyItsShare) {
  LoadGate gate(/*arrival_wait=*/absl::Seconds(10), /*keep=*/absl::Milliseconds(20),
                /*max_entries=*/16, /*max_per_owner=*/4);
  absl::Time wake;
  for (uint64_t t = 1; t <= 4; ++t) {
    const uint64_t ticket[] = {100 + t};
    ASSERT_TRUE(gate.Poll(ticket, 0, &wake, /*owner=*/1).ok()) << t;
  }
  const uint64_t fifth[] = {105};
  EXPECT_EQ(gate.Poll(fifth, 0, &wake, 1).status().code(), absl::StatusCode::kResourceExhausted);
  // Another owner, and a look without one (a compute node's own cache), go on.
  const uint64_t others[] = {201, 202};
  EXPECT_TRUE(gate.Poll(others, 0, &wake, /*owner=*/2).ok());
  const uint64_t own[] = {301};
  EXPECT_TRUE(gate.Poll(own, 0, &wake).ok());
  // A ticket the owner already looked for is not a new one.
  const uint64_t again[] = {101};
  EXPECT_TRUE(gate.Poll(again, 0, &wake, 1).ok());
  // One of the owner's tickets arrives: its share has room for one more.
  ASSERT_TRUE(gate.Expect(102, absl::Now() + absl::Seconds(10)));
  EXPECT_TRUE(gate.Poll(fifth, 0, &wake, 1).ok());
  const uint64_t sixth[] = {106};
  EXPECT_FALSE(gate.Poll(sixth, 0, &wake, 1).ok());
  // Given up on and forgotten, the rest give it back too.
  for (uint64_t t : {101, 103, 104, 105}) gate.Finish(t, false);
  absl::SleepFor(absl::Milliseconds(1100));  // past `keep`, and the prune's 1 s step
  EXPECT_TRUE(gate.Poll(sixth, 0, &wake, 1).ok());
  EXPECT_EQ(gate.stats().refused, 2u);
}

// Owners that fill the whole gate between them, each within its share, with tickets whose
// moves never come, cannot keep another owner out: the room its look needs is taken from
// the owners holding the most unknown tickets (it used to be refused until theirs were
// forgotten), and never from one that holds no more than the looking owner then would.
TEST(LoadGateTest, OwnersThatFillTheGateMakeRoomForAnothersTickets) {
  LoadGate gate(/*arrival_wait=*/absl::Seconds(10), /*keep=*/absl::Seconds(10),
                /*max_entries=*/16, /*max_per_owner=*/4);
  absl::Time wake;
  for (uint64_t owner = 1; owner <= 4; ++owner) {
    for (uint64_t t = 1; t <= 4; ++t) {
      const uint64_t ticket[] = {100 * owner + t};
      ASSERT_TRUE(gate.Poll(ticket, 0, &wake, owner).ok()) << owner << " " << t;
    }
  }
  ASSERT_TRUE(gate.Expect(404, absl::Now() + absl::Seconds(10)));  // owner 4 holds 3 now
  ASSERT_EQ(gate.entries(), 16u);
  const uint64_t two[] = {501, 502};
  EXPECT_TRUE(gate.Poll(two, 0, &wake, /*owner=*/5).ok()) << "kept out of a full gate";
  EXPECT_EQ(gate.entries(), 16u);
  EXPECT_EQ(gate.stats().evicted, 2u);
  // Owners 1-3 held 4: two of them gave one each. Two more would leave owner 5 with 4,
  // which no other owner holds more than; one more is taken from the owner left with 4.
  const uint64_t two_more[] = {503, 504};
  EXPECT_EQ(gate.Poll(two_more, 0, &wake, 5).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(gate.entries(), 16u);
  const uint64_t one_more[] = {503};
  EXPECT_TRUE(gate.Poll(one_more, 0, &wake, 5).ok());
  EXPECT_EQ(gate.stats().evicted, 3u);
  // Owners 1-4 hold 3 each and owner 5 holds 3: nothing is above what another look of its
  // would leave it with.
  const uint64_t fourth[] = {504};
  EXPECT_FALSE(gate.Poll(fourth, 0, &wake, 5).ok());
  // Nor for a new owner's three: it would then hold as many as each of the others.
  const uint64_t three[] = {601, 602, 603};
  EXPECT_FALSE(gate.Poll(three, 0, &wake, 6).ok());
  EXPECT_EQ(gate.stats().evicted, 3u);
  EXPECT_EQ(gate.stats().refused, 3u);
}

// Room is never taken from a ticket whose moves came, though it is the oldest that the
// biggest owner's looks brought in: its step still passes once its layer is in.
TEST(LoadGateTest, ATicketWhoseMovesCameIsNeverTaken) {
  LoadGate gate(/*arrival_wait=*/absl::Seconds(10), /*keep=*/absl::Seconds(10),
                /*max_entries=*/4, /*max_per_owner=*/4);
  absl::Time wake;
  for (uint64_t t = 101; t <= 104; ++t) {
    const uint64_t ticket[] = {t};
    ASSERT_TRUE(gate.Poll(ticket, 0, &wake, /*owner=*/1).ok());
    absl::SleepFor(absl::Milliseconds(1));  // 101 is the oldest
  }
  ASSERT_TRUE(gate.Expect(101, absl::Now() + absl::Seconds(10)));
  const uint64_t other[] = {201};
  ASSERT_TRUE(gate.Poll(other, 0, &wake, /*owner=*/2).ok());
  EXPECT_EQ(gate.stats().evicted, 1u);
  EXPECT_EQ(gate.entries(), 4u);
  gate.Advance(101, 1);
  const uint64_t arrived[] = {101};
  absl::StatusOr<bool> ready = gate.Poll(arrived, 0, &wake, 1);
  ASSERT_TRUE(ready.ok()) << ready.status();
  EXPECT_TRUE(*ready) << "the ticket whose moves came was taken";
}

// A ticket a step gave up on, taken for another owner's, is still given up on: its moves
// are refused and its load cannot succeed, as when its entry stayed.
TEST(LoadGateTest, AnAbandonedTicketTakenForAnothersStaysAbandoned) {
  LoadGate gate(/*arrival_wait=*/absl::Milliseconds(1), /*keep=*/absl::Seconds(10),
                /*max_entries=*/4, /*max_per_owner=*/4);
  absl::Time wake;
  const uint64_t four[] = {101, 102, 103, 104};
  ASSERT_TRUE(gate.Poll(four, 0, &wake, /*owner=*/1).ok());
  absl::SleepFor(absl::Milliseconds(5));
  absl::StatusOr<bool> given_up = gate.Poll(four, 0, &wake, 1);
  ASSERT_TRUE(given_up.ok() && *given_up);
  ASSERT_EQ(gate.stats().abandoned, 4u);
  const uint64_t other[] = {201};
  ASSERT_TRUE(gate.Poll(other, 0, &wake, /*owner=*/2).ok());
  ASSERT_EQ(gate.stats().evicted, 1u);
  // The oldest went (ties: the lowest ticket), and no step waits for it again.
  absl::StatusOr<bool> again = gate.Poll(four, 0, &wake, 1);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(*again);
  EXPECT_FALSE(gate.Expect(101, absl::Now() + absl::Seconds(10))) << "its moves are taken";
  EXPECT_FALSE(gate.Finish(101, true)) << "its load stands";
  EXPECT_EQ(gate.entries(), 4u);
}

// A look whose unknown tickets do not all fit the owner's share is refused before it brings
// any in. An unknown ticket that a look brought in and no step looks at again is forgotten
// like an abandoned one: it neither stays in the gate for good nor keeps its owner's share.
TEST(LoadGateTest, AnUnknownTicketNoStepLooksAtAgainIsForgotten) {
  LoadGate gate(/*arrival_wait=*/absl::Milliseconds(20), /*keep=*/absl::Milliseconds(30),
                /*max_entries=*/16, /*max_per_owner=*/4);
  absl::Time wake;
  const uint64_t first[] = {101, 102};
  ASSERT_TRUE(gate.Poll(first, 0, &wake, /*owner=*/1).ok());
  const uint64_t second[] = {103, 104, 105};
  EXPECT_EQ(gate.Poll(second, 0, &wake, 1).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(gate.entries(), 2u) << "a refused look brought tickets in";
  const uint64_t two_more[] = {103, 104};
  EXPECT_TRUE(gate.Poll(two_more, 0, &wake, 1).ok());
  EXPECT_EQ(gate.entries(), 4u);
  EXPECT_EQ(gate.stats().abandoned, 0u) << "no step looked again";
  absl::SleepFor(absl::Milliseconds(200));  // past the arrival wait and `keep`
  for (uint64_t t = 1; t <= 4; ++t) {
    const uint64_t ticket[] = {200 + t};
    EXPECT_TRUE(gate.Poll(ticket, 0, &wake, 1).ok()) << t;
  }
  EXPECT_EQ(gate.entries(), 4u);
  // Moves that come now for a forgotten ticket find a new entry; no step waits for them.
  EXPECT_TRUE(gate.Expect(101, absl::Now() + absl::Seconds(10)));
}

// Poll looks without waiting: it says when to look again (the ticket's deadline, or the
// arrival wait of one whose moves have not come), gives up on a ticket at that time as Wait
// does, and every change is told to the listener, counted by generation().
TEST(LoadGateTest, PollLooksWithoutWaitingAndTheListenerHearsEveryChange) {
  LoadGate gate(/*arrival_wait=*/absl::Milliseconds(30));
  std::atomic<int> heard{0};
  gate.SetListener([&] { ++heard; });
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  ASSERT_TRUE(gate.Expect(5, deadline));
  EXPECT_EQ(heard.load(), 1);
  const uint64_t five[] = {5};
  absl::Time wake;
  absl::StatusOr<bool> ready = gate.Poll(five, 0, &wake);
  ASSERT_TRUE(ready.ok());
  EXPECT_FALSE(*ready);
  EXPECT_EQ(wake, deadline);
  const uint64_t before = gate.generation();
  gate.Advance(5, 1);
  EXPECT_EQ(heard.load(), 2);
  EXPECT_EQ(gate.generation(), before + 1);
  EXPECT_TRUE(*gate.Poll(five, 0, &wake));
  EXPECT_FALSE(*gate.Poll(five, 1, &wake));
  EXPECT_TRUE(gate.Finish(5, true));
  EXPECT_EQ(heard.load(), 3);
  EXPECT_TRUE(*gate.Poll(five, 1, &wake));
  // A ticket whose moves never come: look again at the end of the arrival wait, then it is
  // given up on (and its load, should it come, cannot succeed).
  const uint64_t nine[] = {9};
  const absl::Time looked = absl::Now();
  EXPECT_FALSE(*gate.Poll(nine, 0, &wake));
  EXPECT_GE(wake, looked + absl::Milliseconds(30));
  EXPECT_LE(wake, absl::Now() + absl::Milliseconds(30));
  absl::SleepFor(wake - absl::Now());
  EXPECT_TRUE(*gate.Poll(nine, 0, &wake));
  EXPECT_EQ(gate.stats().abandoned, 1u);
  EXPECT_FALSE(gate.Expect(9, absl::Now() + absl::Seconds(10)));
  // Poll records nothing; its caller records the layer's wait.
  EXPECT_EQ(gate.stats().ready_layers + gate.stats().waited_layers, 0u);
  gate.Record(absl::Milliseconds(4));
  gate.Record(absl::ZeroDuration());
  EXPECT_EQ(gate.stats().waited_layers, 1u);
  EXPECT_EQ(gate.stats().ready_layers, 1u);
  gate.SetListener(nullptr);
  ASSERT_TRUE(gate.Expect(6, absl::Now() + absl::Seconds(10)));
  EXPECT_EQ(heard.load(), 3) << "a listener set to none was still told";
}

TEST(LoadGateTest, TicketZeroIsNoLoad) {
  LoadGate gate;
  const uint64_t tickets[] = {0};
  gate.Wait(tickets, 3);
  EXPECT_EQ(gate.stats().ready_layers + gate.stats().waited_layers, 0u);
  EXPECT_TRUE(gate.Expect(0, absl::Now()));
  EXPECT_TRUE(gate.Finish(0, true));
}

}  // namespace
}  // namespace strata
