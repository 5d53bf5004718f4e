// Row-wise CPU kernels around the GEMMs of a transformer layer. Each has scalar, AVX2 and
// AVX-512 paths (kernels/cpu/isa.h) and parallelises over rows with OpenMP. Results for a
// row never depend on the other rows or on the thread count.
#ifndef STRATA_KERNELS_CPU_ELEMENTWISE_H_
#define STRATA_KERNELS_CPU_ELEMENTWISE_H_

#include <cstdint>

namespace strata::kernels {

// RMSNorm: out[r][i] = bf16(x[r][i] * (1 / sqrt(mean_i(x[r][i]^2) + eps)) * weight[i]).
//   x:      [rows][dim] f32
//   weight: [dim] f32
//   out:    [rows][dim] bf16
void RmsNorm(int rows, int dim, const float* x, const float* weight, float eps, uint16_t* out);

// SiLU-gated product of the fused gate/up projection:
// out[r][i] = bf16(silu(g) * u), g = gate_up[r][i], u = gate_up[r][ffn + i],
// silu(g) = g / (1 + exp(-g)).
//   gate_up: [rows][2 * ffn] f32
//   out:     [rows][ffn] bf16
void SiluMul(int rows, int ffn, const float* gate_up, uint16_t* out);

// Rotary position embedding in place, "rotate half" convention (Llama, Qwen, Mistral):
// for i < head_dim/2, (x[i], x[i + head_dim/2]) is rotated by the angle of position p and
// frequency i: x'[i] = x[i]*cos - x[i+h]*sin, x'[i+h] = x[i+h]*cos + x[i]*sin.
//   x:         [rows][row_stride] f32; head j occupies x + j * head_dim, j < num_heads
//   positions: [rows]
//   cos, sin:  [max_position][head_dim / 2] f32 tables, indexed by position
void ApplyRope(int rows, int num_heads, int head_dim, int64_t row_stride, const int32_t* positions,
               const float* cos, const float* sin, float* x);

// out[i] = exp((x[i] - shift) * scale): softmax weights of logits at a temperature.
// Returns the sum of out, accumulated in double: four partial sums of every fourth element
// (the tail in the first), added pairwise. The order is fixed, whatever the ISA.
//   x, out: [n] f32
double ExpShifted(int64_t n, const float* x, float shift, float scale, float* out);

// The index of the first largest number of x[0..n): the answer of
// `best = 0; for (i = 1; i < n; ++i) if (x[i] > x[best]) best = i;` started at the first
// element that is not NaN, so a NaN never wins. 0 when every element is NaN or n <= 0.
//   x: [n] f32
int64_t Argmax(int64_t n, const float* x);

// out[i] = bf16(in[i]), round to nearest even.
//   in: [n] f32, out: [n] bf16
void ConvertToBf16(int64_t n, const float* in, uint16_t* out);

// out[i] = f16(in[i]), round to nearest even, overflow to infinity: FloatToF16's bits.
//   in: [n] f32, out: [n] f16
void ConvertToF16(int64_t n, const float* in, uint16_t* out);

}  // namespace strata::kernels

#endif  // STRATA_KERNELS_CPU_ELEMENTWISE_H_
