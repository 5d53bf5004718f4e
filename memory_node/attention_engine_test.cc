#include "memory_node/attention_engine.h"

#include <cmath>
#include <cstring>
#include <random>

#include "common/base/bfloat16.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

constexpr int kLayers = 2, kHeads = 4, kKvHeads = 2, kDim = 64;
constexpr int kQRow = kHeads * kDim, kKvRow = kKvHeads * kDim;

std::unique_ptr<AttentionEngine> MakeEngine(int64_t slots = 4096) {
  AttentionEngineConfig config;
  config.store = {kLayers, kKvHeads, kDim, kernels::KvDType::kBF16, slots, false};
  config.num_heads = kHeads;
  auto engine = AttentionEngine::Create(config);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return std::move(*engine);
}

std::vector<uint16_t> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<uint16_t> out(n);
  for (auto& x : out) x = FloatToBf16(normal(rng));
  return out;
}

// Request r's table: `length` slots spread over the store (token-granular, not contiguous).
std::vector<int32_t> Slots(int request, int length) {
  std::vector<int32_t> slots(length);
  for (int i = 0; i < length; ++i) slots[i] = (i * 37 + request * 11) % 4096;
  return slots;
}

// Positions [0, n) of request r already in the cache (written through the engine).
void Fill(AttentionEngine& engine, uint64_t request, int n, uint32_t seed) {
  StepKvPlan plan;
  plan.step_id = 1000 + request;
  plan.assignments.push_back({SequenceId(request), PoolIndex(0), 0, Slots(request, n)});
  for (int p = 0; p < n; ++p)
    plan.rows.push_back({SequenceId(request), PoolIndex(0), p, 0});  // write only
  auto step = engine.Prepare(plan);
  ASSERT_TRUE(step.ok()) << step.status();
  for (int layer = 0; layer < kLayers; ++layer) {
    const auto k = Random(n * kKvRow, seed + layer), v = Random(n * kKvRow, seed + 7 + layer);
    ASSERT_TRUE(
        engine.AttendRows(*step, layer, 0, n, nullptr, k.data(), v.data(), nullptr, nullptr).ok());
  }
}

TEST(AttentionEngine, BadPlansChangeNothing) {
  auto engine = MakeEngine();
  Fill(*engine, 1, 10, 1);
  const int64_t before = engine->num_assigned_positions();
  StepKvPlan bad;
  bad.rows.push_back({SequenceId(1), PoolIndex(0), 10, -1});  // beyond the 10 assigned slots
  EXPECT_EQ(engine->Prepare(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = {};
  bad.assignments.push_back({SequenceId(1), PoolIndex(0), 10, {4096}});  // outside the store
  bad.rows.push_back({SequenceId(1), PoolIndex(0), 10, -1});
  EXPECT_FALSE(engine->Prepare(bad).ok());
  bad = {};
  // A table longer than the store has slots (a slot repeated): no plan's.
  bad.assignments.push_back(
      {SequenceId(3), PoolIndex(0), 0, std::vector<int32_t>(engine->store().num_slots() + 1, 0)});
  EXPECT_EQ(engine->Prepare(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = {};
  bad.assignments.push_back({SequenceId(2), PoolIndex(0), 3, {5}});  // starts past an empty table
  EXPECT_FALSE(engine->Prepare(bad).ok());
  bad = {};
  bad.rows.push_back({SequenceId(99), PoolIndex(0), 0, -1});  // unknown request
  EXPECT_FALSE(engine->Prepare(bad).ok());
  bad = {};
  bad.releases.push_back({SequenceId(1), PoolIndex(0)});
  bad.rows.push_back({SequenceId(1), PoolIndex(0), 0, -1});  // released in the same plan
  EXPECT_FALSE(engine->Prepare(bad).ok());
  bad = {};
  bad.rows.push_back({SequenceId(1), PoolIndex(0), 3, -2});
  EXPECT_FALSE(engine->Prepare(bad).ok());
  EXPECT_EQ(engine->num_assigned_positions(), before);
  EXPECT_EQ(engine->num_tables(), 1u);
  StepKvPlan good;
  good.rows.push_back({SequenceId(1), PoolIndex(0), 9, -1});
  EXPECT_TRUE(engine->Prepare(good).ok());
}

// Context truncation: an assignment's shift fills positions of the new table with the KV
// of other slots, K rotated by the given angles (checked against a double-precision
// rotation) and V as it was; bad shifts change nothing.
TEST(AttentionEngine, ShiftsCopyKvAndRotateK) {
  auto engine = MakeEngine();
  Fill(*engine, 1, 40, 5);
  const std::vector<int32_t> source = Slots(1, 40);
  KvShift shift;
  shift.position = 4;
  shift.shift = -16;
  shift.from.assign(source.begin() + 20, source.begin() + 36);
  for (int i = 0; i < kDim / 2; ++i) {
    const double angle = -16.0 * std::pow(10000.0, -2.0 * i / kDim);
    shift.cos.push_back(static_cast<float>(std::cos(angle)));
    shift.sin.push_back(static_cast<float>(std::sin(angle)));
  }
  std::vector<int32_t> fresh(24);
  for (int i = 0; i < 24; ++i) fresh[i] = 3000 + i;
  SlotAssignment a{SequenceId(2), PoolIndex(0), 0, fresh, {shift}};

  // Bad shifts: beyond the assignment, too few angles, a source outside the store.
  for (int bad = 0; bad < 3; ++bad) {
    SlotAssignment b = a;
    if (bad == 0) b.shifts[0].position = 10;  // 10 + 16 > 24
    if (bad == 1) b.shifts[0].cos.pop_back();
    if (bad == 2) b.shifts[0].from[3] = 4096;
    StepKvPlan plan;
    plan.assignments.push_back(b);
    EXPECT_EQ(engine->Prepare(plan).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(engine->num_tables(), 1u);
  EXPECT_EQ(engine->shifted_positions(), 0);

  StepKvPlan plan;
  plan.assignments.push_back(a);
  ASSERT_TRUE(engine->Prepare(plan).ok());
  EXPECT_EQ(engine->shifted_positions(), 16);
  const KvStore& store = engine->store();
  for (int layer = 0; layer < kLayers; ++layer) {
    for (int i = 0; i < 16; ++i) {
      const uint16_t* k_old = store.k(layer) + static_cast<int64_t>(shift.from[i]) * kKvRow;
      const uint16_t* k_new = store.k(layer) + static_cast<int64_t>(fresh[4 + i]) * kKvRow;
      EXPECT_EQ(
          std::memcmp(store.v(layer) + static_cast<int64_t>(fresh[4 + i]) * kKvRow,
                      store.v(layer) + static_cast<int64_t>(shift.from[i]) * kKvRow, kKvRow * 2),
          0)
          << "V of layer " << layer << " position " << i;
      for (int h = 0; h < kKvHeads; ++h) {
        for (int j = 0; j < kDim / 2; ++j) {
          const int x = h * kDim + j, y = x + kDim / 2;
          const double a0 = Bf16ToFloat(k_old[x]), b0 = Bf16ToFloat(k_old[y]);
          const double angle = -16.0 * std::pow(10000.0, -2.0 * j / kDim);
          const double tol = std::ldexp(std::hypot(a0, b0), -8) + 1e-6;
          EXPECT_NEAR(Bf16ToFloat(k_new[x]), a0 * std::cos(angle) - b0 * std::sin(angle), tol);
          EXPECT_NEAR(Bf16ToFloat(k_new[y]), b0 * std::cos(angle) + a0 * std::sin(angle), tol);
        }
      }
    }
  }
}

// A shift longer than the engine's batch of rows (1024) moves every row.
TEST(AttentionEngine, LongShiftsMoveEveryRow) {
  auto engine = MakeEngine();
  const int n = 1500;
  Fill(*engine, 1, n, 9);
  KvShift shift;
  shift.position = 0;
  shift.shift = -3;
  shift.from = Slots(1, n);
  shift.cos.assign(kDim / 2, 1.0f);  // the identity rotation: K is copied as it is
  shift.sin.assign(kDim / 2, 0.0f);
  // Fresh slots: those request 1 does not use.
  std::vector<bool> used(4096, false);
  for (int32_t s : shift.from) used[s] = true;
  std::vector<int32_t> fresh;
  for (int32_t s = 0; s < 4096 && static_cast<int>(fresh.size()) < n; ++s) {
    if (!used[s]) fresh.push_back(s);
  }
  ASSERT_EQ(static_cast<int>(fresh.size()), n);
  StepKvPlan plan;
  plan.assignments.push_back({SequenceId(2), PoolIndex(0), 0, fresh, {shift}});
  ASSERT_TRUE(engine->Prepare(plan).ok());
  const KvStore& store = engine->store();
  for (int layer = 0; layer < kLayers; ++layer) {
    for (int i : {0, 1023, 1024, n - 1}) {
      for (const uint16_t* base : {store.k(layer), store.v(layer)}) {
        EXPECT_EQ(std::memcmp(base + static_cast<int64_t>(fresh[i]) * kKvRow,
                              base + static_cast<int64_t>(shift.from[i]) * kKvRow, kKvRow * 2),
                  0)
            << "layer " << layer << " row " << i;
      }
    }
  }
}

TEST(AttentionEngine, FinalRowMatchesDoubleReference) {
  auto engine = MakeEngine();
  const int n = 150;  // three tiles, the last partial
  Fill(*engine, 1, n - 1, 3);
  StepKvPlan plan;
  plan.assignments.push_back({SequenceId(1), PoolIndex(0), n - 1, {Slots(1, n)[n - 1]}});
  plan.rows.push_back({SequenceId(1), PoolIndex(0), n - 1, -1});
  auto step = engine->Prepare(plan);
  ASSERT_TRUE(step.ok());
  const auto q = Random(kQRow, 5), k = Random(kKvRow, 6), v = Random(kKvRow, 7);
  std::vector<uint16_t> out(kQRow);
  ASSERT_TRUE(
      engine->AttendRows(*step, 1, 0, 1, q.data(), k.data(), v.data(), out.data(), nullptr).ok());
  // Reference over what the store holds (the new row included), in double.
  const KvStore& store = engine->store();
  const auto slots = Slots(1, n);
  for (int h = 0; h < kHeads; ++h) {
    const int kvh = h / (kHeads / kKvHeads);
    std::vector<double> scores(n);
    double mx = -1e300;
    for (int j = 0; j < n; ++j) {
      const uint16_t* kr = store.k(1) + (static_cast<size_t>(slots[j]) * kKvHeads + kvh) * kDim;
      double dot = 0;
      for (int d = 0; d < kDim; ++d) dot += Bf16ToFloat(q[h * kDim + d]) * Bf16ToFloat(kr[d]);
      scores[j] = dot / std::sqrt(static_cast<double>(kDim));
      mx = std::max(mx, scores[j]);
    }
    double sum = 0;
    for (double& s : scores) sum += (s = std::exp(s - mx));
    for (int d = 0; d < kDim; ++d) {
      double acc = 0;
      for (int j = 0; j < n; ++j) {
        const uint16_t* vr = store.v(1) + (static_cast<size_t>(slots[j]) * kKvHeads + kvh) * kDim;
        acc += scores[j] * Bf16ToFloat(vr[d]);
      }
      EXPECT_NEAR(Bf16ToFloat(out[h * kDim + d]), acc / sum, 2e-2) << h << " " << d;
    }
  }
  // The new row's k landed in its slot.
  EXPECT_EQ(
      std::memcmp(store.k(1) + static_cast<size_t>(slots[n - 1]) * kKvRow, k.data(), kKvRow * 2),
      0);
}

// A batch of decode rows of several requests plus a prefill chunk.
struct Batch {
  StepKvPlan plan;
  std::vector<uint16_t> q, k, v;
  int rows = 0;
};

Batch MakeBatch(AttentionEngine& engine, int32_t chunk_tile_limit) {
  Batch b;
  for (uint64_t r = 1; r <= 3; ++r) Fill(engine, r, 60 + 50 * r, 10 * r);
  for (uint64_t r = 1; r <= 3; ++r) {
    const int pos = 60 + 50 * r;
    b.plan.assignments.push_back({SequenceId(r), PoolIndex(0), pos, {Slots(r, pos + 1)[pos]}});
    b.plan.rows.push_back({SequenceId(r), PoolIndex(0), pos, -1});
  }
  // Request 4: cached prefix of 100 positions, a chunk of 90 positions [100, 190).
  Fill(engine, 4, 100, 40);
  const auto slots = Slots(4, 190);
  b.plan.assignments.push_back(
      {SequenceId(4), PoolIndex(0), 100, {slots.begin() + 100, slots.end()}});
  for (int p = 100; p < 190; ++p) {
    // Rows whose tiles all lie below the limit are final either way.
    const bool within = kernels::AttentionNumTiles(p + 1) <= chunk_tile_limit;
    b.plan.rows.push_back(
        {SequenceId(4), PoolIndex(0), p, chunk_tile_limit < 0 || within ? -1 : chunk_tile_limit});
  }
  b.rows = static_cast<int>(b.plan.rows.size());
  b.q = Random(b.rows * kQRow, 77);
  b.k = Random(b.rows * kKvRow, 78);
  b.v = Random(b.rows * kKvRow, 79);
  return b;
}

TEST(AttentionEngine, MiniBatchesGiveTheSameBitsAsOneBatch) {
  auto whole = MakeEngine();
  Batch a = MakeBatch(*whole, -1);
  auto step = whole->Prepare(a.plan);
  ASSERT_TRUE(step.ok());
  std::vector<uint16_t> want(a.rows * kQRow);
  ASSERT_TRUE(whole
                  ->AttendRows(*step, 0, 0, a.rows, a.q.data(), a.k.data(), a.v.data(), want.data(),
                               nullptr)
                  .ok());
  auto split = MakeEngine();
  Batch b = MakeBatch(*split, -1);
  auto step_b = split->Prepare(b.plan);
  ASSERT_TRUE(step_b.ok());
  std::vector<uint16_t> got(b.rows * kQRow);
  for (int begin = 0; begin < b.rows; begin += 13) {
    const int end = std::min(b.rows, begin + 13);
    ASSERT_TRUE(split
                    ->AttendRows(*step_b, 0, begin, end, b.q.data() + begin * kQRow,
                                 b.k.data() + begin * kKvRow, b.v.data() + begin * kKvRow,
                                 got.data() + begin * kQRow, nullptr)
                    .ok());
  }
  EXPECT_EQ(got, want);
}

TEST(AttentionEngine, PartialStatesContinuedElsewhereGiveTheSameBits) {
  // Reference: every row final.
  auto full = MakeEngine();
  Batch a = MakeBatch(*full, -1);
  auto step = full->Prepare(a.plan);
  ASSERT_TRUE(step.ok());
  std::vector<uint16_t> want(a.rows * kQRow);
  ASSERT_TRUE(full->AttendRows(*step, 0, 0, a.rows, a.q.data(), a.k.data(), a.v.data(), want.data(),
                               nullptr)
                  .ok());
  // Split: the chunk's rows fold tiles [0, 2) here (the cached prefix and the chunk's share
  // of tile 1) and the rest from the chunk's own k/v, as a compute node does.
  const int limit = 2;
  auto memory = MakeEngine();
  Batch b = MakeBatch(*memory, limit);
  auto prepared = memory->Prepare(b.plan);
  ASSERT_TRUE(prepared.ok());
  const int finals = prepared->CountKind(0, b.rows, RowKind::kFinal);
  const int partials = prepared->CountKind(0, b.rows, RowKind::kPartial);
  ASSERT_GT(partials, 0);
  std::vector<uint16_t> out(finals * kQRow);
  const kernels::AttentionParams& p = memory->params();
  std::vector<float> states(partials * kHeads * (kDim + 2));
  ASSERT_TRUE(memory
                  ->AttendRows(*prepared, 0, 0, b.rows, b.q.data(), b.k.data(), b.v.data(),
                               out.data(), states.data())
                  .ok());
  // Continue the partial rows over tiles [limit, end) from the batch's own k/v rows.
  const int first_chunk_row = 3;
  std::vector<int32_t> local_slots(190, 0);
  for (int pos = 100; pos < 190; ++pos) local_slots[pos] = first_chunk_row + (pos - 100);
  std::vector<kernels::AttentionRow> rows;
  std::vector<uint16_t> q_partial;
  std::vector<int> partial_rows, final_rows;
  for (int i = 0; i < b.rows; ++i) {
    if (prepared->kind(i) == RowKind::kFinal) final_rows.push_back(i);
    if (prepared->kind(i) != RowKind::kPartial) continue;
    partial_rows.push_back(i);
    kernels::AttentionRow row;
    row.slots = local_slots.data();
    row.kv_end = b.plan.rows[i].position + 1;
    row.tile_begin = limit;
    row.tile_end = kernels::AttentionNumTiles(row.kv_end);
    rows.push_back(row);
    q_partial.insert(q_partial.end(), b.q.begin() + i * kQRow, b.q.begin() + (i + 1) * kQRow);
  }
  ASSERT_EQ(kernels::AttentionFold(p, partials, q_partial.data(), rows.data(), b.k.data(),
                                   b.v.data(), states.data()),
            0);
  std::vector<uint16_t> tail(partials * kQRow);
  kernels::AttentionFinish(p, partials, states.data(), tail.data());
  std::vector<uint16_t> got(b.rows * kQRow);
  for (int i = 0; i < finals; ++i) {
    std::copy_n(out.begin() + i * kQRow, kQRow, got.begin() + final_rows[i] * kQRow);
  }
  for (int i = 0; i < partials; ++i) {
    std::copy_n(tail.begin() + i * kQRow, kQRow, got.begin() + partial_rows[i] * kQRow);
  }
  EXPECT_EQ(got, want);
}

TEST(AttentionEngine, AStepKeepsItsTablesWhenAnotherStepChangesThem) {
  auto engine = MakeEngine();
  Fill(*engine, 1, 100, 5);
  StepKvPlan plan;
  plan.rows.push_back({SequenceId(1), PoolIndex(0), 99, -1});
  auto first = engine->Prepare(plan);
  ASSERT_TRUE(first.ok());
  const auto q = Random(kQRow, 1), k = Random(kKvRow, 2), v = Random(kKvRow, 3);
  std::vector<uint16_t> before(kQRow), after(kQRow);
  ASSERT_TRUE(
      engine->AttendRows(*first, 0, 0, 1, q.data(), k.data(), v.data(), before.data(), nullptr)
          .ok());
  // Another step truncates request 1's table and moves its tail elsewhere.
  StepKvPlan other;
  std::vector<int32_t> moved(50);
  for (int i = 0; i < 50; ++i) moved[i] = 3000 + i;
  other.assignments.push_back({SequenceId(1), PoolIndex(0), 50, moved});
  ASSERT_TRUE(engine->Prepare(other).ok());
  // The first step still reads the slots it resolved.
  ASSERT_TRUE(
      engine->AttendRows(*first, 0, 0, 1, q.data(), k.data(), v.data(), after.data(), nullptr)
          .ok());
  EXPECT_EQ(before, after);
}

TEST(AttentionEngine, RejectsBadRowRangesAndLayers) {
  auto engine = MakeEngine();
  Fill(*engine, 1, 4, 1);
  StepKvPlan plan;
  plan.rows.push_back({SequenceId(1), PoolIndex(0), 3, -1});
  auto step = engine->Prepare(plan);
  ASSERT_TRUE(step.ok());
  std::vector<uint16_t> q(kQRow), k(kKvRow), v(kKvRow), out(kQRow);
  EXPECT_FALSE(
      engine->AttendRows(*step, kLayers, 0, 1, q.data(), k.data(), v.data(), out.data(), nullptr)
          .ok());
  EXPECT_FALSE(
      engine->AttendRows(*step, 0, 0, 2, q.data(), k.data(), v.data(), out.data(), nullptr).ok());
}

}  // namespace
}  // namespace strata
