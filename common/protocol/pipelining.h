// Batches in flight on one compute node with offloaded attention: the --pipelining option of
// the scheduler, the compute nodes and the local launcher, parsed the same way by all.
//
// kTwo: two plans of different sequences at once, which the node runs layer by layer side
// by side (one batch's GEMMs while the other's attention is on the memory nodes;
// compute_node/step_pipeline.h). The scheduler then splits the decode work between the two
// plans, by rows and by KV positions read.
#ifndef STRATA_COMMON_PROTOCOL_PIPELINING_H_
#define STRATA_COMMON_PROTOCOL_PIPELINING_H_

#include <string>

#include "absl/strings/string_view.h"
#include "common/base/enum_names.h"

namespace strata {

enum class Pipelining { kOff, kTwo };
inline constexpr EnumName<Pipelining> kPipeliningNames[] = {{Pipelining::kOff, "off"},
                                                            {Pipelining::kTwo, "two"}};
inline bool AbslParseFlag(absl::string_view text, Pipelining* out, std::string* error) {
  return ParseEnumName(text, kPipeliningNames, out, error);
}
inline std::string AbslUnparseFlag(Pipelining p) { return EnumNameOf(p, kPipeliningNames); }

}  // namespace strata

#endif  // STRATA_COMMON_PROTOCOL_PIPELINING_H_
