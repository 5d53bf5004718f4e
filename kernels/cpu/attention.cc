#include "kernels/cpu/attention.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/base/bfloat16.h"
#include "kernels/cpu/attention_fold.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/simd_ops.h"

namespace strata::kernels {
namespace isa_internal {

int AttentionFoldScalar(const AttentionParams& p, int num_rows, const uint16_t* q,
                        const AttentionRow* rows, const void* k, const void* v, float* state,
                        bool by_head, bool /*widened_dots: AVX-512 BF16 only*/) {
  return attention_internal::Fold<simd::ScalarOps>(p, num_rows, q, rows, k, v, state, by_head);
}

void AttentionMergeStatesScalar(const AttentionParams& p, int num_rows, const float* src,
                                float* dst) {
  attention_internal::MergeStates<simd::ScalarOps>(p, num_rows, src, dst);
}

}  // namespace isa_internal

namespace {

using namespace isa_internal;

bool ValidShape(const AttentionParams& p) {
  return p.num_heads > 0 && p.num_kv_heads > 0 && p.num_heads % p.num_kv_heads == 0 &&
         p.head_dim > 0 && p.head_dim % 16 == 0 && p.head_dim <= 256 &&
         (p.kv_dtype == KvDType::kBF16 || p.kv_dtype == KvDType::kF16);
}

// AttentionFold on the instruction set in use; `by_head`: through the head-by-head walk
// whatever the head size (attention_internal::Fold). On AVX-512 BF16, q.k of bf16 keys
// runs on FMAs where the tile kernel takes 4 keys x 4 heads if the GEMM's probe found FMAs
// the faster instruction for wide work (gemm.h, GemmWideKernel): the same bits either way.
int FoldOnActiveIsa(const AttentionParams& p, int num_rows, const uint16_t* q,
                    const AttentionRow* rows, const void* k_cache, const void* v_cache,
                    float* state, bool by_head) {
  if (!ValidShape(p)) return kAttentionBadShape;
  if (num_rows <= 0) return kAttentionOk;
  switch (ActiveCpuIsa()) {
    case CpuIsa::kAvx512Bf16:
      return AttentionFoldAvx512Bf16(p, num_rows, q, rows, k_cache, v_cache, state, by_head,
                                     ActiveGemmWideKernel() == GemmWideKernel::kFma);
    case CpuIsa::kAvx512:
      return AttentionFoldAvx512(p, num_rows, q, rows, k_cache, v_cache, state, by_head, false);
    case CpuIsa::kAvx2:
      return AttentionFoldAvx2(p, num_rows, q, rows, k_cache, v_cache, state, by_head, false);
    case CpuIsa::kScalar:
      break;
  }
  return AttentionFoldScalar(p, num_rows, q, rows, k_cache, v_cache, state, by_head, false);
}

}  // namespace
void AttentionStateInit(const AttentionParams& p, int num_rows, float* state) {
  const int d = p.head_dim;
  const size_t n = static_cast<size_t>(num_rows) * p.num_heads;
  for (size_t i = 0; i < n; ++i) {
    float* s = state + i * (d + 2);
    std::memset(s, 0, sizeof(float) * d);
    s[d] = -std::numeric_limits<float>::infinity();
    s[d + 1] = 0.0f;
  }
}

int AttentionFold(const AttentionParams& p, int num_rows, const uint16_t* q,
                  const AttentionRow* rows, const void* k_cache, const void* v_cache,
                  float* state) {
  return FoldOnActiveIsa(p, num_rows, q, rows, k_cache, v_cache, state, /*by_head=*/false);
}

int AttentionFoldByHeadForTest(const AttentionParams& p, int num_rows, const uint16_t* q,
                               const AttentionRow* rows, const void* k_cache, const void* v_cache,
                               float* state) {
  return FoldOnActiveIsa(p, num_rows, q, rows, k_cache, v_cache, state, /*by_head=*/true);
}

void AttentionMergeStates(const AttentionParams& p, int num_rows, const float* src, float* dst) {
  switch (ActiveCpuIsa()) {
    case CpuIsa::kAvx512Bf16:
      return AttentionMergeStatesAvx512Bf16(p, num_rows, src, dst);
    case CpuIsa::kAvx512:
      return AttentionMergeStatesAvx512(p, num_rows, src, dst);
    case CpuIsa::kAvx2:
      return AttentionMergeStatesAvx2(p, num_rows, src, dst);
    case CpuIsa::kScalar:
      break;
  }
  AttentionMergeStatesScalar(p, num_rows, src, dst);
}

void AttentionFinish(const AttentionParams& p, int num_rows, const float* state, uint16_t* out) {
  const int d = p.head_dim;
  const int n = num_rows * p.num_heads;
#pragma omp parallel for schedule(static) if (n >= 64)
  for (int i = 0; i < n; ++i) {
    const float* s = state + static_cast<size_t>(i) * (d + 2);
    uint16_t* o = out + static_cast<size_t>(i) * d;
    const float l = s[d + 1];
    for (int c = 0; c < d; ++c) o[c] = FloatToBf16(s[c] / l);
  }
}

int Attention(const AttentionParams& p, int num_rows, const uint16_t* q, const AttentionRow* rows,
              const void* k_cache, const void* v_cache, float* scratch_state, uint16_t* out) {
  if (!ValidShape(p)) return kAttentionBadShape;
  std::vector<AttentionRow> full(rows, rows + num_rows);
  for (AttentionRow& row : full) {
    if (row.kv_end <= 0) return kAttentionBadRow;
    row.tile_begin = 0;
    row.tile_end = AttentionNumTiles(row.kv_end);
  }
  AttentionStateInit(p, num_rows, scratch_state);
  const int status = AttentionFold(p, num_rows, q, full.data(), k_cache, v_cache, scratch_state);
  if (status != kAttentionOk) return status;
  AttentionFinish(p, num_rows, scratch_state, out);
  return kAttentionOk;
}

}  // namespace strata::kernels
