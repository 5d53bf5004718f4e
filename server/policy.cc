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

std::unique_ptr<SchedulingPolicy> MakePolicy(PolicyKind kind) {
  switch (kind) {
    case PolicyKind::kPriority:
      return std::make_unique<PriorityPolicy>();
    case PolicyKind::kFifo:
      break;
  }
  return std::make_unique<FifoPolicy>();
}

}  // namespace strata
