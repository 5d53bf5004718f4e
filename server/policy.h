// Scheduling policies: which waiting request is admitted first, and which running request
// is preempted when KV runs out. FIFO is the default; "priority" orders by the request's
// priority field (lower first, as vLLM), then by arrival.
//
// Adding a policy: implement SchedulingPolicy (both methods must be strict weak orders over
// the fields of PolicyKey and must not depend on anything else, so that a decision can be
// replayed), add it to PolicyKind and kPolicyNames, and document it in README.md
// ("Scheduling policies").
#ifndef STRATA_SERVER_POLICY_H_
#define STRATA_SERVER_POLICY_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "common/base/enum_names.h"

namespace strata {

enum class PolicyKind { kFifo, kPriority };
inline constexpr EnumName<PolicyKind> kPolicyNames[] = {
    {PolicyKind::kFifo, "fifo"}, {PolicyKind::kFifo, "fcfs"}, {PolicyKind::kPriority, "priority"}};
inline bool AbslParseFlag(absl::string_view text, PolicyKind* out, std::string* error) {
  return ParseEnumName(text, kPolicyNames, out, error);
}
inline std::string AbslUnparseFlag(PolicyKind k) { return EnumNameOf(k, kPolicyNames); }

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

std::unique_ptr<SchedulingPolicy> MakePolicy(PolicyKind kind);

}  // namespace strata

#endif  // STRATA_SERVER_POLICY_H_
