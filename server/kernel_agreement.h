// What the nodes of one deployment must agree on for results to be bit-identical whichever
// node computes them (docs/architecture.md, "Determinism"): the kernel path (ISA), the
// results of the attention kernels (every node runs them: memory nodes for the cached
// prefix, compute nodes for co-located attention and their own prefill chunks), and the
// results of every kernel among compute nodes (a sequence may move between replicas, and
// rotational pipelining runs one batch's slices on several).
//
// A node is compared with the nodes alive when it registers: the first to register after
// a scheduler start, or after every node has died, sets the standard. So a new build whose
// kernels compute other bits cannot join old nodes one by one (a rolling update stalls on
// the first new node, which exits with the reason); it takes a full restart of the nodes,
// or the server's --allow_mixed_isa, which gives up bit-identity. Fingerprints that differ
// under the same ISA mean a different build or a CPU whose arithmetic differs; `bazel run
// //compute_node:isa_fingerprint` on both machines shows which kernels.
#ifndef STRATA_SERVER_KERNEL_AGREEMENT_H_
#define STRATA_SERVER_KERNEL_AGREEMENT_H_

#include <vector>

#include "absl/status/status.h"
#include "proto/control.pb.h"

namespace strata {

// OK if `info` agrees with every node in `live`; otherwise FailedPrecondition naming the
// first node it disagrees with. An empty fingerprint (a node that reports none) is not
// compared. `allow_mixed` (--allow_mixed_isa) accepts any node, giving up bit-identity.
absl::Status CheckKernelAgreement(const control::NodeInfo& info,
                                  const std::vector<const control::NodeInfo*>& live,
                                  bool allow_mixed);

}  // namespace strata

#endif  // STRATA_SERVER_KERNEL_AGREEMENT_H_
