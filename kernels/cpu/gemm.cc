#include "kernels/cpu/gemm.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "common/base/bfloat16.h"
#include "kernels/cpu/gemm_internal.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/work_ranges.h"

namespace strata::kernels {
namespace gemm_internal {

void ColumnGroupScalar(int rows, int blocks, int64_t k, const float* x, int64_t x_stride,
                       const uint16_t* group, float* out, int64_t out_stride) {
  const int64_t pairs = (k + 1) / 2;
  for (int b = 0; b < blocks; ++b) {
    const uint16_t* block = group + b * PackedBlockSize(k);
    for (int r = 0; r < rows; ++r) {
      float acc[16] = {};
      for (int64_t p = 0; p < pairs; ++p) {
        const float xo = x[r * x_stride + 2 * p + 1];
        const float xe = x[r * x_stride + 2 * p];
        const uint16_t* w = block + p * 32;
        for (int j = 0; j < 16; ++j) {
          acc[j] = std::fmaf(xo, Bf16ToFloat(w[2 * j + 1]), acc[j]);
          acc[j] = std::fmaf(xe, Bf16ToFloat(w[2 * j]), acc[j]);
        }
      }
      std::memcpy(out + r * out_stride + b * 16, acc, sizeof(acc));
    }
  }
}

}  // namespace gemm_internal

namespace {

// Rows per pass: their f32 copy (rows x k) stays in cache while every column block of the
// weight streams past it once.
constexpr int64_t kRowBlock = 48;
constexpr int64_t kGroupColumns = gemm_internal::kGroupBlocks * kGemmColumnBlock;

}  // namespace

namespace {

std::atomic<int> forced_wide_kernel{static_cast<int>(GemmWideKernel::kAuto)};

GemmWideKernel MeasuredWideKernel() {
  if (!CpuSupports(CpuIsa::kAvx512Bf16)) return GemmWideKernel::kDot;
  const char* env = std::getenv("STRATA_GEMM_WIDE");
  const std::string_view choice = env == nullptr ? "" : env;
  if (choice == "dot") return GemmWideKernel::kDot;
  if (choice == "fma") return GemmWideKernel::kFma;
  if (!choice.empty() && choice != "auto") {
    std::fprintf(stderr, "STRATA_GEMM_WIDE must be auto, dot or fma, not \"%s\"; using auto\n",
                 env);
  }
  const GemmWideProbe probe = MeasureGemmWideProbe();
  return probe.fma >= 1.25 * probe.dot ? GemmWideKernel::kFma : GemmWideKernel::kDot;
}

}  // namespace

GemmWideProbe MeasureGemmWideProbe() {
  // The best of five short runs of each (a preempted run only reads slower), about 0.1 ms
  // each on the CPUs measured.
  GemmWideProbe probe;
  for (int i = 0; i < 5; ++i) {
    if (CpuSupports(CpuIsa::kAvx512Bf16)) {
      probe.dot = std::max(probe.dot, gemm_internal::Bf16DotRate(8192));
    }
    if (CpuSupports(CpuIsa::kAvx512)) {
      probe.fma = std::max(probe.fma, gemm_internal::Fma512Rate(8192));
    }
  }
  return probe;
}

GemmWideKernel ActiveGemmWideKernel() {
  const auto forced = static_cast<GemmWideKernel>(forced_wide_kernel.load());
  if (forced != GemmWideKernel::kAuto) return forced;
  static const GemmWideKernel measured = MeasuredWideKernel();
  return measured;
}

const char* GemmWideKernelName(GemmWideKernel kernel) {
  switch (kernel) {
    case GemmWideKernel::kDot:
      return "dot";
    case GemmWideKernel::kFma:
      return "fma";
    case GemmWideKernel::kAuto:
      break;
  }
  return "auto";
}

void ForceGemmWideKernel(GemmWideKernel kernel) {
  forced_wide_kernel.store(static_cast<int>(kernel));
}

int64_t PackedGemmWeightSize(int64_t n, int64_t k) {
  return (n + kGemmColumnBlock - 1) / kGemmColumnBlock * gemm_internal::PackedBlockSize(k);
}

void PackGemmWeight(const uint16_t* w, int64_t n, int64_t k, uint16_t* packed) {
  const int64_t blocks = (n + kGemmColumnBlock - 1) / kGemmColumnBlock;
  const int64_t pairs = (k + 1) / 2;
  for (int64_t b = 0; b < blocks; ++b) {
    uint16_t* out = packed + b * gemm_internal::PackedBlockSize(k);
    for (int64_t p = 0; p < pairs; ++p) {
      for (int64_t j = 0; j < kGemmColumnBlock; ++j) {
        const int64_t col = b * kGemmColumnBlock + j;
        for (int64_t h = 0; h < 2; ++h) {
          const int64_t kk = 2 * p + h;
          out[(p * kGemmColumnBlock + j) * 2 + h] = col < n && kk < k ? w[col * k + kk] : 0;
        }
      }
    }
  }
}

namespace {

// y[r][c0 + j] for j < cols from the accumulators: the sum, then the bias, then the old y.
void Store(int rows, int64_t cols, const float* acc, int64_t acc_stride, const float* bias,
           bool accumulate, float* y, int64_t n) {
  for (int r = 0; r < rows; ++r) {
    float* dst = y + r * n;
    for (int64_t j = 0; j < cols; ++j) {
      float v = acc[r * acc_stride + j];
      if (bias != nullptr) v += bias[j];
      if (accumulate) v += dst[j];
      dst[j] = v;
    }
  }
}

// The loop every instruction set shares. Rows go in blocks of kRowBlock; for each block,
// prepare(r0, rows) readies its x, and the team takes the groups of kGroupBlocks column
// blocks (the work items, at every row count and on every path) through WorkRanges: each
// thread those that schedule(static) would give it, in order, so that it knows which one it
// reads next, and one that is done takes what is left of another's (work_ranges.h).
// compute(rows, r0, group, count, next, next_elements, out) fills `out` (kGroupColumns
// floats per row) with the group of `count` packed blocks at `group`; `next` is the group
// the thread will probably take next (its `next_elements` packed weights, for the kernels
// that request them into L2), or null.
//
// Groups of 4 blocks below 4 rows too: the AVX-512 kernels run them side by side, the AVX2
// one up to 3 rows, so that 1-3 rows read several independent streams of weights through
// more chains of FMAs. On the 2-core Xeon VM a batch of 1-3 rows took 0.67-0.80 of the time
// of blocks one at a time (docs/benchmarks.md, "Small batches' blocks side by side on AVX2
// and AVX-512"); on a Zen 5 a 1-row step's GEMMs had measured 1.03-1.08x slower that way
// ("The AVX2 and AVX-512 GEMMs take four blocks at once").
template <class Prepare, class Compute>
void RunColumnGroups(int64_t m, int64_t n, int64_t k, const uint16_t* packed, const float* bias,
                     bool accumulate, float* y, Prepare&& prepare, Compute&& compute) {
  const int64_t blocks = (n + kGemmColumnBlock - 1) / kGemmColumnBlock;
  const int64_t block_size = gemm_internal::PackedBlockSize(k);
  constexpr int group_blocks = gemm_internal::kGroupBlocks;
  WorkRanges& work = CallerWorkRanges();
  const int team = omp_get_max_threads();
  for (int64_t r0 = 0; r0 < m; r0 += kRowBlock) {
    const int rows = static_cast<int>(std::min(kRowBlock, m - r0));
    prepare(r0, rows);
    work.Reset((blocks + group_blocks - 1) / group_blocks, team);
#pragma omp parallel num_threads(team)
    {
      EnableFlushToZero();  // vdpbf16ps flushes denormals itself; the other kernels alike
      const int id = omp_get_thread_num();
      for (int64_t g = work.Next(id); g >= 0; g = work.Next(id)) {
        float out[kRowBlock * kGroupColumns];
        const int64_t b0 = g * group_blocks;
        const int count = static_cast<int>(std::min<int64_t>(group_blocks, blocks - b0));
        const int64_t next_g = work.PeekFront(id);
        const int64_t next_b0 = next_g * group_blocks;
        const int64_t next_count =
            next_g >= 0 ? std::min<int64_t>(group_blocks, blocks - next_b0) : 0;
        compute(rows, r0, packed + b0 * block_size, count,
                next_count > 0 ? packed + next_b0 * block_size : nullptr, next_count * block_size,
                out);
        const int64_t c0 = b0 * kGemmColumnBlock;
        Store(rows, std::min<int64_t>(count * kGemmColumnBlock, n - c0), out, kGroupColumns,
              bias != nullptr ? bias + c0 : nullptr, accumulate, y + r0 * n + c0, n);
      }
    }
  }
}

// With AVX-512 BF16: x stays bf16 (copied only to give an odd k its zero), and each thread
// takes groups of kGroupBlocks column blocks at every row count, requesting the next one's
// weights as it computes (gemm_avx512bf16.cc).
void GemmAvx512Bf16(int64_t m, int64_t n, int64_t k, const uint16_t* x, const uint16_t* packed,
                    const float* bias, bool accumulate, float* y) {
  const int64_t x_stride = (k + 1) / 2 * 2;
  thread_local std::vector<uint16_t> padded;
  if (x_stride != k) {
    padded.assign(static_cast<size_t>(m) * x_stride, 0);
    for (int64_t r = 0; r < m; ++r) std::memcpy(&padded[r * x_stride], x + r * k, k * 2);
    x = padded.data();
  }
  RunColumnGroups(
      m, n, k, packed, bias, accumulate, y, [](int64_t, int) {},
      [&](int rows, int64_t r0, const uint16_t* group, int count, const uint16_t* next,
          int64_t next_elements, float* out) {
        gemm_internal::ColumnGroupAvx512Bf16(rows, count, k, x + r0 * x_stride, x_stride, group,
                                             out, kGroupColumns, next, next_elements);
      });
}

}  // namespace

void GemmBf16(int64_t m, int64_t n, int64_t k, const uint16_t* x, const uint16_t* packed,
              const float* bias, bool accumulate, float* y) {
  if (ActiveCpuIsa() >= CpuIsa::kAvx512Bf16 &&
      (m < kGemmWideRows || ActiveGemmWideKernel() != GemmWideKernel::kFma)) {
    GemmAvx512Bf16(m, n, k, x, packed, bias, accumulate, y);
    return;
  }
  // Otherwise the ISA's kernel; on AVX-512 BF16, a wide batch on the AVX-512 kernel.
  const bool avx2 = ActiveCpuIsa() >= CpuIsa::kAvx2;
  const bool avx512 = ActiveCpuIsa() >= CpuIsa::kAvx512;
  // The row block's x in f32, converted by the calling thread, in rows of an even stride
  // (an odd k's last pair reads a zero). (A lambda names a thread_local, it does not
  // capture it: the team reads it through `xr`.)
  const int64_t x_stride = (k + 1) / 2 * 2;
  thread_local std::vector<float> xf;
  const float* xr = nullptr;
  RunColumnGroups(
      m, n, k, packed, bias, accumulate, y,
      [&](int64_t r0, int rows) {
        xf.resize(static_cast<size_t>(rows) * x_stride);
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t i = 0; i < k; ++i) xf[r * x_stride + i] = Bf16ToFloat(x[(r0 + r) * k + i]);
          if (x_stride != k) xf[r * x_stride + k] = 0.0f;
        }
        xr = xf.data();
      },
      [&](int rows, int64_t, const uint16_t* group, int count, const uint16_t* next,
          int64_t next_elements, float* out) {
        if (avx512) {
          gemm_internal::ColumnGroupAvx512(rows, count, k, xr, x_stride, group, out, kGroupColumns,
                                           next, next_elements);
        } else if (avx2) {
          gemm_internal::ColumnGroupAvx2(rows, count, k, xr, x_stride, group, out, kGroupColumns,
                                         next, next_elements);
        } else {
          gemm_internal::ColumnGroupScalar(rows, count, k, xr, x_stride, group, out, kGroupColumns);
        }
      });
}

}  // namespace strata::kernels
