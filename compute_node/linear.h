// A linear layer y = x W^T (+ bias) on strata's own bf16 GEMM, or on oneDNN's bf16 matmul
// with f32 accumulation where STRATA_GEMM asks for it (UseOneDnnBf16).
//
// The weight is given in Hugging Face layout, [out_features, in_features] (one or more
// parts stacked along out_features, for fused QKV or gate/up projections), in F32, F16 or
// BF16. It is converted to bf16 and repacked once, at load, into the blocked layout
// oneDNN's brgemm kernels prefer; running straight on the [out, in] mapping was measured
// 3x slower.
//
// Rows are independent: row i of y depends only on row i of x, never on the batch size or
// on the thread count (tests check it). To keep primitive creation off the hot path, M is
// rounded up to a bucket (RowsCapacity) and the spare rows of x and y are computed too, so
// x and y must hold RowsCapacity(m) rows.
//
// Thread-safety: Forward may be called from several threads at once.
#ifndef STRATA_COMPUTE_NODE_LINEAR_H_
#define STRATA_COMPUTE_NODE_LINEAR_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/huge_pages.h"
#include "common/model/safetensors.h"
#include "dnnl.hpp"

namespace strata {

// Rows a buffer for m rows must hold: m rounded up to its bucket.
int64_t RowsCapacity(int64_t m);

class Linear {
 public:
  // `parts` are [out_i, in_features] weights stacked along out; `bias_parts`, if not
  // empty, are their [out_i] biases in the same order.
  // The packed weight goes into `arena` if given (which must outlive the layer), else into
  // memory of the layer's own (both on huge pages: common/base/huge_pages.h).
  static absl::StatusOr<std::unique_ptr<Linear>> Create(
      const std::vector<const TensorView*>& parts, const std::vector<const TensorView*>& bias_parts,
      int64_t in_features, StreamingArena* arena = nullptr);

  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  // Bytes of the repacked weight (for bandwidth accounting).
  size_t weight_bytes() const { return weight_bytes_; }

  // y[m][out] (f32) = x[m][in] (bf16) W^T + bias; with accumulate, y += x W^T instead.
  // x and y must hold RowsCapacity(m) rows.
  void Forward(int64_t m, const uint16_t* x, float* y, bool accumulate) const;

 private:
  // Shared primitives run concurrently (two step threads of one process, or a compute node
  // beside an in-process one in tests), so their scratchpad is the caller's, not oneDNN's
  // library-wide one: with that one, concurrent runs overwrote each other's partial sums.
  struct Primitives {
    dnnl::matmul assign;
    dnnl::matmul accumulate;
    dnnl::memory::desc assign_scratch;
    dnnl::memory::desc accumulate_scratch;
  };
  // The primitives for a bucket, from a process-wide cache shared by every Linear of the
  // same shape (a primitive does not depend on the weights' values, only on their layout).
  const Primitives& PrimitivesFor(int64_t bucket_m) const;

  int64_t in_ = 0;
  int64_t out_ = 0;
  size_t weight_bytes_ = 0;
  // Unless oneDNN runs: the weight packed for kernels::GemmBf16, and the bias.
  bool own_gemm_ = false;
  const uint16_t* packed_ = nullptr;  // in the arena, or in own_packed_
  // The packed weight (either kernel's layout) where no arena was given.
  std::vector<uint16_t, StreamingAllocator<uint16_t>> own_packed_;
  std::vector<float> bias_values_;
  dnnl::memory::desc weight_desc_;  // repacked layout
  dnnl::memory weight_;             // over the arena's or own_packed_'s memory
  dnnl::memory bias_;               // f32 [1, out], or empty
  bool has_bias_ = false;
};

// oneDNN matmul primitives made so far in the process: two per row bucket met
// (RowsCapacity) and distinct Linear shape, kept for the life of the process. All layers of
// a model share their shapes, so the cache is bounded by
// 2 x NumRowBuckets(max rows) x (distinct shapes, 5 for a Llama-style model), whatever the
// number of layers, plus the few of LinearFingerprint's shape (a compute node makes them at
// start-up); it fills as new batch sizes appear.
int64_t NumGemmPrimitives();
// Distinct buckets of RowsCapacity for 1..max_rows rows.
int64_t NumRowBuckets(int64_t max_rows);

// The process-wide oneDNN CPU engine.
dnnl::engine& CpuEngine();

// Whether linear layers run on oneDNN's bf16 matmul rather than kernels::GemmBf16, which
// multiplies the same bf16 values and sums in f32, with the same independence of rows from
// the batch and the thread count. STRATA_GEMM (the compute node's --gemm) chooses:
//   auto (or unset) and own: strata's own on every CPU path;
//   onednn: oneDNN wherever the active CPU path (kernels/cpu/isa.h) is AVX-512 or later
//     and it has the primitive.
//
// The choice is per process, never per batch size: a row's result must not depend on the
// batch it runs in, and the two kernels sum in different orders. Measured on an AVX-512
// BF16 machine, the own kernel (vdpbf16ps) was 1.2-1.8x oneDNN's decode rate at batch 1,
// about 1.25x at 8 rows and level with it at 32 and 64; with both held to AVX-512 without
// BF16 (STRATA_CPU_ISA=avx512, ONEDNN_MAX_CPU_ISA=AVX512_CORE) the own kernel's GEMMs were
// 1.1-1.4x faster at batch 1 and its decode 2.2-2.6x faster from 8 rows (docs/benchmarks.md,
// "oneDNN against the own GEMM on AVX-512 without BF16"). oneDNN's results also differ between CPU
// makes, which the own kernel's do not.
bool UseOneDnnBf16();

enum class GemmChoice { kAuto, kOwn, kOneDnn };
// STRATA_GEMM's choice; any value but auto, own and onednn is an error that the compute
// node reports at start.
absl::StatusOr<GemmChoice> RequestedGemm();

// A hash (16 hex digits) of Forward's results on fixed weights and inputs at a few batch
// sizes, whichever GEMM runs here (UseOneDnnBf16). Compute nodes add it to the kernel
// fingerprint they register with (compute_node/main.cc): oneDNN's kernels depend on
// the CPU (AMX, AVX-512 BF16) and are not among kernels/cpu/fingerprint.h's. Uses the
// calling thread's OpenMP team.
std::string LinearFingerprint();

}  // namespace strata

#endif  // STRATA_COMPUTE_NODE_LINEAR_H_
