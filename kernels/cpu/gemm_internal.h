// The per-ISA kernels behind GemmBf16 (gemm.h). Private to kernels/cpu.
//
// A packed column block holds 16 output columns as k-pairs: element (p, j, h) at
// block[(p * 16 + j) * 2 + h] is w[column j][2p + h], zero past k. Every kernel computes
// out[r][j] = the sum, over pairs p ascending, of fma(x[r][2p + 1], w[2p + 1][j], .) then
// fma(x[r][2p], w[2p][j], .), from zero (x[r][k] is taken as zero when k is odd).
#ifndef STRATA_KERNELS_CPU_GEMM_INTERNAL_H_
#define STRATA_KERNELS_CPU_GEMM_INTERNAL_H_

#include <cstdint>

namespace strata::kernels::gemm_internal {

// Elements of one packed column block.
inline int64_t PackedBlockSize(int64_t k) { return (k + 1) / 2 * 32; }

// Column groups: gemm.cc hands each kernel up to kGroupBlocks consecutive packed column
// blocks (from 4 rows up; one block below, except to the AVX-512 BF16 kernel). The AVX-512
// kernels run them side by side, so that a row has several independent chains of FMAs;
// the AVX2 and scalar ones one block after another.
inline constexpr int kGroupBlocks = 4;

// Rows [0, rows) of x (f32, row stride k) against `blocks` (1 to kGroupBlocks) consecutive
// packed column blocks; out has rows of out_stride floats, block b's columns at b * 16.
void ColumnGroupScalar(int rows, int blocks, int64_t k, const float* x, const uint16_t* group,
                       float* out, int64_t out_stride);
void ColumnGroupAvx2(int rows, int blocks, int64_t k, const float* x, const uint16_t* group,
                     float* out, int64_t out_stride);
void ColumnGroupAvx512(int rows, int blocks, int64_t k, const float* x, const uint16_t* group,
                       float* out, int64_t out_stride);

// The AVX-512 BF16 kernel (vdpbf16ps, whose per-lane arithmetic is the two FMAs above):
// as the others, but x is bf16 pairs (row stride x_stride elements, even, with x[r][k] = 0
// when k is odd). While it runs, the `next_elements` packed weights at `next` (the group
// this thread takes next; null: none) are prefetched into L2. That changes no arithmetic.
void ColumnGroupAvx512Bf16(int rows, int blocks, int64_t k, const uint16_t* x, int64_t x_stride,
                           const uint16_t* group, float* out, int64_t out_stride,
                           const uint16_t* next, int64_t next_elements);

}  // namespace strata::kernels::gemm_internal

#endif  // STRATA_KERNELS_CPU_GEMM_INTERNAL_H_
