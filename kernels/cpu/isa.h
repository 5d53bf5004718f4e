// Selects the instruction-set path of strata's CPU kernels, once per process.
//
// Every kernel in kernels/cpu has a scalar, an AVX2 and an AVX-512 path. Results are
// deterministic for a given path but differ between paths in the last bits (exp
// polynomial, reduction widths, bf16 dot products), so all processes of one deployment
// must use the same path; they report it at registration. The default is the best the CPU
// supports; STRATA_CPU_ISA=scalar|avx2|avx512|avx512bf16 or ForceCpuIsa (tests) overrides
// it. avx512bf16 is avx512 plus the own GEMM's vdpbf16ps kernel (gemm.h); attention and
// the row-wise kernels run avx512's arithmetic there (simd_ops.h says why).
//
// The results of a path do not depend on the CPU's vendor: isa_fingerprint
// (compute_node/isa_fingerprint.cc) printed the same hashes on every path on an AMD Zen 4
// and on an Intel Xeon with AMX (docs/architecture.md, "Determinism").
#ifndef STRATA_KERNELS_CPU_ISA_H_
#define STRATA_KERNELS_CPU_ISA_H_

#include <optional>
#include <string_view>
#include <vector>

namespace strata::kernels {

enum class CpuIsa : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Bf16 = 3 };

CpuIsa ActiveCpuIsa();
const char* CpuIsaName(CpuIsa isa);
// The path CpuIsaName calls `name`; nullopt for any other name.
std::optional<CpuIsa> CpuIsaFromName(std::string_view name);
// The paths named in a comma-separated list (names CpuIsaFromName does not know are
// skipped); the active one if the list names none. For benchmarks' --isas.
std::vector<CpuIsa> CpuIsasFromList(std::string_view names);
bool CpuSupports(CpuIsa isa);
// Returns false (and changes nothing) if the CPU lacks `isa`. Not for use while kernels
// run on other threads.
bool ForceCpuIsa(CpuIsa isa);

// Sets flush-to-zero and denormals-are-zero on the calling thread. Softmax weights near
// FLT_MIN times V give denormal products, and denormal arithmetic is microcode-slow (a
// decode step ran 1.7x slower); every kernel thread runs in this mode, so results stay
// deterministic. Kernels call it at the top of their parallel regions.
inline void EnableFlushToZero() {
#if defined(__x86_64__)
  unsigned int csr;
  __asm__ volatile("stmxcsr %0" : "=m"(csr));
  csr |= 0x8040;  // FTZ (bit 15) | DAZ (bit 6)
  __asm__ volatile("ldmxcsr %0" : : "m"(csr));
#endif
}

}  // namespace strata::kernels

#endif  // STRATA_KERNELS_CPU_ISA_H_
