// The elementwise algorithms over a SIMD Ops traits type (simd_ops.h), instantiated per
// instruction set. Private to kernels/cpu; see elementwise.h for the contracts.
#ifndef STRATA_KERNELS_CPU_ELEMENTWISE_IMPL_H_
#define STRATA_KERNELS_CPU_ELEMENTWISE_IMPL_H_

#include <cmath>
#include <cstdint>
#include <limits>

#include "common/base/bfloat16.h"
#include "kernels/cpu/simd_ops.h"

namespace strata::kernels::elementwise_internal {

// Rows are independent; small batches stay on the calling thread.
inline bool Parallel(int rows, int64_t row_elements) {
  return static_cast<int64_t>(rows) * row_elements >= 16384;
}

template <class Ops>
void RmsNorm(int rows, int dim, const float* x, const float* weight, float eps, uint16_t* out) {
  constexpr int L = Ops::kLanes;
  const int vec_end = dim / L * L;
#pragma omp parallel for schedule(static) if (Parallel(rows, dim))
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<int64_t>(r) * dim;
    uint16_t* o = out + static_cast<int64_t>(r) * dim;
    typename Ops::V acc = Ops::Zero();
    for (int i = 0; i < vec_end; i += L) {
      const typename Ops::V v = Ops::Load(xr + i);
      acc = Ops::Fma(v, v, acc);
    }
    float sum = Ops::ReduceAdd(acc);
    for (int i = vec_end; i < dim; ++i) sum += xr[i] * xr[i];
    const float inv_rms = 1.0f / std::sqrt(sum / static_cast<float>(dim) + eps);
    const typename Ops::V scale = Ops::Set1(inv_rms);
    for (int i = 0; i < vec_end; i += L) {
      Ops::StoreBf16(o + i, Ops::Mul(Ops::Mul(Ops::Load(xr + i), scale), Ops::Load(weight + i)));
    }
    for (int i = vec_end; i < dim; ++i) o[i] = FloatToBf16(xr[i] * inv_rms * weight[i]);
  }
}

template <class Ops>
void SiluMul(int rows, int ffn, const float* gate_up, uint16_t* out) {
  constexpr int L = Ops::kLanes;
  const int vec_end = ffn / L * L;
  const typename Ops::V one = Ops::Set1(1.0f);
  const typename Ops::V zero = Ops::Zero();
#pragma omp parallel for schedule(static) if (Parallel(rows, ffn))
  for (int r = 0; r < rows; ++r) {
    const float* g = gate_up + static_cast<int64_t>(r) * 2 * ffn;
    const float* u = g + ffn;
    uint16_t* o = out + static_cast<int64_t>(r) * ffn;
    for (int i = 0; i < vec_end; i += L) {
      const typename Ops::V gv = Ops::Load(g + i);
      const typename Ops::V silu = Ops::Div(gv, Ops::Add(one, Ops::Exp(Ops::Sub(zero, gv))));
      Ops::StoreBf16(o + i, Ops::Mul(silu, Ops::Load(u + i)));
    }
    for (int i = vec_end; i < ffn; ++i) {
      o[i] = FloatToBf16(g[i] / (1.0f + std::exp(-g[i])) * u[i]);
    }
  }
}

template <class Ops>
void ApplyRope(int rows, int num_heads, int head_dim, int64_t row_stride, const int32_t* positions,
               const float* cos, const float* sin, float* x) {
  constexpr int L = Ops::kLanes;
  const int half = head_dim / 2;
  const int vec_end = half / L * L;
#pragma omp parallel for schedule(static) if (Parallel(rows, num_heads * head_dim))
  for (int r = 0; r < rows; ++r) {
    const float* c = cos + static_cast<int64_t>(positions[r]) * half;
    const float* s = sin + static_cast<int64_t>(positions[r]) * half;
    for (int h = 0; h < num_heads; ++h) {
      float* x1 = x + r * row_stride + static_cast<int64_t>(h) * head_dim;
      float* x2 = x1 + half;
      for (int i = 0; i < vec_end; i += L) {
        const typename Ops::V a = Ops::Load(x1 + i);
        const typename Ops::V b = Ops::Load(x2 + i);
        const typename Ops::V cv = Ops::Load(c + i);
        const typename Ops::V sv = Ops::Load(s + i);
        Ops::Store(x1 + i, Ops::Sub(Ops::Mul(a, cv), Ops::Mul(b, sv)));
        Ops::Store(x2 + i, Ops::Add(Ops::Mul(b, cv), Ops::Mul(a, sv)));
      }
      for (int i = vec_end; i < half; ++i) {
        const float a = x1[i];
        const float b = x2[i];
        x1[i] = a * c[i] - b * s[i];
        x2[i] = b * c[i] + a * s[i];
      }
    }
  }
}

template <class Ops>
double ExpShifted(int64_t n, const float* x, float shift, float scale, float* out) {
  constexpr int L = Ops::kLanes;
  const int64_t vec_end = n / L * L;
  const typename Ops::V vshift = Ops::Set1(shift);
  const typename Ops::V vscale = Ops::Set1(scale);
  for (int64_t i = 0; i < vec_end; i += L) {
    Ops::Store(out + i, Ops::Exp(Ops::Mul(Ops::Sub(Ops::Load(x + i), vshift), vscale)));
  }
  for (int64_t i = vec_end; i < n; ++i) out[i] = std::exp((x[i] - shift) * scale);
  double s[4] = {0.0, 0.0, 0.0, 0.0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int j = 0; j < 4; ++j) s[j] += out[i + j];
  }
  for (; i < n; ++i) s[0] += out[i];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

// Argmax where x[0] is a number (n >= 1): two passes, the largest value with four
// accumulators, then the first block that holds it. Data go in as Max's first operand and
// accumulators as its second, which Max returns where either is NaN, so no NaN reaches an
// accumulator.
template <class Ops>
int64_t ArgmaxFromANumber(int64_t n, const float* x) {
  constexpr int L = Ops::kLanes;
  constexpr int64_t kBlock = 4 * L;
  const int64_t vec_end = n / kBlock * kBlock;
  const typename Ops::V lowest = Ops::Set1(-std::numeric_limits<float>::infinity());
  typename Ops::V m0 = lowest, m1 = lowest, m2 = lowest, m3 = lowest;
  for (int64_t i = 0; i < vec_end; i += kBlock) {
    m0 = Ops::Max(Ops::Load(x + i), m0);
    m1 = Ops::Max(Ops::Load(x + i + L), m1);
    m2 = Ops::Max(Ops::Load(x + i + 2 * L), m2);
    m3 = Ops::Max(Ops::Load(x + i + 3 * L), m3);
  }
  float best = Ops::ReduceMax(Ops::Max(Ops::Max(m0, m1), Ops::Max(m2, m3)));
  for (int64_t i = vec_end; i < n; ++i) best = x[i] > best ? x[i] : best;
  // x[0] is a number, so `best` is one that some x[i] equals.
  for (int64_t i = 0; i < vec_end; i += kBlock) {
    typename Ops::V b = Ops::Max(Ops::Load(x + i), lowest);
    b = Ops::Max(Ops::Load(x + i + L), b);
    b = Ops::Max(Ops::Load(x + i + 2 * L), b);
    b = Ops::Max(Ops::Load(x + i + 3 * L), b);
    if (Ops::ReduceMax(b) != best) continue;
    for (int64_t j = i; j < i + kBlock; ++j) {
      if (x[j] == best) return j;
    }
  }
  for (int64_t i = vec_end; i < n; ++i) {
    if (x[i] == best) return i;
  }
  return 0;
}

// Leading NaNs never win: the search starts at the first number (all NaN: 0).
template <class Ops>
int64_t Argmax(int64_t n, const float* x) {
  int64_t first = 0;
  while (first < n && std::isnan(x[first])) ++first;
  if (first == n) return 0;
  return first + ArgmaxFromANumber<Ops>(n - first, x + first);
}

// out[i] = in[i] in a 16-bit type: whole vectors by kStore, the tail by kScalar (the same
// rounding).
template <class Ops, void (*kStore)(uint16_t*, typename Ops::V), uint16_t (*kScalar)(float)>
void ConvertTo16(int64_t n, const float* in, uint16_t* out) {
  constexpr int L = Ops::kLanes;
  const int64_t vec_end = n / L * L;
#pragma omp parallel for schedule(static) if (n >= 65536)
  for (int64_t i = 0; i < vec_end; i += L) kStore(out + i, Ops::Load(in + i));
  for (int64_t i = vec_end; i < n; ++i) out[i] = kScalar(in[i]);
}

template <class Ops>
void ConvertToBf16(int64_t n, const float* in, uint16_t* out) {
  ConvertTo16<Ops, &Ops::StoreBf16, &FloatToBf16>(n, in, out);
}

template <class Ops>
void ConvertToF16(int64_t n, const float* in, uint16_t* out) {
  ConvertTo16<Ops, &Ops::StoreF16, &FloatToF16>(n, in, out);
}

}  // namespace strata::kernels::elementwise_internal

#endif  // STRATA_KERNELS_CPU_ELEMENTWISE_IMPL_H_
