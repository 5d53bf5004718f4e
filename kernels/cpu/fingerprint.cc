#include "kernels/cpu/fingerprint.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <utility>

#include "common/base/bfloat16.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/rope_shift.h"

namespace strata::kernels {
namespace {

// splitmix64: the same numbers on every machine, with no library in between. Inputs never
// go through libm either, so a machine's math library cannot change them.
class Numbers {
 public:
  explicit Numbers(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [-scale, scale).
  float Uniform(float scale) {
    const float unit = static_cast<float>(Next() >> 40) * 0x1.0p-24f;
    return (2.0f * unit - 1.0f) * scale;
  }
  std::vector<float> Floats(size_t n, float scale) {
    std::vector<float> v(n);
    for (float& x : v) x = Uniform(scale);
    return v;
  }
  std::vector<uint16_t> Bf16s(size_t n, float scale) {
    std::vector<uint16_t> v(n);
    for (uint16_t& x : v) x = FloatToBf16(Uniform(scale));
    return v;
  }

 private:
  uint64_t state_;
};

template <typename T>
uint64_t HashOf(const std::vector<T>& v, uint64_t hash = 0xcbf29ce484222325ULL) {
  return FingerprintBytes(v.data(), v.size() * sizeof(T), hash);
}

void AddGemm(std::vector<KernelFingerprint>& out, int64_t m, int64_t n, int64_t k, bool bias,
             bool accumulate, uint64_t seed) {
  Numbers rng(seed);
  const std::vector<uint16_t> w = rng.Bf16s(n * k, 0.5f), x = rng.Bf16s(m * k, 2.0f);
  const std::vector<float> b = rng.Floats(n, 1.0f);
  std::vector<float> y = rng.Floats(m * n, 1.0f);
  std::vector<uint16_t> packed(PackedGemmWeightSize(n, k));
  PackGemmWeight(w.data(), n, k, packed.data());
  GemmBf16(m, n, k, x.data(), packed.data(), bias ? b.data() : nullptr, accumulate, y.data());
  out.push_back({"gemm m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" +
                     std::to_string(k) + (bias ? " bias" : "") + (accumulate ? " accumulate" : ""),
                 HashOf(y)});
}

// Attention of rows ending at `kv_ends` over one layer whose slots are a shuffle of the
// cache (as after allocation churn). Hashes the whole-row output and the state of a fold
// split in two and merged (what a memory node and a compute node do between them).
void AddAttention(std::vector<KernelFingerprint>& out, int heads, int kv_heads, int dim,
                  KvDType dtype, float scale_factor, uint64_t seed) {
  const std::vector<int32_t> kv_ends = {1, 63, 64, 65, 200, 517};
  Numbers rng(seed);
  const AttentionParams p{heads, kv_heads, dim, scale_factor / std::sqrt(static_cast<float>(dim)),
                          dtype};
  int num_positions = 0;
  for (int32_t e : kv_ends) num_positions += e;
  const int num_slots = num_positions + 13;
  std::vector<int32_t> shuffled(num_slots);
  std::iota(shuffled.begin(), shuffled.end(), 0);
  for (int i = num_slots - 1; i > 0; --i) std::swap(shuffled[i], shuffled[rng.Next() % (i + 1)]);

  const size_t cache_elems = static_cast<size_t>(num_slots) * kv_heads * dim;
  std::vector<uint16_t> k(cache_elems), v(cache_elems);
  for (std::vector<uint16_t>* cache : {&k, &v}) {
    for (uint16_t& e : *cache) {
      const float value = rng.Uniform(3.0f);
      e = dtype == KvDType::kBF16 ? FloatToBf16(value) : FloatToF16(value);
    }
  }
  const int num_rows = static_cast<int>(kv_ends.size());
  const std::vector<uint16_t> q = rng.Bf16s(static_cast<size_t>(num_rows) * heads * dim, 3.0f);
  std::vector<std::vector<int32_t>> slots(num_rows);
  std::vector<AttentionRow> rows(num_rows);
  int next = 0;
  for (int r = 0; r < num_rows; ++r) {
    slots[r].assign(shuffled.begin() + next, shuffled.begin() + next + kv_ends[r]);
    next += kv_ends[r];
    rows[r].slots = slots[r].data();
    rows[r].kv_end = kv_ends[r];
  }

  const size_t state_elems = static_cast<size_t>(num_rows) * heads * (dim + 2);
  std::vector<float> scratch(state_elems);
  std::vector<uint16_t> result(static_cast<size_t>(num_rows) * heads * dim);
  const int whole = Attention(p, num_rows, q.data(), rows.data(), k.data(), v.data(),
                              scratch.data(), result.data());

  std::vector<float> first(state_elems), second(state_elems);
  AttentionStateInit(p, num_rows, first.data());
  AttentionStateInit(p, num_rows, second.data());
  std::vector<AttentionRow> head_part = rows, tail_part = rows;
  for (int r = 0; r < num_rows; ++r) {
    const int32_t num_tiles = AttentionNumTiles(kv_ends[r]);
    head_part[r].tile_begin = 0;
    head_part[r].tile_end = num_tiles / 2;
    tail_part[r].tile_begin = num_tiles / 2;
    tail_part[r].tile_end = num_tiles;
  }
  const int folded =
      AttentionFold(p, num_rows, q.data(), head_part.data(), k.data(), v.data(), first.data()) |
      AttentionFold(p, num_rows, q.data(), tail_part.data(), k.data(), v.data(), second.data());
  AttentionMergeStates(p, num_rows, second.data(), first.data());

  const std::string name =
      std::string("attention ") + EnumNameOf(dtype, kKvDTypeNames) +
      " heads=" + std::to_string(heads) + "/" + std::to_string(kv_heads) +
      " dim=" + std::to_string(dim) +
      (scale_factor != 1.0f ? " scale*" + std::to_string(static_cast<int>(scale_factor)) : "");
  // An error code enters the hash, so a kernel that refuses the shape cannot pass for one
  // that computed it.
  out.push_back({name, FingerprintBytes(&whole, sizeof(whole), HashOf(result))});
  out.push_back({name + " split", FingerprintBytes(&folded, sizeof(folded), HashOf(first))});
}

}  // namespace

uint64_t FingerprintBytes(const void* data, size_t size, uint64_t hash) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) {
    hash ^= bytes[i];
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

std::string CombinedFingerprint(const std::vector<KernelFingerprint>& fingerprints,
                                const std::string& prefix) {
  uint64_t hash = FingerprintBytes(nullptr, 0);
  for (const KernelFingerprint& f : fingerprints) {
    if (f.kernel.compare(0, prefix.size(), prefix) == 0) {
      hash = FingerprintBytes(&f.hash, sizeof(f.hash), hash);
    }
  }
  return FingerprintHex(hash);
}

std::string FingerprintHex(uint64_t hash) {
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(hash));
  return hex;
}

NodeFingerprints FingerprintsForRegistration() {
  const std::vector<KernelFingerprint> fingerprints = KernelFingerprints();
  return {CombinedFingerprint(fingerprints, "attention"), CombinedFingerprint(fingerprints, "")};
}

std::vector<KernelFingerprint> KernelFingerprints() {
  std::vector<KernelFingerprint> out;
  AddGemm(out, 1, 67, 129, false, false, 1);
  AddGemm(out, 7, 33, 64, true, false, 2);
  AddGemm(out, 33, 160, 257, true, true, 3);

  AddAttention(out, 8, 8, 64, KvDType::kBF16, 1.0f, 11);
  AddAttention(out, 8, 2, 128, KvDType::kBF16, 1.0f, 12);
  AddAttention(out, 4, 1, 64, KvDType::kF16, 1.0f, 13);
  AddAttention(out, 16, 2, 80, KvDType::kF16, 1.0f, 14);
  AddAttention(out, 4, 4, 64, KvDType::kBF16, 8.0f, 15);  // peaked softmax: exp's far tail
  // Groups that the slot-order kernel's q.k (4 heads at a time) and p.v (2 at dim 128, 4 at
  // dim 64 on AVX-512) split unevenly.
  AddAttention(out, 14, 2, 128, KvDType::kBF16, 1.0f, 16);
  AddAttention(out, 6, 2, 64, KvDType::kF16, 1.0f, 17);

  {
    Numbers rng(21);
    const int rows = 5, dim = 203;
    const std::vector<float> x = rng.Floats(rows * dim, 40.0f), w = rng.Floats(dim, 2.0f);
    std::vector<uint16_t> y(rows * dim);
    RmsNorm(rows, dim, x.data(), w.data(), 1e-5f, y.data());
    out.push_back({"rmsnorm rows=5 dim=203", HashOf(y)});
  }
  {
    Numbers rng(22);
    const int rows = 3, ffn = 333;
    const std::vector<float> gate_up = rng.Floats(rows * 2 * ffn, 20.0f);
    std::vector<uint16_t> y(rows * ffn);
    SiluMul(rows, ffn, gate_up.data(), y.data());
    out.push_back({"silu_mul rows=3 ffn=333", HashOf(y)});
  }
  {
    Numbers rng(23);
    const int rows = 4, heads = 3, dim = 64, positions_max = 4096;
    const int64_t stride = heads * dim + 8;
    // Tables of unit rotations, made without libm's sin and cos (sqrt rounds exactly).
    std::vector<float> cos_table(positions_max * dim / 2), sin_table(cos_table.size());
    for (size_t i = 0; i < cos_table.size(); ++i) {
      cos_table[i] = rng.Uniform(1.0f);
      sin_table[i] = std::sqrt(1.0f - cos_table[i] * cos_table[i]);
    }
    const std::vector<int32_t> positions = {0, 5, 1000, positions_max - 1};
    std::vector<float> x = rng.Floats(rows * stride, 4.0f);
    ApplyRope(rows, heads, dim, stride, positions.data(), cos_table.data(), sin_table.data(),
              x.data());
    out.push_back({"rope rows=4 heads=3 dim=64", HashOf(x)});
  }
  {
    Numbers rng(24);
    const int64_t n = 32003;
    std::vector<float> x = rng.Floats(n, 20.0f), y(n);
    const double sum = ExpShifted(n, x.data(), 20.0f, 1.3f, y.data());
    out.push_back({"exp_shifted n=32003", FingerprintBytes(&sum, sizeof(sum), HashOf(y))});
  }
  {
    Numbers rng(25);
    std::vector<int64_t> answers;
    for (int64_t n : {1, 15, 16, 17, 1000, 32003}) {
      std::vector<float> x(n);
      // Few distinct values, so ties decide many answers.
      for (float& e : x) e = static_cast<float>(rng.Next() % 7);
      answers.push_back(Argmax(n, x.data()));
      x[n / 2] = std::nanf("");
      answers.push_back(Argmax(n, x.data()));
    }
    out.push_back({"argmax", HashOf(answers)});
  }
  {
    Numbers rng(26);
    std::vector<float> x = rng.Floats(1001, 1.0f);
    for (size_t i = 0; i < x.size(); i += 3) x[i] *= 1e30f;
    // Subnormals from bit patterns: arithmetic on this thread may flush them (a kernel's
    // parallel region sets flush-to-zero on the threads it runs on).
    for (size_t i = 1; i < x.size(); i += 3) {
      const uint32_t bits = static_cast<uint32_t>(rng.Next() & 0x807fffffULL);
      std::memcpy(&x[i], &bits, sizeof(bits));
    }
    std::vector<uint16_t> y(x.size());
    ConvertToBf16(static_cast<int64_t>(x.size()), x.data(), y.data());
    out.push_back({"convert_bf16 n=1001", HashOf(y)});
  }
  {
    // Keys moved to new positions (context truncation), which memory nodes run: named
    // "attention ..." so that memory nodes report it.
    Numbers rng(27);
    const int num_rows = 3, heads = 4, dim = 64;
    std::vector<float> cos_shift(dim / 2), sin_shift(dim / 2);
    for (int i = 0; i < dim / 2; ++i) {
      cos_shift[i] = rng.Uniform(1.0f);
      sin_shift[i] = -std::sqrt(1.0f - cos_shift[i] * cos_shift[i]);
    }
    for (const KvDType dtype : {KvDType::kBF16, KvDType::kF16}) {
      std::vector<uint16_t> keys(static_cast<size_t>(num_rows) * heads * dim);
      for (uint16_t& e : keys) {
        const float value = rng.Uniform(4.0f);
        e = dtype == KvDType::kBF16 ? FloatToBf16(value) : FloatToF16(value);
      }
      ShiftRope(num_rows, heads, dim, dtype, cos_shift.data(), sin_shift.data(), keys.data(),
                keys.data());
      out.push_back({std::string("attention rope_shift ") + EnumNameOf(dtype, kKvDTypeNames) +
                         " rows=3 heads=4 dim=64",
                     HashOf(keys)});
    }
  }
  return out;
}

}  // namespace strata::kernels
