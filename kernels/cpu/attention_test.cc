#include "kernels/cpu/attention.h"

#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "common/base/bfloat16.h"
#include "gtest/gtest.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa.h"

namespace strata::kernels {
namespace {

// A KV cache of one layer with scattered slots, and queries.
struct Problem {
  AttentionParams p;
  int num_slots = 0;
  std::vector<uint16_t> k, v;  // [num_slots][kv_heads][dim]
  std::vector<uint16_t> q;     // [rows][heads][dim]
  std::vector<std::vector<int32_t>> slots;
  std::vector<AttentionRow> rows;

  float KvAt(const std::vector<uint16_t>& cache, int slot, int kvh, int i) const {
    const uint16_t raw = cache[(static_cast<size_t>(slot) * p.num_kv_heads + kvh) * p.head_dim + i];
    return p.kv_dtype == KvDType::kBF16 ? Bf16ToFloat(raw) : F16ToFloat(raw);
  }
};

Problem MakeProblem(int heads, int kv_heads, int dim, std::vector<int> kv_ends, KvDType dtype,
                    uint32_t seed) {
  Problem pr;
  pr.p = {heads, kv_heads, dim, 1.0f / std::sqrt(static_cast<float>(dim)), dtype};
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  int max_len = 0;
  for (int e : kv_ends) max_len = std::max(max_len, e);
  pr.num_slots = max_len * static_cast<int>(kv_ends.size()) + 7;
  auto encode = [&](float x) { return dtype == KvDType::kBF16 ? FloatToBf16(x) : FloatToF16(x); };
  pr.k.resize(static_cast<size_t>(pr.num_slots) * kv_heads * dim);
  pr.v.resize(pr.k.size());
  // Keys get a large spread so the softmax is peaky in places, exercising the max shift.
  for (auto& x : pr.k) x = encode(2.0f * normal(rng));
  for (auto& x : pr.v) x = encode(normal(rng));
  pr.q.resize(kv_ends.size() * heads * dim);
  for (auto& x : pr.q) x = FloatToBf16(normal(rng));
  // Each row gets a random permutation of slots: token-granular, scattered.
  std::vector<int32_t> all(pr.num_slots);
  for (int i = 0; i < pr.num_slots; ++i) all[i] = i;
  for (size_t r = 0; r < kv_ends.size(); ++r) {
    std::shuffle(all.begin(), all.end(), rng);
    pr.slots.emplace_back(all.begin(), all.begin() + kv_ends[r]);
  }
  for (size_t r = 0; r < kv_ends.size(); ++r) {
    AttentionRow row;
    row.slots = pr.slots[r].data();
    row.kv_end = kv_ends[r];
    row.tile_begin = 0;
    row.tile_end = AttentionNumTiles(kv_ends[r]);
    pr.rows.push_back(row);
  }
  return pr;
}

// Independent reference: plain softmax attention in double precision.
std::vector<double> Reference(const Problem& pr) {
  const AttentionParams& p = pr.p;
  const int group = p.num_heads / p.num_kv_heads;
  std::vector<double> out(pr.q.size());
  for (size_t r = 0; r < pr.rows.size(); ++r) {
    for (int h = 0; h < p.num_heads; ++h) {
      const int kvh = h / group;
      const uint16_t* q = pr.q.data() + (r * p.num_heads + h) * p.head_dim;
      std::vector<double> scores(pr.rows[r].kv_end);
      double max_score = -1e300;
      for (int j = 0; j < pr.rows[r].kv_end; ++j) {
        double dot = 0;
        for (int i = 0; i < p.head_dim; ++i) {
          dot += Bf16ToFloat(q[i]) * pr.KvAt(pr.k, pr.slots[r][j], kvh, i);
        }
        scores[j] = dot * p.scale;
        max_score = std::max(max_score, scores[j]);
      }
      double sum = 0;
      for (double& s : scores) sum += (s = std::exp(s - max_score));
      for (int i = 0; i < p.head_dim; ++i) {
        double acc = 0;
        for (int j = 0; j < pr.rows[r].kv_end; ++j) {
          acc += scores[j] * pr.KvAt(pr.v, pr.slots[r][j], kvh, i);
        }
        out[(r * p.num_heads + h) * p.head_dim + i] = acc / sum;
      }
    }
  }
  return out;
}

std::vector<uint16_t> RunFull(const Problem& pr) {
  const size_t n = pr.rows.size();
  std::vector<float> state(n * pr.p.num_heads * (pr.p.head_dim + 2));
  std::vector<uint16_t> out(n * pr.p.num_heads * pr.p.head_dim);
  EXPECT_EQ(Attention(pr.p, n, pr.q.data(), pr.rows.data(), pr.k.data(), pr.v.data(), state.data(),
                      out.data()),
            kAttentionOk);
  return out;
}

std::vector<CpuIsa> SupportedIsas() {
  std::vector<CpuIsa> isas;
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16}) {
    if (CpuSupports(isa)) isas.push_back(isa);
  }
  return isas;
}

class AttentionIsaTest : public ::testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override {
    saved_ = ActiveCpuIsa();
    ASSERT_TRUE(ForceCpuIsa(GetParam()));
  }
  void TearDown() override { ForceCpuIsa(saved_); }
  CpuIsa saved_;
};

struct Shape {
  int heads, kv_heads, dim;
  KvDType dtype;
};

TEST_P(AttentionIsaTest, MatchesDoublePrecisionReference) {
  const std::vector<Shape> shapes = {
      {4, 4, 64, KvDType::kBF16},
      {8, 2, 64, KvDType::kBF16},
      {8, 1, 128, KvDType::kBF16},
      {4, 2, 128, KvDType::kF16},
      {2, 2, 80, KvDType::kBF16},
      {4, 1, 256, KvDType::kF16},
      {16, 2, 64, KvDType::kF16},
      // Groups the slot-order kernel splits unevenly (its q.k takes 4 heads at a time).
      {6, 2, 64, KvDType::kBF16},
      {14, 2, 128, KvDType::kF16},
  };
  uint32_t seed = 1;
  for (const Shape& s : shapes) {
    Problem pr =
        MakeProblem(s.heads, s.kv_heads, s.dim, {1, 5, 63, 64, 65, 200, 517}, s.dtype, seed++);
    const std::vector<uint16_t> got = RunFull(pr);
    const std::vector<double> want = Reference(pr);
    double max_err = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      max_err = std::max(max_err, std::abs(Bf16ToFloat(got[i]) - want[i]));
    }
    // Outputs are averages of N(0,1) values stored as bf16: 2^-8 relative rounding, plus
    // float accumulation.
    EXPECT_LT(max_err, 1.5e-2) << "heads=" << s.heads << " kv=" << s.kv_heads << " dim=" << s.dim
                               << " isa=" << CpuIsaName(GetParam());
  }
}

TEST_P(AttentionIsaTest, RowAloneEqualsRowInBatch) {
  Problem batch = MakeProblem(8, 2, 64, {3, 70, 129, 300, 64, 1, 257}, KvDType::kBF16, 11);
  const std::vector<uint16_t> all = RunFull(batch);
  const size_t row_elems = 8 * 64;
  for (size_t r = 0; r < batch.rows.size(); ++r) {
    Problem single = batch;
    single.rows = {batch.rows[r]};
    single.q.assign(batch.q.begin() + r * row_elems, batch.q.begin() + (r + 1) * row_elems);
    const std::vector<uint16_t> alone = RunFull(single);
    ASSERT_EQ(std::memcmp(alone.data(), all.data() + r * row_elems, row_elems * 2), 0)
        << "row " << r;
  }
}

// The memory node folds the cached prefix's tiles; the compute node continues the same
// state with the rest. The result must equal one uninterrupted fold.
TEST_P(AttentionIsaTest, ContinuedFoldEqualsWholeFold) {
  for (int kv_end : {65, 128, 300, 1000}) {
    Problem pr = MakeProblem(4, 2, 128, {kv_end}, KvDType::kBF16, kv_end);
    const std::vector<uint16_t> whole = RunFull(pr);
    const int tiles = AttentionNumTiles(kv_end);
    for (int split = 0; split <= tiles; ++split) {
      std::vector<float> state(4 * 130);
      AttentionStateInit(pr.p, 1, state.data());
      AttentionRow first = pr.rows[0];
      first.tile_begin = 0;
      first.tile_end = split;
      ASSERT_EQ(AttentionFold(pr.p, 1, pr.q.data(), &first, pr.k.data(), pr.v.data(), state.data()),
                kAttentionOk);
      AttentionRow rest = pr.rows[0];
      rest.tile_begin = split;
      rest.tile_end = tiles;
      ASSERT_EQ(AttentionFold(pr.p, 1, pr.q.data(), &rest, pr.k.data(), pr.v.data(), state.data()),
                kAttentionOk);
      std::vector<uint16_t> out(4 * 128);
      AttentionFinish(pr.p, 1, state.data(), out.data());
      ASSERT_EQ(std::memcmp(out.data(), whole.data(), out.size() * 2), 0)
          << "kv_end=" << kv_end << " split after tile " << split;
    }
  }
}

// A prefill row at position p (kv_end = p + 1) and a decode of position p are the same
// computation: their outputs must be bit-identical even though the slot tables of the
// two rows differ beyond p.
TEST_P(AttentionIsaTest, PrefillRowEqualsDecodeAtSamePosition) {
  Problem pr = MakeProblem(4, 4, 64, {200}, KvDType::kBF16, 5);
  // Rows 0..199 of a prefill chunk: one query row per position, same q for comparison.
  Problem prefill = pr;
  prefill.rows.clear();
  prefill.q.clear();
  for (int pos = 0; pos < 200; ++pos) {
    AttentionRow row = pr.rows[0];
    row.kv_end = pos + 1;
    row.tile_end = AttentionNumTiles(pos + 1);
    prefill.rows.push_back(row);
    prefill.q.insert(prefill.q.end(), pr.q.begin(), pr.q.end());
  }
  const std::vector<uint16_t> chunk = RunFull(prefill);
  for (int pos : {0, 63, 64, 130, 199}) {
    Problem decode = pr;
    decode.rows[0].kv_end = pos + 1;
    const std::vector<uint16_t> one = RunFull(decode);
    ASSERT_EQ(std::memcmp(one.data(), chunk.data() + pos * 4 * 64, 4 * 64 * 2), 0) << pos;
  }
}

// The settings the kernels' bit comparisons run under: q.k of bf16 keys on vdpbf16ps and on
// FMAs (gemm.h, GemmWideKernel; AVX-512 BF16 only), one thread and two.
const std::vector<std::pair<GemmWideKernel, int>> kWideAndThreads = {{GemmWideKernel::kDot, 1},
                                                                     {GemmWideKernel::kDot, 2},
                                                                     {GemmWideKernel::kFma, 1},
                                                                     {GemmWideKernel::kFma, 2}};

// The rows of a prompt chunk (one slot table, consecutive positions) are folded in blocks,
// the tiles every row of a block reads whole for all of them at once. Each row must still
// get the bits it gets alone: MHA and GQA at head sizes 64, 80, 96, 128 and 256, bf16 and
// f16, a chunk from position 0 and one after a prefix, whole folds and
// folds from tile 1, one thread and two. Every row has its own query. Blocks of 4 heads a
// KV head and more take kLanes / 4 keys at a time (4 on AVX-512, on vdpbf16ps or on FMAs:
// ForceGemmWideKernel; 2 on AVX2), which single MHA rows never do.
TEST_P(AttentionIsaTest, PromptChunkRowsGetTheBitsOfEachRowAlone) {
  const std::vector<Shape> shapes = {{4, 4, 64, KvDType::kBF16},  {12, 12, 64, KvDType::kF16},
                                     {8, 2, 128, KvDType::kBF16}, {32, 4, 128, KvDType::kBF16},
                                     {12, 3, 96, KvDType::kBF16}, {8, 1, 256, KvDType::kBF16},
                                     {16, 2, 80, KvDType::kF16}};
  const int saved_threads = omp_get_max_threads();
  for (const Shape& sh : shapes) {
    for (int start : {0, 70}) {
      for (int first_tile : {0, 1}) {
        const int rows = 150;
        Problem pr = MakeProblem(sh.heads, sh.kv_heads, sh.dim, {start + rows}, sh.dtype,
                                 static_cast<uint32_t>(31 + start + sh.dim));
        const size_t row_q = static_cast<size_t>(sh.heads) * sh.dim;
        std::mt19937 rng(7);
        std::normal_distribution<float> normal(0.0f, 1.0f);
        std::vector<uint16_t> q(rows * row_q);
        for (auto& x : q) x = FloatToBf16(normal(rng));
        std::vector<AttentionRow> chunk;
        for (int i = 0; i < rows; ++i) {
          AttentionRow row = pr.rows[0];
          row.kv_end = start + i + 1;
          row.tile_begin = first_tile;
          row.tile_end = AttentionNumTiles(row.kv_end);
          chunk.push_back(row);
        }
        const size_t state_row = row_q + 2 * static_cast<size_t>(sh.heads);
        for (const auto& [wide, threads] : kWideAndThreads) {
          ForceGemmWideKernel(wide);
          omp_set_num_threads(threads);
          std::vector<float> together(rows * state_row);
          AttentionStateInit(pr.p, rows, together.data());
          ASSERT_EQ(AttentionFold(pr.p, rows, q.data(), chunk.data(), pr.k.data(), pr.v.data(),
                                  together.data()),
                    kAttentionOk);
          for (int i = 0; i < rows; ++i) {
            std::vector<float> alone(state_row);
            AttentionStateInit(pr.p, 1, alone.data());
            ASSERT_EQ(AttentionFold(pr.p, 1, q.data() + i * row_q, &chunk[i], pr.k.data(),
                                    pr.v.data(), alone.data()),
                      kAttentionOk);
            ASSERT_EQ(std::memcmp(alone.data(), together.data() + i * state_row,
                                  state_row * sizeof(float)),
                      0)
                << sh.heads << "/" << sh.kv_heads << " heads of " << sh.dim << ", start " << start
                << ", from tile " << first_tile << ", row " << i << ", " << threads
                << " thread(s), wide work on " << GemmWideKernelName(wide);
          }
        }
      }
    }
  }
  ForceGemmWideKernel(GemmWideKernel::kAuto);
  omp_set_num_threads(saved_threads);
}

// One long row takes the split-K path when threads outnumber (row, KV head) items; in a
// batch the same row takes the per-item path. Both must give the same bits, for any
// thread count.
TEST_P(AttentionIsaTest, SplitKAndThreadCountDoNotChangeBits) {
  Problem batch = MakeProblem(2, 1, 64, {2000, 10, 20, 30, 40, 50, 60, 70}, KvDType::kBF16, 3);
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::vector<uint16_t> reference = RunFull(batch);
  Problem single = batch;
  single.rows = {batch.rows[0]};
  single.q.resize(2 * 64);
  for (int threads : {1, 2, 3, 8}) {
    omp_set_num_threads(threads);
    const std::vector<uint16_t> alone = RunFull(single);  // split-K when threads > 1
    EXPECT_EQ(std::memcmp(alone.data(), reference.data(), alone.size() * 2), 0) << threads;
    const std::vector<uint16_t> in_batch = RunFull(batch);
    EXPECT_EQ(in_batch, reference) << threads;
  }
  omp_set_num_threads(saved_threads);
}

// The kernels of head sizes 64, 80, 96, 128 and 256 read the cache slot by slot, several query
// heads at once, and widen bf16 values their own way; each head's arithmetic must still be the
// head-by-head walk's, term for term, so the folded states are bit-identical to it. MHA and
// GQA, bf16 and f16, contexts that end mid-tile, scattered slots and slots in one run a
// row, one thread and two.
TEST_P(AttentionIsaTest, HeadSizeKernelsGiveTheBitsOfTheHeadByHeadWalk) {
  const std::vector<Shape> shapes = {{4, 4, 64, KvDType::kBF16},
                                     {8, 2, 64, KvDType::kBF16},
                                     {12, 12, 64, KvDType::kF16},
                                     {4, 1, 128, KvDType::kBF16},
                                     {6, 3, 128, KvDType::kF16},
                                     {16, 2, 64, KvDType::kBF16},
                                     // q.k's last 1 or 2 heads of a group apart from its
                                     // blocks of 4 (groups of 5 and 6).
                                     {10, 2, 128, KvDType::kBF16},
                                     {12, 2, 64, KvDType::kF16},
                                     // p.v passes over part of a head's value chunks (groups of
                                     // 7 and 10), and groups past one pass of heads (32).
                                     {28, 4, 128, KvDType::kBF16},
                                     {20, 2, 128, KvDType::kF16},
                                     {32, 1, 64, KvDType::kF16},
                                     // Head size 96: 6 value chunks on AVX-512 (passes of
                                     // 3 for 4 heads), 12 on AVX2; MHA, GQA, and groups
                                     // past one pass.
                                     {6, 6, 96, KvDType::kF16},
                                     {32, 8, 96, KvDType::kBF16},
                                     {20, 2, 96, KvDType::kBF16},
                                     // Head size 256: 16 value chunks on AVX-512 (one pass for
                                     // MHA), 32 on AVX2 (always passes); MQA's group of 8.
                                     {4, 4, 256, KvDType::kBF16},
                                     {8, 1, 256, KvDType::kF16},
                                     {16, 8, 256, KvDType::kBF16},
                                     // Head size 80: 2.5 bf16 pairs of 32 (q.k's last 16 as
                                     // half pairs), 5 value chunks on AVX-512 (passes of 3
                                     // and 2 for 4 heads), 10 on AVX2; runs that start
                                     // mid-line. MHA, GQA, MQA past one pass.
                                     {4, 4, 80, KvDType::kBF16},
                                     {5, 5, 80, KvDType::kF16},
                                     {16, 4, 80, KvDType::kBF16},
                                     {6, 2, 80, KvDType::kF16},
                                     {12, 1, 80, KvDType::kBF16}};
  const int saved_threads = omp_get_max_threads();
  for (const Shape& sh : shapes) {
    for (const bool runs : {false, true}) {
      Problem pr =
          MakeProblem(sh.heads, sh.kv_heads, sh.dim, {1, 63, 64, 65, 200, 333}, sh.dtype, 11);
      const size_t n = pr.rows.size();
      // Also each row's slots as one run (the ledger hands out whole tiles), which the kernels
      // walk one key at a time where scattered tiles take kLanes keys a step.
      size_t longest = 0;
      for (const auto& table : pr.slots) longest = std::max(longest, table.size());
      for (size_t r = 0; r < n && runs; ++r) {
        for (size_t i = 0; i < pr.slots[r].size(); ++i) {
          pr.slots[r][i] = static_cast<int32_t>(r * longest + i);
        }
      }
      for (const auto& [wide, threads] : kWideAndThreads) {
        ForceGemmWideKernel(wide);
        omp_set_num_threads(threads);
        std::vector<float> kernel(n * sh.heads * (sh.dim + 2)), walk(kernel.size());
        AttentionStateInit(pr.p, n, kernel.data());
        AttentionStateInit(pr.p, n, walk.data());
        ASSERT_EQ(AttentionFold(pr.p, n, pr.q.data(), pr.rows.data(), pr.k.data(), pr.v.data(),
                                kernel.data()),
                  kAttentionOk);
        ASSERT_EQ(AttentionFoldByHeadForTest(pr.p, n, pr.q.data(), pr.rows.data(), pr.k.data(),
                                             pr.v.data(), walk.data()),
                  kAttentionOk);
        EXPECT_EQ(std::memcmp(kernel.data(), walk.data(), kernel.size() * sizeof(float)), 0)
            << sh.heads << "/" << sh.kv_heads << " heads of " << sh.dim << ", "
            << (sh.dtype == KvDType::kBF16 ? "bf16" : "f16") << ", " << threads
            << " thread(s), wide work on " << GemmWideKernelName(wide)
            << (runs ? ", slots in runs" : ", scattered slots");
      }
    }
  }
  ForceGemmWideKernel(GemmWideKernel::kAuto);
  omp_set_num_threads(saved_threads);
}

INSTANTIATE_TEST_SUITE_P(AllIsas, AttentionIsaTest, ::testing::ValuesIn(SupportedIsas()),
                         [](const auto& info) { return CpuIsaName(info.param); });

TEST(Attention, MergeStatesOfDisjointTilesMatchesReference) {
  // Two partial states over disjoint key sets merge to the attention over their union.
  Problem pr = MakeProblem(2, 2, 64, {256}, KvDType::kBF16, 9);
  std::vector<float> a(2 * 66), b(2 * 66);
  AttentionStateInit(pr.p, 1, a.data());
  AttentionStateInit(pr.p, 1, b.data());
  AttentionRow row = pr.rows[0];
  row.tile_begin = 0;
  row.tile_end = 2;
  ASSERT_EQ(AttentionFold(pr.p, 1, pr.q.data(), &row, pr.k.data(), pr.v.data(), a.data()), 0);
  row.tile_begin = 2;
  row.tile_end = 4;
  ASSERT_EQ(AttentionFold(pr.p, 1, pr.q.data(), &row, pr.k.data(), pr.v.data(), b.data()), 0);
  AttentionMergeStates(pr.p, 1, b.data(), a.data());
  std::vector<uint16_t> out(2 * 64);
  AttentionFinish(pr.p, 1, a.data(), out.data());
  const std::vector<double> want = Reference(pr);
  for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(Bf16ToFloat(out[i]), want[i], 1.5e-2);
}

TEST(Attention, KvTypesGoByTheirNames) {
  for (KvDType dtype : {KvDType::kBF16, KvDType::kF16}) {
    KvDType parsed;
    std::string error;
    ASSERT_TRUE(ParseEnumName(EnumNameOf(dtype, kKvDTypeNames), kKvDTypeNames, &parsed, &error));
    EXPECT_EQ(parsed, dtype);
  }
  EXPECT_STREQ(EnumNameOf(KvDType::kBF16, kKvDTypeNames), "bf16");
  EXPECT_STREQ(EnumNameOf(KvDType::kF16, kKvDTypeNames), "f16");
  KvDType parsed;
  std::string error;
  EXPECT_FALSE(ParseEnumName("fp16", kKvDTypeNames, &parsed, &error));
  EXPECT_EQ(error, "\"fp16\" is not one of: bf16, f16");
}

TEST(Attention, RejectsBadShapesAndRows) {
  Problem pr = MakeProblem(4, 2, 64, {10}, KvDType::kBF16, 1);
  std::vector<float> state(4 * 66);
  std::vector<uint16_t> out(4 * 64);
  AttentionParams bad = pr.p;
  bad.num_kv_heads = 3;
  EXPECT_EQ(Attention(bad, 1, pr.q.data(), pr.rows.data(), pr.k.data(), pr.v.data(), state.data(),
                      out.data()),
            kAttentionBadShape);
  bad = pr.p;
  bad.head_dim = 72;
  EXPECT_EQ(Attention(bad, 1, pr.q.data(), pr.rows.data(), pr.k.data(), pr.v.data(), state.data(),
                      out.data()),
            kAttentionBadShape);
  AttentionRow row = pr.rows[0];
  row.tile_end = 5;  // beyond the tiles that cover kv_end = 10
  AttentionStateInit(pr.p, 1, state.data());
  EXPECT_EQ(AttentionFold(pr.p, 1, pr.q.data(), &row, pr.k.data(), pr.v.data(), state.data()),
            kAttentionBadRow);
}

}  // namespace
}  // namespace strata::kernels
