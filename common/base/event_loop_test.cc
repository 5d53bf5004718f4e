#include "common/base/event_loop.h"

#include <atomic>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

TEST(EventLoopTest, PostsRunInOrderOnTheLoopThread) {
  EventLoop loop("test");
  loop.Start();
  std::vector<int> seen;  // loop thread only
  bool all_on_loop = true;
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(loop.Post([&, i] {
      all_on_loop = all_on_loop && loop.InLoopThread();
      seen.push_back(i);
    }));
  }
  loop.Stop();
  ASSERT_EQ(seen.size(), 1000u);
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(seen[i], i);
  EXPECT_TRUE(all_on_loop);
  EXPECT_FALSE(loop.InLoopThread());
}

TEST(EventLoopTest, TimersFireInDueOrderNotBefore) {
  EventLoop loop("test");
  loop.Start();
  const absl::Time start = absl::Now();
  std::vector<std::pair<int, absl::Time>> fired;
  absl::Notification done;
  // Set out of order; the last due one ends the test.
  const int delays_ms[] = {30, 10, 50, 20, 40};
  for (int i = 0; i < 5; ++i) {
    loop.RunAt(start + absl::Milliseconds(delays_ms[i]), [&, i] {
      fired.emplace_back(delays_ms[i], absl::Now());
      if (delays_ms[i] == 50) done.Notify();
    });
  }
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  loop.Stop();
  ASSERT_EQ(fired.size(), 5u);
  for (size_t i = 0; i < fired.size(); ++i) {
    EXPECT_EQ(fired[i].first, 10 * static_cast<int>(i + 1));
    EXPECT_GE(fired[i].second, start + absl::Milliseconds(fired[i].first));
  }
}

TEST(EventLoopTest, AnEarlierTimerWakesALoopWaitingForALaterOne) {
  EventLoop loop("test");
  loop.Start();
  loop.RunAfter(absl::Hours(1), [] {});
  absl::Notification fired;
  const absl::Time start = absl::Now();
  loop.RunAfter(absl::Milliseconds(5), [&] { fired.Notify(); });
  ASSERT_TRUE(fired.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  loop.Stop();  // the hour-long timer is dropped, not waited for
}

TEST(EventLoopTest, CancelledTimersNeverRun) {
  EventLoop loop("test");
  loop.Start();
  std::atomic<int> ran{0};
  const EventLoop::TimerId a = loop.RunAfter(absl::Milliseconds(20), [&] { ran += 1; });
  const EventLoop::TimerId b = loop.RunAfter(absl::Milliseconds(20), [&] { ran += 10; });
  EXPECT_NE(a, b);
  EXPECT_TRUE(loop.Cancel(a));
  EXPECT_FALSE(loop.Cancel(a));
  absl::Notification done;
  loop.RunAfter(absl::Milliseconds(40), [&] { done.Notify(); });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(ran.load(), 10);
  EXPECT_FALSE(loop.Cancel(b));  // already ran
  loop.Stop();
}

TEST(EventLoopTest, ClosuresMayPostScheduleAndCancelOnTheirLoop) {
  EventLoop loop("test");
  loop.Start();
  absl::Notification done;
  int steps = 0;
  loop.Post([&] {
    ++steps;
    const EventLoop::TimerId never = loop.RunAfter(absl::Milliseconds(1), [&] { steps += 100; });
    EXPECT_TRUE(loop.Cancel(never));
    loop.Post([&] {
      ++steps;
      loop.RunAfter(absl::Milliseconds(1), [&] {
        ++steps;
        done.Notify();
      });
    });
  });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  loop.Stop();
  EXPECT_EQ(steps, 3);
}

TEST(EventLoopTest, QuitFinishesWhatIsPostedAndRefusesTheRest) {
  EventLoop loop("test");
  std::atomic<int> ran{0};
  absl::Notification release;
  loop.Start();
  loop.Post([&] { release.WaitForNotification(); });
  for (int i = 0; i < 10; ++i) loop.Post([&] { ++ran; });
  loop.Quit();
  EXPECT_FALSE(loop.Post([&] { ran += 100; }));
  EXPECT_EQ(loop.RunAfter(absl::ZeroDuration(), [&] { ran += 100; }), 0u);
  release.Notify();
  loop.Join();
  EXPECT_EQ(ran.load(), 10);
}

TEST(EventLoopTest, QuitFromTheLoopThreadEndsIt) {
  EventLoop loop("test");
  loop.Start();
  loop.Post([&] { loop.Quit(); });
  loop.Join();
  EXPECT_FALSE(loop.Post([] {}));
}

TEST(EventLoopTest, AfterBatchRunsOncePerBatchAndNeverWhenIdle) {
  EventLoop loop("test");
  std::atomic<int> batches{0}, posts{0};
  loop.SetAfterBatch([&] { ++batches; });
  absl::Notification release;
  loop.Start();
  // Everything posted while the loop is busy runs in one batch.
  loop.Post([&] { release.WaitForNotification(); });
  for (int i = 0; i < 50; ++i) loop.Post([&] { ++posts; });
  release.Notify();
  absl::Notification drained;
  loop.Post([&] { drained.Notify(); });
  ASSERT_TRUE(drained.WaitForNotificationWithTimeout(absl::Seconds(10)));
  absl::SleepFor(absl::Milliseconds(20));
  const int after_work = batches.load();
  EXPECT_GE(after_work, 1);
  EXPECT_LE(after_work, 3);  // 52 posts in at most three batches
  // No tick: an idle loop does not wake.
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(batches.load(), after_work);
  loop.Stop();
  EXPECT_EQ(posts.load(), 50);
}

// Manual mode: the caller's thread runs what is posted, what that posts, and due timers,
// each batch followed by the hook, and returns when nothing is left; timers not yet due wait.
TEST(EventLoopTest, RunUntilIdleRunsEverythingReadyOnTheCallingThread) {
  EventLoop loop("manual");
  std::vector<int> order;
  int hooks = 0;
  loop.SetAfterBatch([&] {
    EXPECT_TRUE(loop.InLoopThread());
    ++hooks;
  });
  loop.Post([&] {
    order.push_back(1);
    loop.Post([&] { order.push_back(3); });  // the next batch
  });
  loop.Post([&] { order.push_back(2); });
  loop.RunAfter(absl::ZeroDuration(), [&] { order.push_back(4); });
  const EventLoop::TimerId later = loop.RunAfter(absl::Hours(1), [&] { order.push_back(99); });
  EXPECT_EQ(loop.RunUntilIdle(), 4);
  EXPECT_EQ(order, (std::vector<int>{1, 2, 4, 3}));
  EXPECT_EQ(hooks, 2);
  EXPECT_EQ(loop.RunUntilIdle(), 0) << "nothing was left";
  EXPECT_EQ(hooks, 2) << "the hook ran without work";
  EXPECT_TRUE(loop.Cancel(later)) << "a timer not yet due ran";
}

}  // namespace
}  // namespace strata
