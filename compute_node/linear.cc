#include "compute_node/linear.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/bfloat16.h"
#include "common/base/logging.h"
#include "kernels/cpu/fingerprint.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa.h"

namespace strata {
namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

// Converts a checkpoint tensor (F32/F16/BF16) into bf16 at `out`.
void ToBf16(const TensorView& view, uint16_t* out) {
  const int64_t n = view.num_elements();
  if (view.dtype_name == "BF16") {
    std::memcpy(out, view.data, n * 2);
  } else if (view.dtype_name == "F16") {
    const auto* in = reinterpret_cast<const uint16_t*>(view.data);
    for (int64_t i = 0; i < n; ++i) out[i] = FloatToBf16(F16ToFloat(in[i]));
  } else {
    const auto* in = reinterpret_cast<const float*>(view.data);
    for (int64_t i = 0; i < n; ++i) out[i] = FloatToBf16(in[i]);
  }
}

float ElementAsFloat(const TensorView& view, int64_t i) {
  if (view.dtype_name == "BF16")
    return Bf16ToFloat(reinterpret_cast<const uint16_t*>(view.data)[i]);
  if (view.dtype_name == "F16") return F16ToFloat(reinterpret_cast<const uint16_t*>(view.data)[i]);
  return reinterpret_cast<const float*>(view.data)[i];
}

}  // namespace

dnnl::engine& CpuEngine() {
  static dnnl::engine* engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *engine;
}

absl::StatusOr<GemmChoice> RequestedGemm() {
  const char* env = std::getenv("STRATA_GEMM");
  const std::string choice = env == nullptr ? "" : env;
  if (choice.empty() || choice == "auto") return GemmChoice::kAuto;
  if (choice == "own") return GemmChoice::kOwn;
  if (choice == "onednn") return GemmChoice::kOneDnn;
  return absl::InvalidArgumentError(
      absl::StrCat("STRATA_GEMM must be auto, own or onednn, not \"", choice, "\""));
}

bool UseOneDnnBf16() {
  static const bool use = [] {
    const kernels::CpuIsa isa = kernels::ActiveCpuIsa();
    if (isa < kernels::CpuIsa::kAvx512) return false;
    if (RequestedGemm().value_or(GemmChoice::kAuto) != GemmChoice::kOneDnn) return false;
    try {
      const dnnl::memory::desc src({16, 64}, dt::bf16, tag::ab);
      const dnnl::memory::desc weights({64, 64}, dt::bf16, tag::any);
      const dnnl::memory::desc dst({16, 64}, dt::f32, tag::ab);
      dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, weights, dst), CpuEngine());
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return use;
}

int64_t RowsCapacity(int64_t m) {
  if (m <= 16) return m;
  if (m <= 128) return (m + 7) / 8 * 8;
  if (m <= 512) return (m + 31) / 32 * 32;
  return (m + 127) / 128 * 128;
}

absl::StatusOr<std::unique_ptr<Linear>> Linear::Create(
    const std::vector<const TensorView*>& parts, const std::vector<const TensorView*>& bias_parts,
    int64_t in_features, StreamingArena* arena) {
  auto linear = std::unique_ptr<Linear>(new Linear);
  linear->in_ = in_features;
  for (const TensorView* part : parts) {
    CHECK_EQ(part->shape.size(), 2u);
    CHECK_EQ(part->shape[1], in_features);
    linear->out_ += part->shape[0];
  }
  const int64_t in = linear->in_;
  const int64_t out = linear->out_;
  // Stack the parts into one plain bf16 [out][in] buffer, which is the [K][N] matrix
  // W^T in oneDNN's "ba" (column-major) order.
  std::vector<uint16_t> plain(static_cast<size_t>(out) * in);
  int64_t row = 0;
  for (const TensorView* part : parts) {
    ToBf16(*part, plain.data() + row * in);
    row += part->shape[0];
  }
  std::vector<float> bias;
  for (const TensorView* part : bias_parts) {
    for (int64_t i = 0; i < part->num_elements(); ++i) bias.push_back(ElementAsFloat(*part, i));
  }
  CHECK(bias.empty() || static_cast<int64_t>(bias.size()) == out);
  linear->has_bias_ = !bias.empty();
  if (!UseOneDnnBf16()) {
    linear->own_gemm_ = true;
    const int64_t elements = kernels::PackedGemmWeightSize(out, in);
    uint16_t* packed = nullptr;
    if (arena != nullptr) {
      packed = static_cast<uint16_t*>(arena->Allocate(elements * sizeof(uint16_t)));
      if (packed == nullptr) {
        return absl::ResourceExhaustedError(
            absl::StrCat("no memory for a ", out, " x ", in, " linear layer's weight"));
      }
    } else {
      linear->own_packed_.resize(elements);
      packed = linear->own_packed_.data();
    }
    kernels::PackGemmWeight(plain.data(), out, in, packed);
    linear->packed_ = packed;
    linear->weight_bytes_ = elements * sizeof(uint16_t);
    linear->bias_values_ = std::move(bias);
    return linear;
  }

  dnnl::engine& engine = CpuEngine();
  dnnl::stream stream(engine);
  const dnnl::memory::desc plain_desc({in, out}, dt::bf16, tag::ba);
  dnnl::memory plain_mem(plain_desc, engine, plain.data());
  // Let oneDNN pick the weight layout for a representative M; tests check that the same
  // layout serves every M.
  const dnnl::memory::desc src_desc({16, in}, dt::bf16, tag::ab);
  const dnnl::memory::desc any_weights({in, out}, dt::bf16, tag::any);
  const dnnl::memory::desc dst_desc({16, out}, dt::f32, tag::ab);
  try {
    auto pd =
        dnnl::matmul::primitive_desc(dnnl::matmul::desc(src_desc, any_weights, dst_desc), engine);
    linear->weight_desc_ = pd.weights_desc();
  } catch (const dnnl::error& e) {
    return absl::InternalError(
        absl::StrCat("oneDNN matmul for [", in, " x ", out, "]: ", e.what()));
  }
  // oneDNN's layout, in the arena or the layer's own memory like the own kernel's: on huge
  // pages, where oneDNN's own allocation would stream the weight through 4 KiB pages.
  linear->weight_bytes_ = linear->weight_desc_.get_size();
  void* packed = nullptr;
  if (arena != nullptr) {
    packed = arena->Allocate(linear->weight_bytes_);
  } else {
    linear->own_packed_.resize((linear->weight_bytes_ + 1) / 2);
    packed = linear->own_packed_.data();
  }
  if (packed == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("no memory for a ", out, " x ", in, " linear layer's weight"));
  }
  linear->weight_ = dnnl::memory(linear->weight_desc_, engine, packed);
  dnnl::reorder(plain_mem, linear->weight_).execute(stream, plain_mem, linear->weight_);
  stream.wait();

  if (linear->has_bias_) {
    linear->bias_ = dnnl::memory({{1, out}, dt::f32, tag::ab}, engine);
    std::memcpy(linear->bias_.get_data_handle(), bias.data(), bias.size() * sizeof(float));
  }
  return linear;
}

namespace {

std::atomic<int64_t> num_gemm_primitives{0};

}  // namespace

int64_t NumGemmPrimitives() { return num_gemm_primitives.load(); }

int64_t NumRowBuckets(int64_t max_rows) {
  int64_t n = 0;
  for (int64_t m = 1; m <= max_rows; m = RowsCapacity(m) + 1) ++n;
  return n;
}

const Linear::Primitives& Linear::PrimitivesFor(int64_t bucket_m) const {
  struct Entry {
    dnnl::memory::desc weights;
    std::unique_ptr<Primitives> primitives;
  };
  static std::mutex mu;
  static auto* cache = new std::map<std::tuple<int64_t, int64_t, int64_t, bool>,
                                    std::vector<Entry>>();  // by (bucket, in, out, bias)
  std::lock_guard<std::mutex> lock(mu);
  std::vector<Entry>& entries = (*cache)[{bucket_m, in_, out_, has_bias_}];
  for (const Entry& e : entries) {
    if (e.weights == weight_desc_) return *e.primitives;
  }
  std::unique_ptr<Primitives> slot;
  {
    dnnl::engine& engine = CpuEngine();
    const dnnl::memory::desc src_desc({bucket_m, in_}, dt::bf16, tag::ab);
    const dnnl::memory::desc dst_desc({bucket_m, out_}, dt::f32, tag::ab);
    const dnnl::memory::desc bias_desc =
        has_bias_ ? dnnl::memory::desc({1, out_}, dt::f32, tag::ab) : dnnl::memory::desc();
    auto make = [&](bool accumulate) {
      dnnl::primitive_attr attr;
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      if (accumulate) {
        dnnl::post_ops ops;
        ops.append_sum(1.0f);
        attr.set_post_ops(ops);
      }
      auto desc = has_bias_ ? dnnl::matmul::desc(src_desc, weight_desc_, bias_desc, dst_desc)
                            : dnnl::matmul::desc(src_desc, weight_desc_, dst_desc);
      return dnnl::matmul::primitive_desc(desc, attr, engine);
    };
    const auto assign = make(false);
    const auto accumulate = make(true);
    slot = std::make_unique<Primitives>(Primitives{dnnl::matmul(assign), dnnl::matmul(accumulate),
                                                   assign.scratchpad_desc(),
                                                   accumulate.scratchpad_desc()});
    num_gemm_primitives += 2;
  }
  entries.push_back({weight_desc_, std::move(slot)});
  return *entries.back().primitives;
}

void Linear::Forward(int64_t m, const uint16_t* x, float* y, bool accumulate) const {
  if (m <= 0) return;
  if (own_gemm_) {
    kernels::GemmBf16(m, out_, in_, x, packed_, has_bias_ ? bias_values_.data() : nullptr,
                      accumulate, y);
    return;
  }
  const int64_t bucket = RowsCapacity(m);
  const Primitives& prims = PrimitivesFor(bucket);
  dnnl::engine& engine = CpuEngine();
  dnnl::stream stream(engine);
  dnnl::memory src({{bucket, in_}, dt::bf16, tag::ab}, engine, const_cast<uint16_t*>(x));
  dnnl::memory dst({{bucket, out_}, dt::f32, tag::ab}, engine, y);
  std::unordered_map<int, dnnl::memory> args = {
      {DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weight_}, {DNNL_ARG_DST, dst}};
  if (has_bias_) args[DNNL_ARG_BIAS] = bias_;
  // The scratchpad is this thread's: concurrent runs of a shared primitive never share one.
  const dnnl::memory::desc& scratch_desc =
      accumulate ? prims.accumulate_scratch : prims.assign_scratch;
  thread_local std::vector<uint8_t> scratch;
  if (scratch.size() < scratch_desc.get_size()) scratch.resize(scratch_desc.get_size());
  args[DNNL_ARG_SCRATCHPAD] = dnnl::memory(scratch_desc, engine, scratch.data());
  (accumulate ? prims.accumulate : prims.assign).execute(stream, args);
  stream.wait();
}

std::string LinearFingerprint() {
  constexpr int64_t kOut = 80, kIn = 1000;
  uint64_t state = 0x2545f4914f6cdd1dULL;
  // Numbers of a fixed generator, as bf16 in [-1, 1), made without libm.
  auto next_bf16 = [&state] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    const float unit = static_cast<float>(state >> 40) * 0x1.0p-24f;
    return FloatToBf16(2.0f * unit - 1.0f);
  };
  std::vector<uint16_t> weight(kOut * kIn);
  for (uint16_t& w : weight) w = next_bf16();
  const TensorView view{"fingerprint",
                        "BF16",
                        {kOut, kIn},
                        reinterpret_cast<const uint8_t*>(weight.data()),
                        weight.size() * sizeof(uint16_t)};
  auto linear = Linear::Create({&view}, {}, kIn);
  CHECK(linear.ok()) << linear.status();
  uint64_t hash = kernels::FingerprintBytes(nullptr, 0);
  for (const int64_t m : {1, 7, 33}) {
    std::vector<uint16_t> x(RowsCapacity(m) * kIn, 0);
    for (int64_t i = 0; i < m * kIn; ++i) x[i] = next_bf16();
    std::vector<float> y(RowsCapacity(m) * kOut);
    (*linear)->Forward(m, x.data(), y.data(), /*accumulate=*/false);
    hash = kernels::FingerprintBytes(y.data(), m * kOut * sizeof(float), hash);
  }
  return kernels::FingerprintHex(hash);
}

}  // namespace strata
