// What the nodes of one deployment must agree on for results to be bit-identical whichever
// node computes them (docs/architecture.md, "Determinism"): the kernel path (ISA), the
// results of the attention kernels (every node runs them: memory nodes for the cached
// prefix, compute nodes for co-located attention and their own prefill chunks), and the
// results of every kernel among compute nodes (a sequence may move between replicas, and
// rotational pipelining runs one batch's slices on several).
//
// The first node to register sets each value; a later one that differs is refused, naming
// both nodes. Fingerprints that differ under the same ISA mean a different build or a CPU
// whose arithmetic differs; `isa_fingerprint` on both machines shows which kernels.
//
// Thread-safety: none; the control plane calls it under its mutex.
#ifndef STRATA_SERVER_KERNEL_AGREEMENT_H_
#define STRATA_SERVER_KERNEL_AGREEMENT_H_

#include <string>

#include "absl/status/status.h"
#include "proto/control.grpc.pb.h"

namespace strata {

class KernelAgreement {
 public:
  // `allow_mixed`: accept any node (--allow_mixed_isa), giving up bit-identity.
  explicit KernelAgreement(bool allow_mixed) : allow_mixed_(allow_mixed) {}

  // OK and records `info`'s values where none is recorded yet; FailedPrecondition (and
  // nothing recorded) if it disagrees with a node that registered before. An empty
  // fingerprint (a node that does not report one) is not compared.
  absl::Status Admit(const control::NodeInfo& info);

 private:
  struct Agreed {
    std::string value;
    std::string node;  // the first node that reported it
  };
  bool allow_mixed_;
  Agreed isa_, attention_, kernels_;
};

}  // namespace strata

#endif  // STRATA_SERVER_KERNEL_AGREEMENT_H_
