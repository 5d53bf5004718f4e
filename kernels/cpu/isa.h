// Selects the instruction-set path of strata's CPU kernels, once per process.
//
// Every kernel in kernels/cpu has a scalar, an AVX2 and an AVX-512 path. Results are
// deterministic for a given path but differ between paths in the last bits (exp
// polynomial, reduction widths), so all processes of one deployment must use the same
// path; they report it at registration. The default is the best the CPU supports;
// STRATA_CPU_ISA=scalar|avx2|avx512 or ForceCpuIsa (tests) overrides it.
#ifndef STRATA_KERNELS_CPU_ISA_H_
#define STRATA_KERNELS_CPU_ISA_H_

namespace strata::kernels {

enum class CpuIsa : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

CpuIsa ActiveCpuIsa();
const char* CpuIsaName(CpuIsa isa);
bool CpuSupports(CpuIsa isa);
// Returns false (and changes nothing) if the CPU lacks `isa`. Not for use while kernels
// run on other threads.
bool ForceCpuIsa(CpuIsa isa);

}  // namespace strata::kernels

#endif  // STRATA_KERNELS_CPU_ISA_H_
