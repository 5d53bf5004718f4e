// strata's own GEMM for linear layers (the default; compute_node/linear.h says where
// oneDNN runs instead): y = x W^T (+ bias) (+ y), bf16 inputs, f32 products and sums.
// Scalar, AVX2, AVX-512 and AVX-512 BF16 kernels, chosen by the active ISA.
//
// Each output element is summed over k-pairs (2p, 2p + 1) in ascending order, from zero:
// for each pair, one fused multiply-add for the odd term and then one for the even term
// (with k odd, the last pair's odd term is zero). That is the per-lane arithmetic of
// AVX-512 BF16's vdpbf16ps (each of its two additions rounds once, as an FMA does: checked
// lane for lane on an AMD Zen 4, and gemm_test passes on an Intel Xeon with AMX too), so
// that kernel runs on bf16 directly; the others convert to f32 and do the same FMAs. Then the bias
// is added, then (accumulate) the old y. Nothing else enters that order, so a row's output does not
// depend on the number of rows, the row's place in the batch, the thread count or the ISA path (the
// scalar path uses std::fmaf in the same order and matches every vector path bit for bit; denormals
// are flushed on every path).
//
// Weights are packed once, at load, into blocks of 16 output columns as k-pairs:
// [ceil(n/16)][ceil(k/2)][16][2] bf16, zero-padded, so one block is read sequentially while
// its columns accumulate, and one 64-byte load gives a pair for all 16 columns.
//
// Wide batches on AVX-512 BF16 CPUs. vdpbf16ps does 32 multiply-adds an instruction, twice
// an f32 FMA's 16, but CPUs issue it at different rates: on the AMD Zen machines measured it
// runs at twice the FMAs' FLOP rate, on the Intel Xeons measured at half of it (one every
// two cycles against two FMAs a cycle; docs/benchmarks.md). Below kGemmWideRows rows the GEMM reads
// weights as fast as memory gives them on either kernel, and vdpbf16ps, on bf16 directly, reads
// faster. From kGemmWideRows rows up it is bound by arithmetic, and GemmWideKernel picks
// the kernel: vdpbf16ps (kDot), or the AVX-512 kernel's f32 FMAs over weights widened in
// registers (kFma). Both give the same bits (above), so the choice changes speed only and
// may differ between the nodes of a deployment.
//
// Thread-safety: GemmBf16 may be called from several threads at once; it runs an OpenMP
// team over column blocks, in groups of 4 on every path.
#ifndef STRATA_KERNELS_CPU_GEMM_H_
#define STRATA_KERNELS_CPU_GEMM_H_

#include <cstdint>

namespace strata::kernels {

inline constexpr int64_t kGemmColumnBlock = 16;
inline constexpr int64_t kGemmWideRows = 8;

enum class GemmWideKernel : int { kAuto = 0, kDot = 1, kFma = 2 };

// The kernel of wide batches on this CPU, kDot or kFma: STRATA_GEMM_WIDE=dot or fma, else
// (unset or auto) the faster of the two instructions in a register-only probe taken once
// per process (about a millisecond), kFma where FMAs give at least 1.25x vdpbf16ps's FLOP
// rate. kDot where the CPU lacks AVX-512 BF16 (the kernel is then the ISA's).
GemmWideKernel ActiveGemmWideKernel();
const char* GemmWideKernelName(GemmWideKernel kernel);
// The probe behind the automatic choice, on the calling thread: FLOP/s (2 per multiply-add)
// of independent chains of vdpbf16ps and of 512-bit f32 FMAs, the best of five short runs
// each; 0 for an instruction the CPU lacks.
struct GemmWideProbe {
  double dot = 0, fma = 0;
};
GemmWideProbe MeasureGemmWideProbe();
// Tests and benchmarks: forces the choice (kAuto: back to ActiveGemmWideKernel's own). Not
// for use while GEMMs run on other threads.
void ForceGemmWideKernel(GemmWideKernel kernel);

// Elements of the packed weight for an [n][k] weight.
int64_t PackedGemmWeightSize(int64_t n, int64_t k);
// Packs `w` ([n][k] bf16, Hugging Face's [out][in]) into `packed`
// (PackedGemmWeightSize(n, k) elements).
void PackGemmWeight(const uint16_t* w, int64_t n, int64_t k, uint16_t* packed);

// y[m][n] = x[m][k] W^T + bias[n] (bias may be null), plus the old y[m][n] if accumulate.
// x is bf16 with rows of k; y is f32 with rows of n.
void GemmBf16(int64_t m, int64_t n, int64_t k, const uint16_t* x, const uint16_t* packed,
              const float* bias, bool accumulate, float* y);

}  // namespace strata::kernels

#endif  // STRATA_KERNELS_CPU_GEMM_H_
