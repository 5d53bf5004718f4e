// A KvMover (server/kv_mover.h) that hands the scheduler's disk-tier moves to a node's tier
// in this process (a MemoryServer's, or a co-located KvDiskHost), on a thread of its own, as
// the gRPC mover hands them to a node: for tests that run the whole deployment in one
// process.
#ifndef STRATA_SERVER_TESTING_IN_PROCESS_KV_MOVER_H_
#define STRATA_SERVER_TESTING_IN_PROCESS_KV_MOVER_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "server/kv_mover.h"

namespace strata {

class InProcessKvMover final : public KvMover {
 public:
  using Execute =
      std::function<absl::StatusOr<std::vector<absl::Status>>(std::span<const KvMove> moves)>;
  // What `execute` uses must outlive the mover.
  explicit InProcessKvMover(Execute execute) : execute_(std::move(execute)) {
    thread_ = std::thread([this] { Run(); });
  }
  ~InProcessKvMover() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  void Submit(std::vector<KvMove> moves, KvMovesDone done, bool /*background*/) override {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.emplace_back(std::move(moves), std::move(done));
    cv_.notify_all();
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      auto [moves, done] = std::move(queue_.front());
      queue_.pop_front();
      const bool stopping = stop_;
      lock.unlock();
      auto status =
          stopping
              ? absl::StatusOr<std::vector<absl::Status>>(absl::CancelledError("the mover stopped"))
              : execute_(moves);
      done(status.ok() ? std::move(*status)
                       : std::vector<absl::Status>(moves.size(), status.status()));
      lock.lock();
    }
  }

  Execute execute_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::vector<KvMove>, KvMovesDone>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace strata

#endif  // STRATA_SERVER_TESTING_IN_PROCESS_KV_MOVER_H_
