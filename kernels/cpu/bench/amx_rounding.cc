// Does AMX's TDPBF16PS round as VDPBF16PS does? (Issue 16: whether an AMX GEMM could share
// the AVX-512 BF16 kernel's results.) Random bf16 A (16 x K) and B (K x 16, in the
// pair-interleaved layout both instructions take; K = 32..512), C = A B by each instruction
// and by three scalar models of a pair's rounding; prints how many outputs' bits differ.
// Needs a CPU with AVX-512 BF16; the AMX half runs where the CPU and kernel offer AMX.
//
//   bazel build //kernels/cpu/bench:amx_rounding && bazel-bin/kernels/cpu/bench/amx_rounding
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>

namespace {

struct TileConfig {
  uint8_t palette_id, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

float F32(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

uint64_t rng = 88172645463325252ull;
uint64_t Next() {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}
uint16_t RandomBf16() {
  // sign, exponent in [-12, 12], 7 random mantissa bits: no denormals, wide cancellations
  uint32_t sign = (Next() & 1) << 15, exp = 127 - 12 + Next() % 25, man = Next() & 0x7f;
  return static_cast<uint16_t>(sign | exp << 7 | man);
}

constexpr int kMaxK = 512;
uint16_t A[16][kMaxK], Bv[kMaxK / 2][32];
float amx[16][16], vdp[16][16];

// The instruction sets are enabled per function, so that main runs (and says why it stops)
// on any x86-64 CPU.
[[gnu::target("amx-tile,amx-bf16")]] void AmxConfigure() {
  TileConfig cfg = {};
  cfg.palette_id = 1;
  for (int t = 0; t < 3; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
}

// amx = A B over K (a multiple of 32) by tdpbf16ps: C in tile 0, 16 x 32 of A in tile 1, 16
// pair rows of B in tile 2.
[[gnu::target("amx-tile,amx-bf16")]] void AmxProduct(int k) {
  _tile_zero(0);
  for (int t = 0; t < k / 32; ++t) {
    _tile_loadd(1, &A[0][t * 32], kMaxK * 2);
    _tile_loadd(2, &Bv[t * 16][0], 64);
    _tile_dpbf16ps(0, 1, 2);
  }
  _tile_stored(0, amx, 64);
}

[[gnu::target("amx-tile")]] void AmxRelease() { _tile_release(); }

// vdp = A B over K by a vdpbf16ps chain per row, pair after pair.
[[gnu::target("avx512f,avx512bf16")]] void VdpProduct(int k) {
  for (int m = 0; m < 16; ++m) {
    __m512 acc = _mm512_setzero_ps();
    for (int p = 0; p < k / 2; ++p) {
      int32_t pair;
      std::memcpy(&pair, &A[m][2 * p], 4);
      acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_set1_epi32(pair),
                             (__m512bh)_mm512_loadu_si512(Bv[p]));
    }
    _mm512_storeu_ps(vdp[m], acc);
  }
}

}  // namespace

int main() {
  // CPUID leaf 7: AVX512_BF16 is bit 5 of EAX in subleaf 1, AMX-BF16 bit 22 of EDX in
  // subleaf 0 (read directly: not every compiler's __builtin_cpu_supports knows them).
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0, eax1 = 0;
  if (__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx)) eax1 = eax;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) edx = 0;
  if (!__builtin_cpu_supports("avx512f") || (eax1 & (1u << 5)) == 0) {
    std::printf("this CPU has no AVX-512 BF16: nothing to compare\n");
    return 1;
  }
  const bool have_amx =
      syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18) == 0 && (edx & (1u << 22)) != 0;
  std::printf("AMX %s\n",
              have_amx ? "available" : "not available: VDPBF16PS against the models only");
  if (have_amx) AmxConfigure();
  long outputs = 0, amx_vdp = 0, amx_m[3] = {0}, vdp_m[3] = {0};
  for (int trial = 0; trial < 2000; ++trial) {
    const int K = 32 * (1 + trial % 16);
    for (int m = 0; m < 16; ++m) {
      for (int k = 0; k < K; ++k) A[m][k] = RandomBf16();
    }
    for (int p = 0; p < K / 2; ++p) {
      for (int j = 0; j < 32; ++j) Bv[p][j] = RandomBf16();
    }
    if (have_amx) AmxProduct(K);
    VdpProduct(K);
    for (int m = 0; m < 16; ++m) {
      for (int n = 0; n < 16; ++n) {
        // Models: odd product then even, each addition rounded; even then odd; the pair's
        // two products summed exactly and added with one rounding (in __float128, whose
        // 113 bits hold every such sum here exactly).
        float oe = 0, eo = 0, one = 0;
        for (int p = 0; p < K / 2; ++p) {
          const float pe = F32(A[m][2 * p]) * F32(Bv[p][2 * n]);
          const float po = F32(A[m][2 * p + 1]) * F32(Bv[p][2 * n + 1]);
          oe = (oe + po) + pe;
          eo = (eo + pe) + po;
          one = static_cast<float>(static_cast<__float128>(one) + pe + po);
        }
        ++outputs;
        const uint32_t v = Bits(vdp[m][n]);
        vdp_m[0] += v != Bits(oe);
        vdp_m[1] += v != Bits(eo);
        vdp_m[2] += v != Bits(one);
        if (have_amx) {
          const uint32_t a = Bits(amx[m][n]);
          amx_vdp += a != v;
          amx_m[0] += a != Bits(oe);
          amx_m[1] += a != Bits(eo);
          amx_m[2] += a != Bits(one);
        }
      }
    }
  }
  if (have_amx) AmxRelease();
  std::printf("%ld outputs (K = 32..512); outputs whose bits differ:\n", outputs);
  std::printf(
      "  VDPBF16PS against odd-then-even %ld, even-then-odd %ld, one rounding per pair %ld\n",
      vdp_m[0], vdp_m[1], vdp_m[2]);
  if (have_amx) {
    std::printf("  TDPBF16PS against VDPBF16PS %ld\n", amx_vdp);
    std::printf(
        "  TDPBF16PS against odd-then-even %ld, even-then-odd %ld, one rounding per pair %ld\n",
        amx_m[0], amx_m[1], amx_m[2]);
  }
  return 0;
}
