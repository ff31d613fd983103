// Binding of the MLX community affine layout (MODEL.md 3b) into ModelWeights: `.weight/.scales/.biases`
// triplets stay views into the mapped files, with bits derived from the shapes and checked against config.json;
// norms are used as stored (the +1 is already in them); conv [C,K,1] becomes fp32 [C,K]. A module without
// `.scales` is a dense bf16 weight (mlx-lm leaves a linear whose input width is not a multiple of the group size
// unquantized). `vision_tower.*` and unknown keys are ignored. Tested by tests/model/test_loader.cpp.
#include "core/error.h"
#include "model/binder.h"

namespace fern {
namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// A linear module [lead..., out, in]: affine triplet or dense bf16.
LinearWeight bind_linear(Binder& b, const ModelConfig& c, const std::string& module, std::vector<int64_t> lead_out,
                         int64_t in) {
  const TensorRef* scales = b.find(module + ".scales");
  if (!scales) {
    auto shape = lead_out;
    shape.push_back(in);
    return b.dense(module + ".weight", shape);
  }
  const TensorRef& wt = b.need(module + ".weight");
  const TensorRef& bi = b.need(module + ".biases");
  const QuantParams qp = c.quantization ? c.quantization->for_module(module) : QuantParams{};
  const int64_t group = qp.group_size;
  const auto& ws = wt.entry->shape;
  const auto& ss = scales->entry->shape;
  auto bad = [&](const std::string& why) { fail("{}: quantized module \"{}\": {}", wt.file, module, why); };
  if (ws.size() != lead_out.size() + 1 || ss.size() != lead_out.size() + 1)
    bad(fmt::format("weight {} / scales {} do not have rank {}", shape_str(ws), shape_str(ss), lead_out.size() + 1));
  if (in % group != 0) bad(fmt::format("input width {} is not a multiple of group_size {}", in, group));
  const int64_t groups = in / group;
  auto s_shape = lead_out;
  s_shape.push_back(groups);
  b.check(*scales, s_shape, {DType::BF16});
  b.check(bi, s_shape, {DType::BF16});
  // bits = 32 * packed_cols / (scale_cols * group_size), cross-checked with config.json.
  const int64_t packed = ws.back();
  if (packed <= 0 || (32 * packed) % in != 0) bad(fmt::format("packed width {} does not fit input width {}", packed, in));
  const int64_t bits = 32 * packed / (groups * group);
  if (bits != 4 && bits != 8) bad(fmt::format("shapes imply {} bits; only 4 and 8 are supported", bits));
  if (c.quantization && (!qp.enabled || bits != qp.bits))
    bad(fmt::format("shapes imply {} bits but config.json says {}", bits,
                    qp.enabled ? std::to_string(qp.bits) + " bits" : "not quantized"));
  auto w_shape = lead_out;
  w_shape.push_back(packed);
  b.check(wt, w_shape, {DType::U32});
  LinearWeight lw;
  lw.kind = LinearWeight::Kind::Affine;
  lw.name = module;
  lw.experts = lead_out.size() == 2 ? lead_out[0] : 0;
  lw.out = lead_out.back();
  lw.in = in;
  lw.bits = static_cast<int>(bits);
  lw.group_size = static_cast<int>(group);
  lw.w = b.view(wt, w_shape);
  lw.scales = b.view(*scales, s_shape);
  lw.biases = b.view(bi, s_shape);
  b.progress(wt);
  b.progress(*scales);
  b.progress(bi);
  return lw;
}

Tensor small_f32(Binder& b, const std::string& name, const std::vector<int64_t>& shape) {
  const TensorRef& t = b.need(name);
  b.check(t, shape, {DType::BF16, DType::F32});
  Tensor r = b.to_f32(t, shape);
  b.progress(t);
  return r;
}

}  // namespace

void bind_mlx(Binder& b, const ModelConfig& c, ModelWeights& w) {
  const bool vlm = b.find("language_model.model.embed_tokens.weight") != nullptr;
  const std::string P = vlm ? "language_model.model." : "model.";
  const std::string head = vlm ? "language_model.lm_head" : "lm_head";
  const int64_t H = c.hidden_size, V = c.vocab_size, E = c.num_experts, I = c.moe_intermediate_size;
  const int64_t Is = c.shared_expert_intermediate_size;

  if (c.quantization) {
    // An override for a module that the file does not have means config and weights disagree.
    for (const auto& [module, qp] : c.quantization->overrides) {
      if (module.rfind("vision_tower", 0) == 0) continue;
      if (!b.find(module + ".weight"))
        fail("{}: config.json quantization names module \"{}\", which has no tensor \"{}.weight\"", b.where(), module,
             module);
    }
  }

  w.embed = bind_linear(b, c, P + "embed_tokens", {V}, H);
  if (b.find(head + ".weight") || !c.tie_word_embeddings) w.lm_head = bind_linear(b, c, head, {V}, H);
  else w.lm_head = w.embed;
  w.final_norm = small_f32(b, P + "norm.weight", {H});
  w.layers.resize(c.num_hidden_layers);
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const std::string L = P + "layers." + std::to_string(i) + ".";
    LayerWeights& l = w.layers[i];
    l.type = c.layer_types[i];
    l.input_norm = small_f32(b, L + "input_layernorm.weight", {H});
    l.post_norm = small_f32(b, L + "post_attention_layernorm.weight", {H});
    if (c.is_attention_layer(i)) {
      const int64_t qd = int64_t(c.num_attention_heads) * c.head_dim, kvd = int64_t(c.num_key_value_heads) * c.head_dim;
      l.attn.q_proj = bind_linear(b, c, L + "self_attn.q_proj", {2 * qd}, H);
      l.attn.k_proj = bind_linear(b, c, L + "self_attn.k_proj", {kvd}, H);
      l.attn.v_proj = bind_linear(b, c, L + "self_attn.v_proj", {kvd}, H);
      l.attn.o_proj = bind_linear(b, c, L + "self_attn.o_proj", {H}, qd);
      l.attn.q_norm = small_f32(b, L + "self_attn.q_norm.weight", {c.head_dim});
      l.attn.k_norm = small_f32(b, L + "self_attn.k_norm.weight", {c.head_dim});
    } else {
      const int64_t hv = c.linear_num_value_heads, C = c.gdn_conv_dim(), K = c.linear_conv_kernel_dim;
      l.gdn.in_proj_qkv = bind_linear(b, c, L + "linear_attn.in_proj_qkv", {C}, H);
      l.gdn.in_proj_z = bind_linear(b, c, L + "linear_attn.in_proj_z", {c.gdn_value_dim()}, H);
      l.gdn.in_proj_b = bind_linear(b, c, L + "linear_attn.in_proj_b", {hv}, H);
      l.gdn.in_proj_a = bind_linear(b, c, L + "linear_attn.in_proj_a", {hv}, H);
      l.gdn.out_proj = bind_linear(b, c, L + "linear_attn.out_proj", {H}, c.gdn_value_dim());
      const TensorRef& conv = b.need(L + "linear_attn.conv1d.weight");
      b.check(conv, {C, K, 1}, {DType::BF16, DType::F32});
      l.gdn.conv_w = b.to_f32(conv, {C, K});
      b.progress(conv);
      l.gdn.A_log = small_f32(b, L + "linear_attn.A_log", {hv});
      l.gdn.dt_bias = small_f32(b, L + "linear_attn.dt_bias", {hv});
      l.gdn.norm_w = small_f32(b, L + "linear_attn.norm.weight", {c.linear_value_head_dim});
    }
    MoeWeights& m = l.moe;
    m.router = bind_linear(b, c, L + "mlp.gate", {E}, H);
    m.gate = bind_linear(b, c, L + "mlp.switch_mlp.gate_proj", {E, I}, H);
    m.up = bind_linear(b, c, L + "mlp.switch_mlp.up_proj", {E, I}, H);
    m.down = bind_linear(b, c, L + "mlp.switch_mlp.down_proj", {E, H}, I);
    m.shared_gate = bind_linear(b, c, L + "mlp.shared_expert.gate_proj", {Is}, H);
    m.shared_up = bind_linear(b, c, L + "mlp.shared_expert.up_proj", {Is}, H);
    m.shared_down = bind_linear(b, c, L + "mlp.shared_expert.down_proj", {H}, Is);
    m.shared_expert_gate = bind_linear(b, c, L + "mlp.shared_expert_gate", {1}, H);
  }
}

}  // namespace fern
