// Binding of the official HF bf16 layout (MODEL.md 3a) into ModelWeights: matrices stay views into the mapped
// files (the fused expert tensor gate_up_proj [E, 2I, H] becomes two strided stacks, no copy); zero-centred norms
// become fp32 1 + w; conv [C,1,K] becomes fp32 [C,K]; A_log, dt_bias and the gated-norm weight become fp32.
// The per-expert form (mlp.experts.{e}.gate_proj.weight ...) is copied into one stack per projection.
// `model.visual.*` and `mtp.*` are never looked at. Tested by tests/model/test_loader.cpp.
#include <cstring>

#include "core/error.h"
#include "model/binder.h"

namespace fern {
namespace {

// Stacks per-expert matrices `{prefix}{e}.{proj}.weight` [out, in] into one owned bf16 tensor [E, out, in].
LinearWeight stack_experts(Binder& b, const std::string& prefix, const std::string& proj, int64_t E, int64_t out,
                           int64_t in) {
  Tensor t = b.alloc(DType::BF16, {E, out, in});
  const size_t bytes = static_cast<size_t>(out * in) * 2;
  for (int64_t e = 0; e < E; ++e) {
    const TensorRef& r = b.need(prefix + std::to_string(e) + "." + proj + ".weight");
    b.check(r, {out, in}, {DType::BF16});
    std::memcpy(static_cast<uint8_t*>(t.data) + e * bytes, r.data, bytes);
    b.progress(r);
  }
  LinearWeight lw;
  lw.kind = LinearWeight::Kind::Dense;
  lw.name = prefix + "*." + proj + ".weight";
  lw.experts = E;
  lw.out = out;
  lw.in = in;
  lw.w = t;
  return lw;
}

void bind_moe(Binder& b, const ModelConfig& c, const std::string& L, MoeWeights& m) {
  const int64_t H = c.hidden_size, E = c.num_experts, I = c.moe_intermediate_size;
  const int64_t Is = c.shared_expert_intermediate_size;
  m.router = b.dense(L + "mlp.gate.weight", {E, H});
  if (const TensorRef* gu = b.find(L + "mlp.experts.gate_up_proj")) {
    b.check(*gu, {E, 2 * I, H}, {DType::BF16});
    Tensor all = b.view(*gu, {E, 2 * I, H});
    // gate = rows [0, I) and up = rows [I, 2I) of every expert: two strided views of one tensor.
    for (int half = 0; half < 2; ++half) {
      LinearWeight lw;
      lw.kind = LinearWeight::Kind::Dense;
      lw.name = gu->entry->name + (half ? "[up]" : "[gate]");
      lw.experts = E;
      lw.out = I;
      lw.in = H;
      lw.expert_stride = 2 * I * H;
      lw.w = Tensor(static_cast<uint8_t*>(all.data) + static_cast<size_t>(half * I * H) * 2, DType::BF16, {E, I, H});
      (half ? m.up : m.gate) = lw;
    }
    b.progress(*gu);
    m.down = b.dense(L + "mlp.experts.down_proj", {E, H, I});
  } else if (b.find(L + "mlp.experts.0.gate_proj.weight")) {
    m.gate = stack_experts(b, L + "mlp.experts.", "gate_proj", E, I, H);
    m.up = stack_experts(b, L + "mlp.experts.", "up_proj", E, I, H);
    m.down = stack_experts(b, L + "mlp.experts.", "down_proj", E, H, I);
  } else {
    fail("{}: required tensor \"{}\" (or the per-expert {}) is missing", b.where(), L + "mlp.experts.gate_up_proj",
         L + "mlp.experts.0.gate_proj.weight");
  }
  m.shared_gate = b.dense(L + "mlp.shared_expert.gate_proj.weight", {Is, H});
  m.shared_up = b.dense(L + "mlp.shared_expert.up_proj.weight", {Is, H});
  m.shared_down = b.dense(L + "mlp.shared_expert.down_proj.weight", {H, Is});
  m.shared_expert_gate = b.dense(L + "mlp.shared_expert_gate.weight", {1, H});
}

Tensor small_f32(Binder& b, const std::string& name, const std::vector<int64_t>& shape, float add = 0.0f) {
  const TensorRef& t = b.need(name);
  b.check(t, shape, {DType::BF16, DType::F32});
  Tensor r = b.to_f32(t, shape, add);
  b.progress(t);
  return r;
}

}  // namespace

void bind_hf(Binder& b, const ModelConfig& c, ModelWeights& w) {
  const std::string P = b.find("model.language_model.embed_tokens.weight") ? "model.language_model." : "model.";
  const int64_t H = c.hidden_size, V = c.vocab_size;
  w.embed = b.dense(P + "embed_tokens.weight", {V, H});
  if (b.find("lm_head.weight") || !c.tie_word_embeddings) w.lm_head = b.dense("lm_head.weight", {V, H});
  else w.lm_head = w.embed;
  w.final_norm = small_f32(b, P + "norm.weight", {H}, 1.0f);
  w.layers.resize(c.num_hidden_layers);
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const std::string L = P + "layers." + std::to_string(i) + ".";
    LayerWeights& l = w.layers[i];
    l.type = c.layer_types[i];
    l.input_norm = small_f32(b, L + "input_layernorm.weight", {H}, 1.0f);
    l.post_norm = small_f32(b, L + "post_attention_layernorm.weight", {H}, 1.0f);
    if (c.is_attention_layer(i)) {
      const int64_t qd = int64_t(c.num_attention_heads) * c.head_dim, kvd = int64_t(c.num_key_value_heads) * c.head_dim;
      l.attn.q_proj = b.dense(L + "self_attn.q_proj.weight", {2 * qd, H});
      l.attn.k_proj = b.dense(L + "self_attn.k_proj.weight", {kvd, H});
      l.attn.v_proj = b.dense(L + "self_attn.v_proj.weight", {kvd, H});
      l.attn.o_proj = b.dense(L + "self_attn.o_proj.weight", {H, qd});
      l.attn.q_norm = small_f32(b, L + "self_attn.q_norm.weight", {c.head_dim}, 1.0f);
      l.attn.k_norm = small_f32(b, L + "self_attn.k_norm.weight", {c.head_dim}, 1.0f);
    } else {
      const int64_t hv = c.linear_num_value_heads, C = c.gdn_conv_dim(), K = c.linear_conv_kernel_dim;
      l.gdn.in_proj_qkv = b.dense(L + "linear_attn.in_proj_qkv.weight", {C, H});
      l.gdn.in_proj_z = b.dense(L + "linear_attn.in_proj_z.weight", {c.gdn_value_dim(), H});
      l.gdn.in_proj_b = b.dense(L + "linear_attn.in_proj_b.weight", {hv, H});
      l.gdn.in_proj_a = b.dense(L + "linear_attn.in_proj_a.weight", {hv, H});
      l.gdn.out_proj = b.dense(L + "linear_attn.out_proj.weight", {H, c.gdn_value_dim()});
      const TensorRef& conv = b.need(L + "linear_attn.conv1d.weight");
      b.check(conv, {C, 1, K}, {DType::BF16, DType::F32});
      l.gdn.conv_w = b.to_f32(conv, {C, K});
      b.progress(conv);
      l.gdn.A_log = small_f32(b, L + "linear_attn.A_log", {hv});
      l.gdn.dt_bias = small_f32(b, L + "linear_attn.dt_bias", {hv});
      l.gdn.norm_w = small_f32(b, L + "linear_attn.norm.weight", {c.linear_value_head_dim});
    }
    bind_moe(b, c, L, l.moe);
  }
}

}  // namespace fern
