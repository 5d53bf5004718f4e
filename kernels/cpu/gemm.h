// strata's own GEMM for linear layers on CPUs where oneDNN has no bf16 matmul (AVX2
// without AVX-512, and machines without AVX2), or everywhere with STRATA_GEMM=own:
// y = x W^T (+ bias) (+ y), bf16 inputs, f32 products and sums. Scalar, AVX2 and AVX-512
// kernels, chosen by the active ISA.
//
// Each output element is summed over k in ascending order with one fused multiply-add per
// term, starting from zero; then the bias is added, then (accumulate) the old y. Nothing
// else enters that order, so a row's output does not depend on the number of rows, the
// row's place in the batch, the thread count or the ISA path (the scalar path uses
// std::fmaf in the same order and matches the AVX2 and AVX-512 paths bit for bit).
//
// Weights are packed once, at load, into blocks of 16 output columns: [ceil(n/16)][k][16]
// bf16, zero-padded, so one block is read sequentially while its columns accumulate.
//
// Thread-safety: GemmBf16 may be called from several threads at once; it runs an OpenMP
// team over column blocks.
#ifndef STRATA_KERNELS_CPU_GEMM_H_
#define STRATA_KERNELS_CPU_GEMM_H_

#include <cstdint>

namespace strata::kernels {

inline constexpr int64_t kGemmColumnBlock = 16;

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
