// CPU attention over a token-granular KV cache: the operator that memory nodes (and the
// compute node in co-located mode) run for every layer.
//
// Canonical computation. For one query row at absolute position p and one head, the KV
// positions [0, p] are cut into fixed tiles of kAttentionTileTokens absolute positions.
// Each tile yields its own softmax state (max m_t, sum l_t, unnormalised acc_t). The
// row's state is the left fold of the tile states in ascending tile order, starting from
// the empty state. Decode, chunked prefill, splitting the tiles over threads ("split-K":
// tile states computed in parallel, then folded in order) and splitting them between a
// memory node (the cached prefix) and a compute node (the rest) therefore all perform the
// same arithmetic, and their results are bit-identical. See docs/architecture.md,
// "Determinism". Results do depend on the instruction set: all nodes of one deployment
// must run the same path (kernels/cpu/isa.h).
//
// Memory layout. One layer of the KV cache is two arrays, K and V, each
// [num_slots][num_kv_heads][head_dim] of bf16 or f16. Each query row names the slot of
// every absolute position it attends through `slots` (slots[pos]).
//
// State layout. A state buffer holds, per (row, head), head_dim + 2 floats:
// acc[0..head_dim), then m, then l. AttentionStateInit makes the empty state.
//
// Threading: the functions use the calling thread's OpenMP team (omp_get_max_threads())
// and are safe to call concurrently on disjoint outputs.
#ifndef STRATA_KERNELS_CPU_ATTENTION_H_
#define STRATA_KERNELS_CPU_ATTENTION_H_

#include <cstdint>

#include "common/model/kv_dtype.h"

namespace strata::kernels {

inline constexpr int kAttentionTileTokens = 64;

// The KV cache's element types and their names (common/model/kv_dtype.h).
using ::strata::kKvDTypeNames;
using ::strata::KvDType;

struct AttentionParams {
  int num_heads = 0;     // query heads
  int num_kv_heads = 0;  // divides num_heads (GQA)
  int head_dim = 0;      // multiple of 16, at most 256
  float scale = 0.0f;    // usually 1/sqrt(head_dim)
  KvDType kv_dtype = KvDType::kBF16;
};

// The work of one query row.
struct AttentionRow {
  const int32_t* slots = nullptr;  // slots[pos]: KV slot of absolute position pos
  int32_t kv_end = 0;              // causal limit: positions [0, kv_end) may be attended
  int32_t tile_begin = 0;          // fold tiles [tile_begin, tile_end)
  int32_t tile_end = 0;
};

// Number of tiles that cover positions [0, kv_end).
inline int32_t AttentionNumTiles(int32_t kv_end) {
  return (kv_end + kAttentionTileTokens - 1) / kAttentionTileTokens;
}

// Error codes (0 = success).
enum AttentionError : int {
  kAttentionOk = 0,
  kAttentionBadShape = 1,  // head_dim / heads / kv heads out of range
  kAttentionBadRow = 2,    // a row's tile range or kv_end is inconsistent
};

// Sets `num_rows * num_heads` states to the empty state.
void AttentionStateInit(const AttentionParams& params, int num_rows, float* state);

// Folds tiles [row.tile_begin, row.tile_end) of every row into its state, in place.
//   q:       [num_rows][num_heads][head_dim] bf16
//   k_cache: [num_slots][num_kv_heads][head_dim] (params.kv_dtype)
//   v_cache: same as k_cache
//   state:   [num_rows][num_heads][head_dim + 2] f32
int AttentionFold(const AttentionParams& params, int num_rows, const uint16_t* q,
                  const AttentionRow* rows, const void* k_cache, const void* v_cache, float* state);

// AttentionFold through the head-by-head walk that serves the head sizes without a kernel
// of their own, whatever the head size: 64, 80, 96, 128 and 256 have kernels that read the cache
// slot by slot and must give the walk's bits. For tests.
int AttentionFoldByHeadForTest(const AttentionParams& params, int num_rows, const uint16_t* q,
                               const AttentionRow* rows, const void* k_cache, const void* v_cache,
                               float* state);

// out[r][h][:] = bf16(acc / l).   out: [num_rows][num_heads][head_dim] bf16
void AttentionFinish(const AttentionParams& params, int num_rows, const float* state,
                     uint16_t* out);

// Merges `src` into `dst` as if src's tiles followed dst's (dst then src, in order).
// Both [num_rows][num_heads][head_dim + 2].
void AttentionMergeStates(const AttentionParams& params, int num_rows, const float* src,
                          float* dst);

// Full causal attention of each row over [0, rows[r].kv_end): init, fold all tiles,
// finish. The rows' tile ranges are ignored. `scratch_state` must hold
// num_rows * num_heads * (head_dim + 2) floats.
int Attention(const AttentionParams& params, int num_rows, const uint16_t* q,
              const AttentionRow* rows, const void* k_cache, const void* v_cache,
              float* scratch_state, uint16_t* out);

}  // namespace strata::kernels

#endif  // STRATA_KERNELS_CPU_ATTENTION_H_
