// KvShift (step_plan.h) to and from its two wire forms, strata.control.KvShift (step plans)
// and strata.data.KvShift (step descriptors), which have the same fields.
#ifndef STRATA_COMMON_PROTOCOL_KV_SHIFT_PROTO_H_
#define STRATA_COMMON_PROTOCOL_KV_SHIFT_PROTO_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/protocol/step_plan.h"

namespace strata {

template <class Repeated>
void KvShiftsToProto(const std::vector<KvShift>& shifts, Repeated* out) {
  for (const KvShift& s : shifts) {
    auto* p = out->Add();
    p->set_position(s.position);
    p->set_shift(s.shift);
    p->mutable_from()->Add(s.from.begin(), s.from.end());
    p->mutable_cos()->Add(s.cos.begin(), s.cos.end());
    p->mutable_sin()->Add(s.sin.begin(), s.sin.end());
  }
}

// Checks what needs no knowledge of the table or the store (the attention side checks the
// rest before the step changes anything).
template <class Repeated>
absl::Status KvShiftsFromProto(const Repeated& in, std::vector<KvShift>* out) {
  for (const auto& p : in) {
    if (p.position() < 0 || p.from().empty() || p.cos().size() != p.sin().size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("a KV shift to position ", p.position(), " has ", p.from().size(),
                       " slots and ", p.cos().size(), "/", p.sin().size(), " angles"));
    }
    KvShift s;
    s.position = p.position();
    s.shift = p.shift();
    s.from.assign(p.from().begin(), p.from().end());
    s.cos.assign(p.cos().begin(), p.cos().end());
    s.sin.assign(p.sin().begin(), p.sin().end());
    out->push_back(std::move(s));
  }
  return absl::OkStatus();
}

}  // namespace strata

#endif  // STRATA_COMMON_PROTOCOL_KV_SHIFT_PROTO_H_
