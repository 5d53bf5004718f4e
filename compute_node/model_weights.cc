#include "compute_node/model_weights.h"

#include "absl/strings/str_cat.h"
#include "common/base/bfloat16.h"
#include "common/base/status_macros.h"
#include "common/model/safetensors.h"

namespace strata {
namespace {

std::vector<float> ToFloatVector(const TensorView& view) {
  std::vector<float> out(view.num_elements());
  for (size_t i = 0; i < out.size(); ++i) {
    if (view.dtype_name == "BF16") {
      out[i] = Bf16ToFloat(reinterpret_cast<const uint16_t*>(view.data)[i]);
    } else if (view.dtype_name == "F16") {
      out[i] = F16ToFloat(reinterpret_cast<const uint16_t*>(view.data)[i]);
    } else {
      out[i] = reinterpret_cast<const float*>(view.data)[i];
    }
  }
  return out;
}

}  // namespace

size_t ModelWeights::gemm_weight_bytes() const {
  size_t total = lm_head->weight_bytes();
  for (const LayerWeights& l : layers) {
    total += l.qkv->weight_bytes() + l.o->weight_bytes() + l.gate_up->weight_bytes() +
             l.down->weight_bytes();
  }
  return total;
}

absl::StatusOr<std::unique_ptr<ModelWeights>> ModelWeights::Load(const std::string& model_dir,
                                                                 const ModelConfig& c) {
  ASSIGN_OR_RETURN(auto archive, WeightArchive::Open(model_dir));
  auto w = std::make_unique<ModelWeights>();
  w->config = c;
  const int64_t h = c.hidden_size;

  ASSIGN_OR_RETURN(const TensorView* embed,
                   archive->Get("model.embed_tokens.weight", {c.vocab_size, h}));
  {
    std::vector<float> as_float = ToFloatVector(*embed);
    w->embedding.resize(as_float.size());
    for (size_t i = 0; i < as_float.size(); ++i) w->embedding[i] = FloatToBf16(as_float[i]);
  }
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    LayerWeights layer;
    ASSIGN_OR_RETURN(const TensorView* in_norm, archive->Get(p + "input_layernorm.weight", {h}));
    ASSIGN_OR_RETURN(const TensorView* post_norm,
                     archive->Get(p + "post_attention_layernorm.weight", {h}));
    ASSIGN_OR_RETURN(const TensorView* q,
                     archive->Get(p + "self_attn.q_proj.weight", {c.q_size(), h}));
    ASSIGN_OR_RETURN(const TensorView* k,
                     archive->Get(p + "self_attn.k_proj.weight", {c.kv_size(), h}));
    ASSIGN_OR_RETURN(const TensorView* v,
                     archive->Get(p + "self_attn.v_proj.weight", {c.kv_size(), h}));
    ASSIGN_OR_RETURN(const TensorView* o,
                     archive->Get(p + "self_attn.o_proj.weight", {h, c.q_size()}));
    ASSIGN_OR_RETURN(const TensorView* gate,
                     archive->Get(p + "mlp.gate_proj.weight", {c.intermediate_size, h}));
    ASSIGN_OR_RETURN(const TensorView* up,
                     archive->Get(p + "mlp.up_proj.weight", {c.intermediate_size, h}));
    ASSIGN_OR_RETURN(const TensorView* down,
                     archive->Get(p + "mlp.down_proj.weight", {h, c.intermediate_size}));
    std::vector<const TensorView*> biases;
    if (c.qkv_bias) {
      ASSIGN_OR_RETURN(const TensorView* qb,
                       archive->Get(p + "self_attn.q_proj.bias", {c.q_size()}));
      ASSIGN_OR_RETURN(const TensorView* kb,
                       archive->Get(p + "self_attn.k_proj.bias", {c.kv_size()}));
      ASSIGN_OR_RETURN(const TensorView* vb,
                       archive->Get(p + "self_attn.v_proj.bias", {c.kv_size()}));
      biases = {qb, kb, vb};
    }
    layer.input_norm = ToFloatVector(*in_norm);
    layer.post_norm = ToFloatVector(*post_norm);
    ASSIGN_OR_RETURN(layer.qkv, Linear::Create({q, k, v}, biases, h, w->arena.get()));
    ASSIGN_OR_RETURN(layer.o, Linear::Create({o}, {}, c.q_size(), w->arena.get()));
    ASSIGN_OR_RETURN(layer.gate_up, Linear::Create({gate, up}, {}, h, w->arena.get()));
    ASSIGN_OR_RETURN(layer.down, Linear::Create({down}, {}, c.intermediate_size, w->arena.get()));
    w->layers.push_back(std::move(layer));
  }
  ASSIGN_OR_RETURN(const TensorView* final_norm, archive->Get("model.norm.weight", {h}));
  w->final_norm = ToFloatVector(*final_norm);
  const TensorView* head = embed;
  if (!c.tie_word_embeddings) {
    ASSIGN_OR_RETURN(head, archive->Get("lm_head.weight", {c.vocab_size, h}));
  }
  ASSIGN_OR_RETURN(w->lm_head, Linear::Create({head}, {}, h, w->arena.get()));
  return w;
}

}  // namespace strata
