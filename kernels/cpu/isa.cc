#include "kernels/cpu/isa.h"

#include <cpuid.h>

#include <atomic>
#include <cstdlib>

namespace strata::kernels {
namespace {

CpuIsa DefaultIsa() {
  const char* env = std::getenv("STRATA_CPU_ISA");
  if (env != nullptr) {
    const std::optional<CpuIsa> asked = CpuIsaFromName(env);
    if (asked && CpuSupports(*asked)) return *asked;
  }
  if (CpuSupports(CpuIsa::kAvx512Bf16)) return CpuIsa::kAvx512Bf16;
  if (CpuSupports(CpuIsa::kAvx512)) return CpuIsa::kAvx512;
  if (CpuSupports(CpuIsa::kAvx2)) return CpuIsa::kAvx2;
  return CpuIsa::kScalar;
}

std::atomic<int>& ActiveStorage() {
  static std::atomic<int> isa{static_cast<int>(DefaultIsa())};
  return isa;
}

// F16C (CPUID leaf 1, ECX bit 29), read directly: not every compiler's
// __builtin_cpu_supports knows "f16c".
bool HasF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}

}  // namespace

bool CpuSupports(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar:
      return true;
    case CpuIsa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && HasF16c();
    case CpuIsa::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("fma") && HasF16c();
    case CpuIsa::kAvx512Bf16:
      return CpuSupports(CpuIsa::kAvx512) && __builtin_cpu_supports("avx512bf16");
  }
  return false;
}

CpuIsa ActiveCpuIsa() {
  return static_cast<CpuIsa>(ActiveStorage().load(std::memory_order_relaxed));
}

const char* CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar:
      return "scalar";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
    case CpuIsa::kAvx512Bf16:
      return "avx512bf16";
  }
  return "?";
}

std::optional<CpuIsa> CpuIsaFromName(std::string_view name) {
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16}) {
    if (name == CpuIsaName(isa)) return isa;
  }
  return std::nullopt;
}

std::vector<CpuIsa> CpuIsasFromList(std::string_view names) {
  std::vector<CpuIsa> out;
  while (!names.empty()) {
    const size_t comma = names.find(',');
    if (const auto isa = CpuIsaFromName(names.substr(0, comma))) out.push_back(*isa);
    names = comma == std::string_view::npos ? std::string_view() : names.substr(comma + 1);
  }
  if (out.empty()) out.push_back(ActiveCpuIsa());
  return out;
}

bool ForceCpuIsa(CpuIsa isa) {
  if (!CpuSupports(isa)) return false;
  ActiveStorage().store(static_cast<int>(isa), std::memory_order_relaxed);
  return true;
}

}  // namespace strata::kernels
