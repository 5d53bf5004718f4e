// Scalar conversions between float and the 16-bit storage types strata uses: bfloat16
// (weights, activations on the wire, KV cache) and IEEE half (f16 checkpoints and KV).
// Header-only and dependency-free, so kernels/ can use it too.
#ifndef STRATA_COMMON_BASE_BFLOAT16_H_
#define STRATA_COMMON_BASE_BFLOAT16_H_

#include <cstdint>
#include <cstring>

namespace strata {

// Rounds to nearest, ties to even; NaN stays a (quiet) NaN.
inline uint16_t FloatToBf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  const uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}

inline float Bf16ToFloat(uint16_t value) {
  const uint32_t bits = static_cast<uint32_t>(value) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

inline float RoundToBf16(float value) { return Bf16ToFloat(FloatToBf16(value)); }

// IEEE 754 binary16 to float, subnormals and infinities included.
inline float F16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // Subnormal: normalise.
      exponent = 127 - 15 + 1;
      while ((mantissa & 0x400u) == 0) {
        mantissa <<= 1;
        --exponent;
      }
      mantissa &= 0x3ffu;
      bits = sign | (exponent << 23) | (mantissa << 13);
    }
  } else if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  }
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

// Float to binary16, round to nearest even, overflow to infinity.
inline uint16_t FloatToF16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (abs_bits >= 0x477ff000u) return sign | 0x7c00u;  // Overflow (incl. rounding) to inf.
  if (abs_bits < 0x33000000u) return sign;             // Underflow to zero.
  int exponent = static_cast<int>(abs_bits >> 23) - 127 + 15;
  uint32_t mantissa = (abs_bits & 0x7fffffu) | 0x800000u;
  int shift = 13;
  if (exponent <= 0) {  // Subnormal result.
    shift += 1 - exponent;
    exponent = 0;
  }
  uint32_t result = mantissa >> shift;
  const uint32_t remainder = mantissa & ((1u << shift) - 1);
  const uint32_t halfway = 1u << (shift - 1);
  if (remainder > halfway || (remainder == halfway && (result & 1u))) ++result;
  if (exponent == 0) return sign | static_cast<uint16_t>(result);
  // result includes the implicit bit; a carry out of the mantissa bumps the exponent.
  return sign | static_cast<uint16_t>(((exponent << 10) + (result - 0x400u)) & 0xffffu);
}

}  // namespace strata

#endif  // STRATA_COMMON_BASE_BFLOAT16_H_
