#include "common/base/event_loop.h"

#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/base/logging.h"
#include "common/base/thread_name.h"

namespace strata {
namespace {

// ThreadSanitizer cannot see absl::Mutex: Debian's Abseil is not built with it. Under TSan
// (tests/thread_checks) the loop tells it of every hold of its mutex, so that a closure one
// thread posts and the loop thread runs is not taken for a race.
#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
void Acquired(absl::Mutex* mu) { __tsan_acquire(mu); }
void Releasing(absl::Mutex* mu) { __tsan_release(mu); }
#else
void Acquired(absl::Mutex*) {}
void Releasing(absl::Mutex*) {}
#endif

// absl::MutexLock, told to TSan.
class ABSL_SCOPED_LOCKABLE Hold {
 public:
  explicit Hold(absl::Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->Lock();
    Acquired(mu_);
  }
  ~Hold() ABSL_UNLOCK_FUNCTION() {
    Releasing(mu_);
    mu_->Unlock();
  }
  Hold(const Hold&) = delete;
  Hold& operator=(const Hold&) = delete;

 private:
  absl::Mutex* const mu_;
};

}  // namespace

EventLoop::EventLoop(std::string name) : name_(std::move(name)) {}

EventLoop::~EventLoop() { Stop(); }

void EventLoop::SetAfterBatch(Closure hook) {
  CHECK(!thread_.joinable()) << name_ << ": SetAfterBatch after Start";
  after_batch_ = std::move(hook);
}

void EventLoop::SetPoller(Poller* poller) {
  CHECK(!thread_.joinable()) << name_ << ": SetPoller after Start";
  poller_ = poller;
}

void EventLoop::Start() {
  CHECK(!thread_.joinable()) << name_ << ": started twice";
  // The loop takes mu_ before it runs anything, so its closures see thread_id_ set.
  Hold lock(&mu_);
  thread_ = std::thread([this] { Run(); });
  thread_id_ = thread_.get_id();
}

bool EventLoop::Post(Closure fn) {
  {
    Hold lock(&mu_);
    if (quit_) return false;
    posted_.push_back(std::move(fn));
    wake_.Signal();
  }
  if (poller_ != nullptr) poller_->Wake();
  return true;
}

EventLoop::TimerId EventLoop::RunAt(absl::Time when, Closure fn) {
  TimerId id;
  bool earliest;
  {
    Hold lock(&mu_);
    if (quit_) return 0;
    id = next_timer_++;
    earliest = timers_.empty() || when < timers_.begin()->first.first;
    timers_.emplace(std::make_pair(when, id), std::move(fn));
    timer_due_.emplace(id, when);
    if (earliest) wake_.Signal();  // the sleeping loop waits for the old earliest
  }
  if (earliest && poller_ != nullptr) poller_->Wake();
  return id;
}

bool EventLoop::NothingPosted() {
  Hold lock(&mu_);
  return posted_.empty() && !quit_;
}

bool EventLoop::Cancel(TimerId id) {
  Hold lock(&mu_);
  auto it = timer_due_.find(id);
  if (it == timer_due_.end()) return false;
  timers_.erase({it->second, id});
  timer_due_.erase(it);
  return true;
}

void EventLoop::Quit() {
  {
    Hold lock(&mu_);
    if (quit_) return;
    quit_ = true;
    wake_.Signal();
  }
  // Only the first time: the poller may be gone by a later Quit() (the destructor's).
  if (poller_ != nullptr) poller_->Wake();
}

void EventLoop::Join() {
  CHECK(!thread_.joinable() || !InLoopThread()) << name_ << ": joined from its own thread";
  if (thread_.joinable()) thread_.join();
}

void EventLoop::TakeBatch(std::deque<Closure>* batch, std::vector<Closure>* due) {
  batch->swap(posted_);
  if (quit_) return;
  const absl::Time now = absl::Now();
  while (!timers_.empty() && timers_.begin()->first.first <= now) {
    auto node = timers_.extract(timers_.begin());
    timer_due_.erase(node.key().second);
    due->push_back(std::move(node.mapped()));
  }
}

int EventLoop::RunUntilIdle() {
  CHECK(!thread_.joinable()) << name_ << ": RunUntilIdle on a started loop";
  CHECK(poller_ == nullptr) << name_ << ": RunUntilIdle with a poller";
  int ran = 0;
  std::deque<Closure> batch;
  std::vector<Closure> due;
  while (true) {
    {
      Hold lock(&mu_);
      thread_id_ = std::this_thread::get_id();
      TakeBatch(&batch, &due);
      if (quit_) {
        timers_.clear();
        timer_due_.clear();
      }
    }
    if (batch.empty() && due.empty()) return ran;
    ran += static_cast<int>(batch.size() + due.size());
    for (Closure& fn : batch) fn();
    for (Closure& fn : due) fn();
    batch.clear();
    due.clear();
    if (after_batch_) after_batch_();
  }
}

bool EventLoop::WaitOnPoller(std::deque<Closure>* batch, std::vector<Closure>* due) {
  poller_->Progress();
  absl::Time next;
  {
    Hold lock(&mu_);
    TakeBatch(batch, due);
    if (quit_ && batch->empty()) {
      timers_.clear();
      timer_due_.clear();
      return false;
    }
    if (!batch->empty() || !due->empty() || quit_) return true;
    next = timers_.empty() ? absl::InfiniteFuture() : timers_.begin()->first.first;
  }
  // A post from here on calls Wake(), which the poller must not miss.
  poller_->Wait(next);
  return true;
}

void EventLoop::Run() {
  SetCurrentThreadName(name_);
  // Start() sets thread_id_ under mu_: taking it once here makes it visible to what the
  // poller runs (InLoopThread) before the first batch.
  { Hold lock(&mu_); }
  if (poller_ != nullptr) poller_->Begin();
  std::deque<Closure> batch;
  std::vector<Closure> due;
  while (true) {
    if (poller_ != nullptr) {
      if (!WaitOnPoller(&batch, &due)) break;
      if (batch.empty() && due.empty()) continue;  // the poller did its work, or woke
    } else {
      Hold lock(&mu_);
      while (posted_.empty() && !quit_) {
        if (!timers_.empty() && timers_.begin()->first.first <= absl::Now()) break;
        const absl::Time next =
            timers_.empty() ? absl::InfiniteFuture() : timers_.begin()->first.first;
        Releasing(&mu_);
        wake_.WaitWithDeadline(&mu_, next);
        Acquired(&mu_);
      }
      TakeBatch(&batch, &due);
      if (quit_ && batch.empty()) {
        timers_.clear();
        timer_due_.clear();
        break;
      }
    }
    for (Closure& fn : batch) fn();
    for (Closure& fn : due) fn();
    batch.clear();
    due.clear();
    if (after_batch_) after_batch_();
  }
  if (poller_ != nullptr) poller_->End();
}

}  // namespace strata
