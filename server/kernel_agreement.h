// What the nodes of one deployment must agree on for results to be bit-identical whichever
// node computes them (docs/architecture.md, "Determinism"): the kernel path (ISA), the
// results of the attention kernels (every node runs them: memory nodes for the cached
// prefix, compute nodes for co-located attention and their own prefill chunks), and the
// results of every kernel among compute nodes (a sequence may move between replicas, and
// rotational pipelining runs one batch's slices on several).
//
// A node is compared with the nodes alive when it registers. So a deployment whose nodes
// are all replaced by another build's (a rolling upgrade) takes the new build's values,
// while a mixture of the two is refused. Fingerprints that differ under the same ISA mean a
// different build or a CPU whose arithmetic differs; `isa_fingerprint` on both machines
// shows which kernels.
#ifndef STRATA_SERVER_KERNEL_AGREEMENT_H_
#define STRATA_SERVER_KERNEL_AGREEMENT_H_

#include <vector>

#include "absl/status/status.h"
#include "proto/control.grpc.pb.h"

namespace strata {

// OK if `info` agrees with every node in `live`; otherwise FailedPrecondition naming the
// first node it disagrees with. An empty fingerprint (a node that reports none) is not
// compared. `allow_mixed` (--allow_mixed_isa) accepts any node, giving up bit-identity.
absl::Status CheckKernelAgreement(const control::NodeInfo& info,
                                  const std::vector<const control::NodeInfo*>& live,
                                  bool allow_mixed);

}  // namespace strata

#endif  // STRATA_SERVER_KERNEL_AGREEMENT_H_
