#include "server/kernel_agreement.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace strata {

absl::Status CheckKernelAgreement(const control::NodeInfo& info,
                                  const std::vector<const control::NodeInfo*>& live,
                                  bool allow_mixed) {
  if (allow_mixed) return absl::OkStatus();
  auto refuse = [&info](const control::NodeInfo& other, const std::string& value,
                        const std::string& others, const char* what) {
    return absl::FailedPreconditionError(absl::StrCat(
        "node ", info.name(), "'s ", what, " compute different results (fingerprint ", value,
        ") from ", other.name(), "'s (", others, ") on the same ", info.cpu_isa(),
        " path: a different build or a CPU whose arithmetic differs breaks bit-identical "
        "results (`bazel run //compute_node:isa_fingerprint` on both machines shows which "
        "kernels differ; the server's --allow_mixed_isa accepts it)"));
  };
  auto differ = [](const std::string& a, const std::string& b) {
    return !a.empty() && !b.empty() && a != b;
  };
  for (const control::NodeInfo* other : live) {
    if (info.cpu_isa() != other->cpu_isa()) {
      return absl::FailedPreconditionError(
          absl::StrCat("node ", info.name(), " runs ", info.cpu_isa(), " kernels but ",
                       other->name(), " runs ", other->cpu_isa(),
                       "; mixed kernel paths break bit-identical results (set "
                       "STRATA_CPU_ISA alike on every node; the server's --allow_mixed_isa "
                       "accepts it)"));
    }
    if (differ(info.attention_fingerprint(), other->attention_fingerprint())) {
      return refuse(*other, info.attention_fingerprint(), other->attention_fingerprint(),
                    "attention kernels");
    }
    if (info.role() == control::ROLE_COMPUTE && other->role() == control::ROLE_COMPUTE &&
        differ(info.kernel_fingerprint(), other->kernel_fingerprint())) {
      return refuse(*other, info.kernel_fingerprint(), other->kernel_fingerprint(), "kernels");
    }
  }
  return absl::OkStatus();
}

}  // namespace strata
