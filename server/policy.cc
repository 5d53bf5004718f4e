#include "server/policy.h"

namespace strata {
namespace {

class FifoPolicy : public SchedulingPolicy {
 public:
  const char* name() const override { return "fifo"; }
  bool Before(const PolicyKey& a, const PolicyKey& b) const override {
    return a.arrival < b.arrival;
  }
};

class PriorityPolicy : public SchedulingPolicy {
 public:
  const char* name() const override { return "priority"; }
  bool Before(const PolicyKey& a, const PolicyKey& b) const override {
    if (a.priority != b.priority) return a.priority < b.priority;
    return a.arrival < b.arrival;
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<SchedulingPolicy>> MakePolicy(const std::string& name) {
  if (name == "fifo" || name == "fcfs") return std::unique_ptr<SchedulingPolicy>(new FifoPolicy);
  if (name == "priority") return std::unique_ptr<SchedulingPolicy>(new PriorityPolicy);
  return absl::InvalidArgumentError("unknown scheduling policy \"" + name +
                                    "\" (known: fifo, priority)");
}

}  // namespace strata
