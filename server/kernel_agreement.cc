#include "server/kernel_agreement.h"

#include "absl/strings/str_cat.h"

namespace strata {

absl::Status KernelAgreement::Admit(const control::NodeInfo& info) {
  if (allow_mixed_) return absl::OkStatus();
  const bool compute = info.role() == control::ROLE_COMPUTE;
  if (!isa_.value.empty() && info.cpu_isa() != isa_.value) {
    return absl::FailedPreconditionError(
        absl::StrCat("node ", info.name(), " runs ", info.cpu_isa(), " kernels but ", isa_.node,
                     " runs ", isa_.value,
                     "; mixed kernel paths break bit-identical results (set "
                     "STRATA_CPU_ISA alike on every node, or --allow_mixed_isa to accept)"));
  }
  auto differs = [](const Agreed& agreed, const std::string& value) {
    return !agreed.value.empty() && !value.empty() && value != agreed.value;
  };
  auto refuse = [&info](const Agreed& agreed, const std::string& value, const char* what) {
    return absl::FailedPreconditionError(absl::StrCat(
        "node ", info.name(), "'s ", what, " compute different results (fingerprint ", value,
        ") from ", agreed.node, "'s (", agreed.value, ") on the same ", info.cpu_isa(),
        " path: a different build or a CPU whose arithmetic differs breaks bit-identical "
        "results (run isa_fingerprint on both machines to see which kernels differ; "
        "--allow_mixed_isa to accept)"));
  };
  if (differs(attention_, info.attention_fingerprint())) {
    return refuse(attention_, info.attention_fingerprint(), "attention kernels");
  }
  if (compute && differs(kernels_, info.kernel_fingerprint())) {
    return refuse(kernels_, info.kernel_fingerprint(), "kernels");
  }
  auto record = [&info](Agreed& agreed, const std::string& value) {
    if (agreed.value.empty() && !value.empty()) agreed = {value, info.name()};
  };
  record(isa_, info.cpu_isa());
  record(attention_, info.attention_fingerprint());
  if (compute) record(kernels_, info.kernel_fingerprint());
  return absl::OkStatus();
}

}  // namespace strata
