// EventLoop: one thread that runs posted closures and timers, one at a time, in the order
// they were posted (timers in the order of their due time), and sleeps when there is
// nothing to do. There is no fixed tick: the thread wakes for a post, for the next timer,
// or to quit.
//
// A component that owns state touched only from its own thread (the scheduler, the control
// plane's configuration work, a transport's completion side) keeps that state on a loop
// and posts closures to it, instead of keeping its own thread, mutex and deque of closures.
//
// After each batch of work (everything posted so far plus every timer that is due), the
// loop runs the optional after-batch hook: the scheduler plans its next steps there, once
// per batch instead of once per event.
//
// Quit() lets the loop finish the closures already posted, then ends the thread; posts
// after Quit() are refused and dropped. Pending timers that are not yet due are dropped at
// quit. Closures may post, schedule and cancel on their own loop.
//
// A loop may also wait on a Poller, a source of work besides posts and timers (a UCX
// worker's completions and its event file descriptor, say): the loop then lets the poller
// make progress before each batch and sleeps in the poller's Wait() instead of on its
// condition variable, and a post, an earlier timer or Quit() calls the poller's Wake().
//
// Thread-safety: every method is thread-safe. Join() and Stop() must not be called on the
// loop's own thread.
#ifndef STRATA_COMMON_BASE_EVENT_LOOP_H_
#define STRATA_COMMON_BASE_EVENT_LOOP_H_

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace strata {

class EventLoop {
 public:
  using Closure = absl::AnyInvocable<void()>;
  using TimerId = uint64_t;  // 0 is never a timer

  // Work besides posts and timers. Every method but Wake() runs on the loop thread.
  class Poller {
   public:
    virtual ~Poller() = default;
    // Once when the loop thread starts, and once when it ends.
    virtual void Begin() {}
    virtual void End() {}
    // Before each batch: does the work that is ready, without blocking.
    virtual void Progress() = 0;
    // Nothing is posted and no timer is due: sleeps until there is work, Wake() is called
    // or `deadline` passes. It may return early; it must not miss a Wake() that came
    // after the loop last looked at its posts.
    virtual void Wait(absl::Time deadline) = 0;
    // From any thread: ends the Wait() in progress, or the next one, early.
    virtual void Wake() = 0;
  };

  explicit EventLoop(std::string name);
  ~EventLoop();  // Stop()
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  // Set before Start(): runs on the loop thread after each batch of work.
  void SetAfterBatch(Closure hook);
  // Set before Start(); it must outlive the loop's thread. Not for RunUntilIdle().
  void SetPoller(Poller* poller);
  void Start();

  // Runs `fn` on the loop thread after what is already posted. False (and `fn` dropped)
  // once the loop quits.
  bool Post(Closure fn);
  // Runs `fn` on the loop thread at `when` (at once if it has passed). Returns 0 once the
  // loop quits.
  TimerId RunAt(absl::Time when, Closure fn);
  TimerId RunAfter(absl::Duration delay, Closure fn) {
    return RunAt(absl::Now() + delay, std::move(fn));
  }
  // True if the timer had not run and now never will.
  bool Cancel(TimerId id);
  // True if no posted closure waits to run and the loop has not quit. A batch already
  // taken may still be running: a caller that would do the work itself instead of
  // posting it keeps the order of what others posted only if it also shuts the loop's
  // thread out meanwhile (the UCX transport holds the worker's mutex, which its loop
  // thread gives up only while its poller sleeps).
  bool NothingPosted();

  // Manual mode, for deterministic tests of a loop's owner, instead of Start(): runs on the
  // calling thread what is posted and due (and what that posts), each batch followed by the
  // after-batch hook, until nothing is left. The calling thread is the loop thread from
  // then on. Returns the number of closures run.
  int RunUntilIdle();

  // Finishes what is posted, then ends the thread. Safe from any thread, including the
  // loop's own, and more than once (only the first wakes the poller).
  void Quit();
  // Waits for the thread to end (after Quit()).
  void Join();
  void Stop() {
    Quit();
    Join();
  }

  bool InLoopThread() const { return std::this_thread::get_id() == thread_id_; }
  const std::string& name() const { return name_; }

 private:
  void Run();
  // The loop's wait with a poller: the next batch, or an empty one after a Wait(). False
  // once the loop has quit and nothing posted is left.
  bool WaitOnPoller(std::deque<Closure>* batch, std::vector<Closure>* due);
  // Takes the next batch: what is posted, and the timers due (none once quitting).
  void TakeBatch(std::deque<Closure>* batch, std::vector<Closure>* due)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string name_;
  Closure after_batch_;
  Poller* poller_ = nullptr;
  std::thread thread_;
  std::thread::id thread_id_;

  absl::Mutex mu_;
  absl::CondVar wake_;
  std::deque<Closure> posted_ ABSL_GUARDED_BY(mu_);
  // Timers by (due time, id): ids break ties in the order they were set.
  std::map<std::pair<absl::Time, TimerId>, Closure> timers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<TimerId, absl::Time> timer_due_ ABSL_GUARDED_BY(mu_);
  TimerId next_timer_ ABSL_GUARDED_BY(mu_) = 1;
  bool quit_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace strata

#endif  // STRATA_COMMON_BASE_EVENT_LOOP_H_
