// Fingerprints of the CPU kernels' results: each kernel runs on fixed inputs (a seeded
// generator, odd shapes, scattered KV slots, bf16 and f16 caches, MHA and GQA) on the
// active instruction-set path, and its output bytes are hashed. The inputs are made without
// libm; the kernels themselves call libm's exp in their scalar paths and tails, so a
// node's fingerprint covers its math library too. Entries named "attention ..." are what
// memory nodes run.
//
// The determinism contract (docs/architecture.md, "Determinism") says a kernel's results
// depend only on the ISA path: two machines that run the same path must print the same
// fingerprints, whatever their vendor, core count or thread count. isa_fingerprint (in
// compute_node) prints them so that two nodes can be compared; the tests check what one
// machine can check (thread counts, the GEMM's path independence).
#ifndef STRATA_KERNELS_CPU_FINGERPRINT_H_
#define STRATA_KERNELS_CPU_FINGERPRINT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace strata::kernels {

struct KernelFingerprint {
  std::string kernel;  // e.g. "gemm m=7 n=33 k=64 bias"
  // FNV-1a of the output bytes, and of what else the kernel returns (an error code, a sum).
  uint64_t hash = 0;
};

// FNV-1a, 64 bits, continuing from `hash`.
uint64_t FingerprintBytes(const void* data, size_t size, uint64_t hash = 0xcbf29ce484222325ULL);

// `hash` as 16 lower-case hex digits, the form nodes register with.
std::string FingerprintHex(uint64_t hash);

// Every kernel's fingerprint on the active ISA path (ActiveCpuIsa), in a fixed order. Uses
// the calling thread's OpenMP team.
std::vector<KernelFingerprint> KernelFingerprints();

// One hash of the fingerprints whose kernel name starts with `prefix` ("" for all;
// "attention" for what memory nodes run), as 16 hex digits.
std::string CombinedFingerprint(const std::vector<KernelFingerprint>& fingerprints,
                                const std::string& prefix);

// What a node registers with (proto/control.proto, NodeInfo; the scheduler compares them:
// server/kernel_agreement.h): the combined fingerprint of the attention kernels, which
// every node runs, and of every kernel, for compute nodes.
struct NodeFingerprints {
  std::string attention;
  std::string all;
};
NodeFingerprints FingerprintsForRegistration();

}  // namespace strata::kernels

#endif  // STRATA_KERNELS_CPU_FINGERPRINT_H_
