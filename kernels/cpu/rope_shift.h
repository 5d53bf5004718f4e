// Moves keys that were stored with RoPE already applied to new positions (context
// truncation keeps the first and the last tokens of a conversation and drops the middle, so
// the kept tail's keys move `shift` positions earlier).
//
// RoPE rotates each pair (x[i], x[i + head_dim/2]) by the angle position * inv_freq[i].
// Rotations compose, so a key stored at position p moves to p + shift by one more rotation
// of angle shift * inv_freq[i]; no pre-rotation copy is needed. The caller passes that
// angle's cosine and sine (negative shifts have negative sines).
//
// Scalar code that the compiler vectorises: this runs once per truncation over the moved
// tokens, not per step.
#ifndef STRATA_KERNELS_CPU_ROPE_SHIFT_H_
#define STRATA_KERNELS_CPU_ROPE_SHIFT_H_

#include <cstdint>

#include "kernels/cpu/attention.h"

namespace strata::kernels {

// For each of `rows` rows of `num_heads` heads, rotates every head's pairs by the angles
// whose cos and sin are given, in f32, and rounds back to the store's dtype:
//   x'[i] = x[i]*cos[i] - x[i+h]*sin[i], x'[i+h] = x[i+h]*cos[i] + x[i]*sin[i], h = head_dim/2.
//   in, out:  [rows][num_heads * head_dim] elements of `dtype` (bf16 or f16); may alias
//   cos, sin: [head_dim / 2] f32
void ShiftRope(int64_t rows, int num_heads, int head_dim, KvDType dtype, const float* cos,
               const float* sin, const uint16_t* in, uint16_t* out);

}  // namespace strata::kernels

#endif  // STRATA_KERNELS_CPU_ROPE_SHIFT_H_
