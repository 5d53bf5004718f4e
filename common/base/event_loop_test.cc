#include "common/base/event_loop.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

// absl::Notification's interface on std::mutex: ThreadSanitizer (tests/thread_checks) sees
// std::mutex but not Debian's uninstrumented Abseil, and would take what one thread writes
// before Notify() and another reads after the wait for a race.
class Notification {
 public:
  void Notify() {
    std::lock_guard<std::mutex> lock(mu_);
    notified_ = true;
    cv_.notify_all();
  }
  void WaitForNotification() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return notified_; });
  }
  bool WaitForNotificationWithTimeout(absl::Duration timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [&] { return notified_; });
  }
  bool HasBeenNotified() {
    std::lock_guard<std::mutex> lock(mu_);
    return notified_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool notified_ = false;
};

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
  Notification done;
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
  Notification fired;
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
  Notification done;
  loop.RunAfter(absl::Milliseconds(40), [&] { done.Notify(); });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(ran.load(), 10);
  EXPECT_FALSE(loop.Cancel(b));  // already ran
  loop.Stop();
}

TEST(EventLoopTest, ClosuresMayPostScheduleAndCancelOnTheirLoop) {
  EventLoop loop("test");
  loop.Start();
  Notification done;
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
  Notification release;
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
  Notification release;
  loop.Start();
  // Everything posted while the loop is busy runs in one batch.
  loop.Post([&] { release.WaitForNotification(); });
  for (int i = 0; i < 50; ++i) loop.Post([&] { ++posts; });
  release.Notify();
  Notification drained;
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

// A poller over a pipe (the source's work: bytes to read) and an eventfd (Wake), as a
// transport's poller waits on its network's descriptor.
class PipePoller : public EventLoop::Poller {
 public:
  PipePoller() {
    EXPECT_EQ(pipe2(pipe_, O_NONBLOCK | O_CLOEXEC), 0);
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    EXPECT_GE(wake_fd_, 0);
  }
  ~PipePoller() override {
    close(pipe_[0]);
    close(pipe_[1]);
    close(wake_fd_);
  }
  void Feed(const std::string& bytes) {
    EXPECT_EQ(write(pipe_[1], bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  }

  void Begin() override { begun_on_ = std::this_thread::get_id(); }
  void End() override { ended_on_ = std::this_thread::get_id(); }
  void Progress() override {
    char buffer[256];
    ssize_t n;
    while ((n = read(pipe_[0], buffer, sizeof(buffer))) > 0) {
      received_.append(buffer, n);
      ++progressed_with_work_;
    }
  }
  void Wait(absl::Time deadline) override {
    ++waits_;
    pollfd fds[2] = {{pipe_[0], POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    const int timeout_ms =
        deadline == absl::InfiniteFuture()
            ? -1
            : static_cast<int>(std::max<int64_t>(
                  0, absl::ToInt64Milliseconds(deadline - absl::Now() + absl::Milliseconds(1))));
    poll(fds, 2, timeout_ms);
    uint64_t count;
    if (read(wake_fd_, &count, sizeof(count)) > 0) ++woken_;
  }
  void Wake() override {
    const uint64_t one = 1;
    EXPECT_EQ(write(wake_fd_, &one, sizeof(one)), static_cast<ssize_t>(sizeof(one)));
  }

  // Loop thread only, or after the loop has ended.
  std::string received_;
  int progressed_with_work_ = 0;
  std::thread::id begun_on_, ended_on_;
  std::atomic<int> waits_{0}, woken_{0};

 private:
  int pipe_[2] = {-1, -1};
  int wake_fd_ = -1;
};

TEST(EventLoopTest, APollerMakesProgressBetweenPostsAndSleepsWhenIdle) {
  PipePoller poller;
  EventLoop loop("test");
  loop.SetPoller(&poller);
  loop.Start();
  // The source's work is seen on the loop thread, between the posted closures.
  std::string seen_by_closures;
  for (int i = 0; i < 20; ++i) {
    poller.Feed(std::string(1, static_cast<char>('a' + i)));
    Notification ran;
    ASSERT_TRUE(loop.Post([&] {
      EXPECT_TRUE(loop.InLoopThread());
      ran.Notify();
    }));
    ASSERT_TRUE(ran.WaitForNotificationWithTimeout(absl::Seconds(10)));
    // Bytes fed without a post still wake the loop.
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    std::string received;
    while (absl::Now() < give_up) {
      Notification read;
      loop.Post([&] {
        received = poller.received_;
        read.Notify();
      });
      ASSERT_TRUE(read.WaitForNotificationWithTimeout(absl::Seconds(10)));
      if (received.size() == static_cast<size_t>(i + 1)) break;
    }
    seen_by_closures = received;
  }
  EXPECT_EQ(seen_by_closures, "abcdefghijklmnopqrst");
  // Idle, it sleeps in Wait() instead of spinning.
  const int waits_before = poller.waits_.load();
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_LE(poller.waits_.load() - waits_before, 2);
  // Quit wakes the Wait() that has no deadline.
  const absl::Time quit_at = absl::Now();
  loop.Stop();
  EXPECT_LT(absl::Now() - quit_at, absl::Seconds(5));
  EXPECT_NE(poller.begun_on_, std::thread::id());
  EXPECT_EQ(poller.begun_on_, poller.ended_on_);
  EXPECT_NE(poller.begun_on_, std::this_thread::get_id());
}

TEST(EventLoopTest, APollersWaitEndsForTheNextTimer) {
  PipePoller poller;
  EventLoop loop("test");
  loop.SetPoller(&poller);
  loop.Start();
  loop.RunAfter(absl::Hours(1), [] {});
  Notification fired;
  const absl::Time start = absl::Now();
  absl::Time ran_at;
  loop.RunAfter(absl::Milliseconds(30), [&] {
    ran_at = absl::Now();
    fired.Notify();
  });
  ASSERT_TRUE(fired.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_GE(ran_at - start, absl::Milliseconds(30));
  loop.Stop();
}

TEST(EventLoopTest, NoPostIsLostWhileThePollerSleeps) {
  PipePoller poller;
  EventLoop loop("test");
  loop.SetPoller(&poller);
  loop.Start();
  constexpr int kThreads = 4, kEach = 5000;
  std::atomic<int> ran{0};
  std::vector<std::thread> posters;
  for (int t = 0; t < kThreads; ++t) {
    posters.emplace_back([&] {
      for (int i = 0; i < kEach; ++i) {
        loop.Post([&] { ran.fetch_add(1); });
        if (i % 64 == 0) absl::SleepFor(absl::Microseconds(50));  // let the loop sleep
      }
    });
  }
  for (auto& t : posters) t.join();
  Notification last;
  loop.Post([&] { last.Notify(); });
  ASSERT_TRUE(last.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(ran.load(), kThreads * kEach);
  EXPECT_GT(poller.woken_.load(), 0);
  // A post refused after Quit() says so.
  loop.Stop();
  EXPECT_FALSE(loop.Post([] {}));
  EXPECT_FALSE(loop.NothingPosted());
}

}  // namespace
}  // namespace strata
