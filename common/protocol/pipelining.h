// Batches in flight on one compute node with offloaded attention: the --pipelining option of
// the scheduler, the compute nodes and the local launcher, parsed the same way by all.
//
// kTwo: two plans of different sequences at once, which the node runs layer by layer side
// by side (one batch's GEMMs while the other's attention is on the memory nodes;
// compute_node/step_pipeline.h). The scheduler then splits the decode work between the two
// plans, by rows and by KV positions read.
//
// kFixed: Lamina's fixed staggered pipelining across R compute replicas that share the
// memory nodes. Each replica owns one batch (one plan at a time), and the scheduler spaces
// the replicas' step starts by a period over R, so that their attention phases take turns
// on the memory nodes instead of colliding (server/step_clock.h).
//
// kRotational: Lamina's rotational staggered pipelining. n batches rotate over R = n - 1
// replicas: slice k of batch j's layers runs on replica (j + k) mod R, its context moving
// between replicas while its attention runs (compute_node/rotation.h); the scheduler sends
// every plan to every replica (server/rotation_group.h).
#ifndef STRATA_COMMON_PROTOCOL_PIPELINING_H_
#define STRATA_COMMON_PROTOCOL_PIPELINING_H_

#include <string>

#include "absl/strings/string_view.h"
#include "common/base/enum_names.h"

namespace strata {

enum class Pipelining { kOff, kTwo, kFixed, kRotational };
inline constexpr EnumName<Pipelining> kPipeliningNames[] = {
    {Pipelining::kOff, "off"},
    {Pipelining::kTwo, "two"},
    {Pipelining::kFixed, "fixed"},
    {Pipelining::kRotational, "rotational"}};
inline bool AbslParseFlag(absl::string_view text, Pipelining* out, std::string* error) {
  return ParseEnumName(text, kPipeliningNames, out, error);
}
inline std::string AbslUnparseFlag(Pipelining p) { return EnumNameOf(p, kPipeliningNames); }

}  // namespace strata

#endif  // STRATA_COMMON_PROTOCOL_PIPELINING_H_
