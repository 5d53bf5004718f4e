#include "compute_node/model_runner.h"

#include <cmath>
#include <cstring>
#include <iterator>

#include "common/base/bfloat16.h"
#include "common/base/enum_names.h"
#include "common/base/logging.h"
#include "common/base/stopwatch.h"
#include "kernels/cpu/elementwise.h"

namespace strata {

const char* ForwardOpName(ForwardOp op) {
  static constexpr EnumName<ForwardOp> kNames[] = {
      {ForwardOp::kEmbed, "embed"},
      {ForwardOp::kInputNorm, "input_norm"},
      {ForwardOp::kQkv, "qkv"},
      {ForwardOp::kRope, "rope"},
      {ForwardOp::kToBf16, "to_bf16"},
      {ForwardOp::kO, "o"},
      {ForwardOp::kPostNorm, "post_norm"},
      {ForwardOp::kGateUp, "gate_up"},
      {ForwardOp::kSiluMul, "silu_mul"},
      {ForwardOp::kDown, "down"},
      {ForwardOp::kFinalNorm, "final_norm"},
      {ForwardOp::kLmHead, "lm_head"},
  };
  static_assert(std::size(kNames) == kForwardOps);
  return EnumNameOf(op, kNames);
}

bool IsGemm(ForwardOp op) {
  return op == ForwardOp::kQkv || op == ForwardOp::kO || op == ForwardOp::kGateUp ||
         op == ForwardOp::kDown || op == ForwardOp::kLmHead;
}

template <class F>
void ModelRunner::Timed(BatchBuffers& b, ForwardOp op, F&& f) {
  if (b.profile == nullptr) {
    f();
    return;
  }
  const Stopwatch watch;
  f();
  b.profile->seconds[static_cast<int>(op)] += watch.ElapsedSeconds();
}

BatchBuffers::BatchBuffers(const ModelConfig& c, int64_t rows)
    : max_rows(rows), capacity(RowsCapacity(rows)) {
  const int64_t cap = capacity;
  positions.resize(cap);
  x.resize(cap * c.hidden_size);
  normed.resize(cap * std::max(c.hidden_size, c.intermediate_size));
  qkv.resize(cap * (c.q_size() + 2 * c.kv_size()));
  q.resize(cap * c.q_size());
  k.resize(cap * c.kv_size());
  v.resize(cap * c.kv_size());
  attn.resize(cap * c.q_size());
  gate_up.resize(cap * 2 * c.intermediate_size);
  act.resize(cap * c.intermediate_size);
}

ModelRunner::ModelRunner(const ModelWeights* weights, int64_t max_positions)
    : weights_(weights), max_positions_(max_positions) {
  const ModelConfig& c = weights->config;
  const std::vector<double> inv_freq = RopeInverseFrequencies(c);
  const int64_t half = c.head_dim / 2;
  rope_cos_.resize(max_positions * half);
  rope_sin_.resize(max_positions * half);
  for (int64_t p = 0; p < max_positions; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(p) * inv_freq[i];
      rope_cos_[p * half + i] = static_cast<float>(std::cos(angle));
      rope_sin_[p * half + i] = static_cast<float>(std::sin(angle));
    }
  }
}

void ModelRunner::Embed(BatchBuffers& b, int64_t m, const int32_t* tokens,
                        const int32_t* positions) const {
  const ModelConfig& c = config();
  CHECK_LE(m, b.max_rows);
  Timed(b, ForwardOp::kEmbed, [&] {
    for (int64_t r = 0; r < m; ++r) {
      CHECK(tokens[r] >= 0 && tokens[r] < c.vocab_size) << "token " << tokens[r];
      CHECK(positions[r] >= 0 && positions[r] < max_positions_) << "position " << positions[r];
      const uint16_t* e =
          weights_->embedding.data() + static_cast<int64_t>(tokens[r]) * c.hidden_size;
      float* x = b.x.data() + r * c.hidden_size;
      for (int64_t i = 0; i < c.hidden_size; ++i) x[i] = Bf16ToFloat(e[i]);
      b.positions[r] = positions[r];
    }
  });
}

void ModelRunner::PreAttention(BatchBuffers& b, int64_t m, int layer) const {
  const ModelConfig& c = config();
  const LayerWeights& w = weights_->layers[layer];
  const int64_t qkv_width = c.q_size() + 2 * c.kv_size();
  Timed(b, ForwardOp::kInputNorm, [&] {
    kernels::RmsNorm(m, c.hidden_size, b.x.data(), w.input_norm.data(),
                     static_cast<float>(c.rms_norm_eps), b.normed.data());
  });
  Timed(b, ForwardOp::kQkv,
        [&] { w.qkv->Forward(m, b.normed.data(), b.qkv.data(), /*accumulate=*/false); });
  // q heads then k heads are contiguous at the start of each row: rotate both at once.
  Timed(b, ForwardOp::kRope, [&] {
    kernels::ApplyRope(m, c.num_heads + c.num_kv_heads, c.head_dim, qkv_width, b.positions.data(),
                       rope_cos_.data(), rope_sin_.data(), b.qkv.data());
  });
  Timed(b, ForwardOp::kToBf16, [&] {
    // k and v in the KV cache's type; q stays bf16 for the attention kernels.
    const auto to_kv =
        c.kv_cache_dtype == DType::kF16 ? kernels::ConvertToF16 : kernels::ConvertToBf16;
    for (int64_t r = 0; r < m; ++r) {
      const float* row = b.qkv.data() + r * qkv_width;
      kernels::ConvertToBf16(c.q_size(), row, b.q.data() + r * c.q_size());
      to_kv(c.kv_size(), row + c.q_size(), b.k.data() + r * c.kv_size());
      to_kv(c.kv_size(), row + c.q_size() + c.kv_size(), b.v.data() + r * c.kv_size());
    }
  });
}

void ModelRunner::PostAttention(BatchBuffers& b, int64_t m, int layer) const {
  const ModelConfig& c = config();
  const LayerWeights& w = weights_->layers[layer];
  Timed(b, ForwardOp::kO, [&] { w.o->Forward(m, b.attn.data(), b.x.data(), /*accumulate=*/true); });
  Timed(b, ForwardOp::kPostNorm, [&] {
    kernels::RmsNorm(m, c.hidden_size, b.x.data(), w.post_norm.data(),
                     static_cast<float>(c.rms_norm_eps), b.normed.data());
  });
  Timed(b, ForwardOp::kGateUp,
        [&] { w.gate_up->Forward(m, b.normed.data(), b.gate_up.data(), /*accumulate=*/false); });
  Timed(b, ForwardOp::kSiluMul,
        [&] { kernels::SiluMul(m, c.intermediate_size, b.gate_up.data(), b.act.data()); });
  Timed(b, ForwardOp::kDown,
        [&] { w.down->Forward(m, b.act.data(), b.x.data(), /*accumulate=*/true); });
}

void ModelRunner::Logits(BatchBuffers& b, const std::vector<int32_t>& rows, float* logits) const {
  const ModelConfig& c = config();
  const int64_t n = static_cast<int64_t>(rows.size());
  if (n == 0) return;
  std::vector<uint16_t> normed(RowsCapacity(n) * c.hidden_size);
  Timed(b, ForwardOp::kFinalNorm, [&] {
    // Gather the rows' residuals.
    std::vector<float> gathered(RowsCapacity(n) * c.hidden_size);
    for (int64_t i = 0; i < n; ++i) {
      CHECK(rows[i] >= 0 && rows[i] < b.max_rows);
      std::memcpy(gathered.data() + i * c.hidden_size, b.x.data() + rows[i] * c.hidden_size,
                  c.hidden_size * sizeof(float));
    }
    kernels::RmsNorm(n, c.hidden_size, gathered.data(), weights_->final_norm.data(),
                     static_cast<float>(c.rms_norm_eps), normed.data());
  });
  Timed(b, ForwardOp::kLmHead,
        [&] { weights_->lm_head->Forward(n, normed.data(), logits, /*accumulate=*/false); });
}

}  // namespace strata
