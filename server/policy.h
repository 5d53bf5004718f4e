// Scheduling policies: which waiting request is admitted first, and which running request
// is preempted when KV runs out. FIFO is the default; "priority" orders by the request's
// priority field (lower first, as vLLM), then by arrival.
//
// Adding a policy: implement SchedulingPolicy (both methods must be strict weak orders over
// the fields of PolicyKey and must not depend on anything else, so that a decision can be
// replayed), add a name in MakePolicy, and document it in README.md ("Scheduling policies").
#ifndef STRATA_SERVER_POLICY_H_
#define STRATA_SERVER_POLICY_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace strata {

struct PolicyKey {
  int priority = 0;
  uint64_t arrival = 0;  // admission order: smaller is older
};

class SchedulingPolicy {
 public:
  virtual ~SchedulingPolicy() = default;
  virtual const char* name() const = 0;
  // True if `a` should be admitted (or keep running) before `b`.
  virtual bool Before(const PolicyKey& a, const PolicyKey& b) const = 0;
};

absl::StatusOr<std::unique_ptr<SchedulingPolicy>> MakePolicy(const std::string& name);

}  // namespace strata

#endif  // STRATA_SERVER_POLICY_H_
