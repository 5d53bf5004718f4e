// SIMD "Ops" traits shared by the CPU kernels. Each kernel algorithm is a template over an
// Ops type and is instantiated once per instruction set; the AVX2/AVX-512 traits exist only
// in translation units compiled with those instruction sets enabled.
//
// Ops provides: kLanes, V, Zero, Set1, Load, Store, LoadKv<KvDType>, StoreBf16, StoreF16, Add, Sub,
// Mul, Fma, Max, Min, ReduceAdd, ReduceMax, Exp. Exp(-inf) is exactly 0 and Exp(0) exactly
// 1 on every path. The vector paths also provide ReduceAddAll: the ReduceAdd of kLanes
// vectors at once, bit for bit, lane l holding the sum of v[ReduceAddAllSource(kLanes, l)].
#ifndef STRATA_KERNELS_CPU_SIMD_OPS_H_
#define STRATA_KERNELS_CPU_SIMD_OPS_H_

#include <cmath>
#include <cstdint>

#include "common/base/bfloat16.h"
#include "kernels/cpu/attention.h"

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace strata::kernels::simd {

// Polynomial exp shared by the SIMD paths: e^x = 2^n * e^r, |r| <= ln2/2, with the
// degree-7 Taylor series of e^r (its truncation error is below float precision there).
template <class Ops, class ScaleByPow2>
inline typename Ops::V PolyExp(typename Ops::V x, ScaleByPow2 scale_by_pow2) {
  using V = typename Ops::V;
  const V min_x = Ops::Set1(-87.33654f);  // below this, e^x is subnormal: return 0
  const V max_x = Ops::Set1(88.0f);       // keeps 2^n finite on every path
  const V clamped = Ops::Max(Ops::Min(x, max_x), min_x);
  const V n = Ops::Round(Ops::Mul(clamped, Ops::Set1(1.44269504088896341f)));
  V r = Ops::Fma(n, Ops::Set1(-0.693359375f), clamped);  // ln2 split into hi + lo
  r = Ops::Fma(n, Ops::Set1(2.12194440e-4f), r);
  V y = Ops::Set1(1.0f / 5040.0f);
  y = Ops::Fma(y, r, Ops::Set1(1.0f / 720.0f));
  y = Ops::Fma(y, r, Ops::Set1(1.0f / 120.0f));
  y = Ops::Fma(y, r, Ops::Set1(1.0f / 24.0f));
  y = Ops::Fma(y, r, Ops::Set1(1.0f / 6.0f));
  y = Ops::Fma(y, r, Ops::Set1(0.5f));
  y = Ops::Fma(y, r, Ops::Set1(1.0f));
  y = Ops::Fma(y, r, Ops::Set1(1.0f));
  return Ops::ZeroWhereLess(scale_by_pow2(y, n), x, min_x);
}

// The portable path: one lane, libm exp.
struct ScalarOps {
  static constexpr int kLanes = 1;
  using V = float;
  static V Zero() { return 0.0f; }
  static V Set1(float x) { return x; }
  static V Load(const float* p) { return *p; }
  static void Store(float* p, V v) { *p = v; }
  static void StoreBf16(uint16_t* p, V v) { *p = FloatToBf16(v); }
  static void StoreF16(uint16_t* p, V v) { *p = FloatToF16(v); }
  template <KvDType kKv>
  static V LoadKv(const uint16_t* p) {
    return kKv == KvDType::kBF16 ? Bf16ToFloat(*p) : F16ToFloat(*p);
  }
  static V Add(V a, V b) { return a + b; }
  static V Sub(V a, V b) { return a - b; }
  static V Mul(V a, V b) { return a * b; }
  static V Div(V a, V b) { return a / b; }
  static V Fma(V a, V b, V c) { return a * b + c; }
  static V Max(V a, V b) { return a > b ? a : b; }
  static V Min(V a, V b) { return a < b ? a : b; }
  static float ReduceAdd(V v) { return v; }
  static float ReduceMax(V v) { return v; }
  static V Exp(V x) { return std::exp(x); }
};

// The input of a vector path's ReduceAddAll whose sum lands in lane `lane`: lane 4k + m
// holds the sum of v[(lanes / 4) * m + k].
constexpr int ReduceAddAllSource(int lanes, int lane) { return lanes / 4 * (lane % 4) + lane / 4; }

#ifdef __AVX512F__
struct Avx512Ops {
  static constexpr int kLanes = 16;
  using V = __m512;
  static V Zero() { return _mm512_setzero_ps(); }
  static V Set1(float x) { return _mm512_set1_ps(x); }
  static V Load(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, V v) { _mm512_storeu_ps(p, v); }
  // Round to nearest even, NaN quieted: the same rule as FloatToBf16.
  static void StoreBf16(uint16_t* p, V v) {
    __m512i bits = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    rounded = _mm512_mask_or_epi32(rounded, nan, bits, _mm512_set1_epi32(0x400000));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16)));
  }
  // Round to nearest even (F16C); NaNs as FloatToF16 writes them, so that every path gives
  // the same bits.
  static void StoreF16(uint16_t* p, V v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    if (nan != 0) {
      alignas(64) float lanes[16];
      _mm512_store_ps(lanes, v);
      for (int i = 0; i < 16; ++i) {
        if ((nan >> i) & 1) p[i] = FloatToF16(lanes[i]);
      }
    }
  }
  template <KvDType kKv>
  static V LoadKv(const uint16_t* p) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    if constexpr (kKv == KvDType::kBF16) {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
    } else {
      return _mm512_cvtph_ps(raw);
    }
  }
  static V Add(V a, V b) { return _mm512_add_ps(a, b); }
  static V Sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V Mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V Div(V a, V b) { return _mm512_div_ps(a, b); }
  static V Fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V Max(V a, V b) { return _mm512_max_ps(a, b); }
  static V Min(V a, V b) { return _mm512_min_ps(a, b); }
  static V Round(V x) {
    return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static V ZeroWhereLess(V v, V x, V threshold) {
    return _mm512_maskz_mov_ps(~_mm512_cmp_ps_mask(x, threshold, _CMP_LT_OQ), v);
  }
  static float ReduceAdd(V v) { return _mm512_reduce_add_ps(v); }
  // ReduceAdd of 16 vectors at once, each sum exactly ReduceAdd's (the same tree: lanes i
  // and i + 8, then i and i + 4, i and i + 2, i and i + 1), in about 3 instructions a sum
  // instead of 9. Lane 4k + m of the result is the sum of v[4m + k] (ReduceAddAllSource).
  static V ReduceAddAll(const V* v) {
    V s1[8], s2[4], s3[2];
    for (int j = 0; j < 8; ++j) {  // lanes 0-7: v[2j]'s i + (i + 8), lanes 8-15: v[2j + 1]'s
      s1[j] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * j], v[2 * j + 1], 0x44),
                            _mm512_shuffle_f32x4(v[2 * j], v[2 * j + 1], 0xEE));
    }
    for (int j = 0; j < 4; ++j) {  // block b: v[4j + b]'s i + (i + 4)
      s2[j] = _mm512_add_ps(_mm512_shuffle_f32x4(s1[2 * j], s1[2 * j + 1], 0x88),
                            _mm512_shuffle_f32x4(s1[2 * j], s1[2 * j + 1], 0xDD));
    }
    for (int j = 0; j < 2; ++j) {  // block b: v[8j + b]'s i + (i + 2), then v[8j + 4 + b]'s
      s3[j] = _mm512_add_ps(_mm512_shuffle_ps(s2[2 * j], s2[2 * j + 1], 0x44),
                            _mm512_shuffle_ps(s2[2 * j], s2[2 * j + 1], 0xEE));
    }
    // Block b: the sums of v[b], v[4 + b], v[8 + b], v[12 + b].
    return _mm512_add_ps(_mm512_shuffle_ps(s3[0], s3[1], 0x88),
                         _mm512_shuffle_ps(s3[0], s3[1], 0xDD));
  }
  static float ReduceMax(V v) { return _mm512_reduce_max_ps(v); }
  static V Exp(V x) {
    return PolyExp<Avx512Ops>(x, [](V y, V n) { return _mm512_scalef_ps(y, n); });
  }
};
#endif  // __AVX512F__

#ifdef __AVX512BF16__
// AVX-512 in the translation unit built with the BF16 extension (kernels_avx512bf16.cc). The
// same operations as Avx512Ops, in a type of its own, so that what that unit instantiates
// never stands in for the plain AVX-512 unit's code at link time; and bf16 dot products
// (vdpbf16ps), which attention's q.k of bf16 keys runs on (attention_impl.h, kBf16Dots):
// each f32 lane adds the products of one pair of bf16 elements, the odd one first, each
// addition rounded as a fused multiply-add rounds it (the products of two bf16 are exact
// in f32), inputs and results below the normal range taken as zero. (An earlier tile
// kernel built on them was slower than the f32 one for its p.v, docs/benchmarks.md,
// "Attention slot by slot on every instruction set"; q.k alone is faster on them, "q.k of
// bf16 keys on the BF16 dot product".)
struct Avx512Bf16Ops : Avx512Ops {
  static constexpr bool kBf16Dot = true;
  using Pairs = __m512bh;  // 32 bf16: 16 pairs
  static Pairs LoadPairs(const uint16_t* p) {
    return reinterpret_cast<__m512bh>(_mm512_loadu_si512(p));
  }
  // 16 bf16 (8 pairs) into the low half, zeros above: their products add nothing.
  static Pairs LoadHalfPairs(const uint16_t* p) {
    return reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi16(0xffff, p));
  }
  static V DotPairs(V acc, Pairs a, Pairs b) { return _mm512_dpbf16_ps(acc, a, b); }
  // DotPairs on f32 FMAs, where they are faster (attention_impl.h, KeyDotsFourHeads): the 16
  // pairs at p as f32, each lane's odd element and its even one, for
  // fma(even_q, even, fma(odd_q, odd, acc)), which is DotPairs lane for lane.
  static void WidenPairs(const uint16_t* p, V* odd, V* even) {
    const __m512i v = _mm512_loadu_si512(p);
    *odd =
        _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
    *even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
  }
  static V Exp(V x) {
    return PolyExp<Avx512Bf16Ops>(x, [](V y, V n) { return _mm512_scalef_ps(y, n); });
  }
};
#endif  // __AVX512BF16__

#ifdef __AVX2__
struct Avx2Ops {
  static constexpr int kLanes = 8;
  using V = __m256;
  static V Zero() { return _mm256_setzero_ps(); }
  static V Set1(float x) { return _mm256_set1_ps(x); }
  static V Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static void StoreBf16(uint16_t* p, V v) {
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, v);
    for (int i = 0; i < 8; ++i) p[i] = FloatToBf16(lanes[i]);
  }
  static void StoreF16(uint16_t* p, V v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    const int nan = _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    if (nan != 0) {
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, v);
      for (int i = 0; i < 8; ++i) {
        if ((nan >> i) & 1) p[i] = FloatToF16(lanes[i]);
      }
    }
  }
  template <KvDType kKv>
  static V LoadKv(const uint16_t* p) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    if constexpr (kKv == KvDType::kBF16) {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
    } else {
      return _mm256_cvtph_ps(raw);
    }
  }
  static V Add(V a, V b) { return _mm256_add_ps(a, b); }
  static V Sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V Mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V Div(V a, V b) { return _mm256_div_ps(a, b); }
  static V Fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V Max(V a, V b) { return _mm256_max_ps(a, b); }
  static V Min(V a, V b) { return _mm256_min_ps(a, b); }
  static V Round(V x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static V ZeroWhereLess(V v, V x, V threshold) {
    return _mm256_andnot_ps(_mm256_cmp_ps(x, threshold, _CMP_LT_OQ), v);
  }
  static float ReduceAdd(V v) {
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
  }
  // ReduceAdd of 8 vectors at once, each sum exactly ReduceAdd's (the same tree: lanes i
  // and i + 4, then i and i + 2, i and i + 1), in about 3 instructions a sum instead of 6.
  // Lane 4k + m of the result is the sum of v[2m + k] (ReduceAddAllSource).
  static V ReduceAddAll(const V* v) {
    V s1[4], s2[2];
    for (int j = 0; j < 4; ++j) {  // lanes 0-3: v[2j]'s i + (i + 4), lanes 4-7: v[2j + 1]'s
      s1[j] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * j], v[2 * j + 1], 0x20),
                            _mm256_permute2f128_ps(v[2 * j], v[2 * j + 1], 0x31));
    }
    for (int j = 0; j < 2; ++j) {  // half b: v[4j + b]'s i + (i + 2), then v[4j + 2 + b]'s
      s2[j] = _mm256_add_ps(_mm256_shuffle_ps(s1[2 * j], s1[2 * j + 1], 0x44),
                            _mm256_shuffle_ps(s1[2 * j], s1[2 * j + 1], 0xEE));
    }
    // Half b: the sums of v[b], v[2 + b], v[4 + b], v[6 + b].
    return _mm256_add_ps(_mm256_shuffle_ps(s2[0], s2[1], 0x88),
                         _mm256_shuffle_ps(s2[0], s2[1], 0xDD));
  }
  static float ReduceMax(V v) {
    __m128 lo = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    lo = _mm_max_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_max_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
  }
  // 2^n for integral n in [-126, 127], built in the exponent field.
  static V Pow2(V n) {
    const __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    return _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
  }
  static V Exp(V x) {
    return PolyExp<Avx2Ops>(x, [](V y, V n) { return _mm256_mul_ps(y, Pow2(n)); });
  }
};
#endif  // __AVX2__

}  // namespace strata::kernels::simd

#endif  // STRATA_KERNELS_CPU_SIMD_OPS_H_
