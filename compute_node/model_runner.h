// The forward pass of a Llama-family model on the compute node, split at attention exactly
// as the disaggregated path runs it:
//
//   Embed                                  x = embedding[token]
//   for each layer:
//     PreAttention      normed = RMSNorm(x); qkv = normed Wqkv^T (+b); RoPE(q, k);
//                       q, k, v -> bf16                    (what goes to a memory node)
//     attention         elsewhere: AttentionEngine locally, or over the transport
//     PostAttention     x += attn Wo^T; x += SiLU(normed2 Wg^T) * (normed2 Wu^T) Wd^T
//   Logits              lm_head(RMSNorm(x)) for the rows that are sampled
//
// Arithmetic contract (what the numpy reference reproduces): the residual stream x is f32;
// every GEMM input (norm outputs, attention output, SiLU product) is rounded to bf16; GEMMs
// accumulate in f32; q, k, v are rounded to bf16 after RoPE; the KV cache holds bf16.
//
// Rows are independent: a row's result depends only on its own token, position and KV.
// Thread-safety: a ModelRunner is immutable and shared; each batch in flight owns its
// BatchBuffers.
#ifndef STRATA_COMPUTE_NODE_MODEL_RUNNER_H_
#define STRATA_COMPUTE_NODE_MODEL_RUNNER_H_

#include <array>
#include <cstdint>
#include <vector>

#include "compute_node/model_weights.h"

namespace strata {

// The forward pass's operations, for a profile of where a step's time goes (OpProfile).
// Attention is not among them: it is the attention backend's, between PreAttention and
// PostAttention.
enum class ForwardOp {
  kEmbed,
  kInputNorm,
  kQkv,
  kRope,
  kToBf16,  // q, k and v rounded to bf16
  kO,
  kPostNorm,
  kGateUp,
  kSiluMul,
  kDown,
  kFinalNorm,  // the sampled rows gathered and normalised
  kLmHead,
};
inline constexpr int kForwardOps = static_cast<int>(ForwardOp::kLmHead) + 1;
const char* ForwardOpName(ForwardOp op);
// The operations that are GEMMs (the linear layers and the LM head).
bool IsGemm(ForwardOp op);

// Seconds spent in each operation, added up over the calls made while it is attached.
struct OpProfile {
  std::array<double, kForwardOps> seconds{};
};

// Working memory of one batch in flight, for up to `max_rows` rows.
struct BatchBuffers {
  BatchBuffers(const ModelConfig& config, int64_t max_rows);

  int64_t max_rows = 0;
  int64_t capacity = 0;            // RowsCapacity(max_rows)
  std::vector<int32_t> positions;  // [capacity]
  std::vector<float> x;            // [capacity][hidden] residual stream
  std::vector<uint16_t> normed;    // [capacity][hidden] bf16
  std::vector<float> qkv;          // [capacity][q + 2 kv] f32
  std::vector<uint16_t> q;         // [capacity][q] bf16
  std::vector<uint16_t> k;         // [capacity][kv] bf16
  std::vector<uint16_t> v;         // [capacity][kv] bf16
  std::vector<uint16_t> attn;      // [capacity][q] bf16 attention output
  std::vector<float> gate_up;      // [capacity][2 * intermediate] f32
  std::vector<uint16_t> act;       // [capacity][intermediate] bf16
  // Benchmarks: when set, each operation of the forward pass adds its time here.
  OpProfile* profile = nullptr;
};

class ModelRunner {
 public:
  // `max_positions` bounds the positions the RoPE table covers.
  ModelRunner(const ModelWeights* weights, int64_t max_positions);

  const ModelConfig& config() const { return weights_->config; }
  const ModelWeights& weights() const { return *weights_; }
  int64_t max_positions() const { return max_positions_; }

  // Token ids must be < vocab_size and positions < max_positions (CHECKed; the scheduler
  // validates requests).
  void Embed(BatchBuffers& b, int64_t m, const int32_t* tokens, const int32_t* positions) const;
  void PreAttention(BatchBuffers& b, int64_t m, int layer) const;
  void PostAttention(BatchBuffers& b, int64_t m, int layer) const;
  // logits: [RowsCapacity(rows.size())][vocab] f32; row i is for batch row rows[i].
  void Logits(BatchBuffers& b, const std::vector<int32_t>& rows, float* logits) const;

 private:
  // Runs `f`, adding its time to b.profile's `op` when a profile is attached.
  template <class F>
  static void Timed(BatchBuffers& b, ForwardOp op, F&& f);

  const ModelWeights* weights_;
  int64_t max_positions_;
  std::vector<float> rope_cos_, rope_sin_;  // [max_positions][head_dim / 2]
};

}  // namespace strata

#endif  // STRATA_COMPUTE_NODE_MODEL_RUNNER_H_
