#include "model/hf_layout.h"

#include "core/error.h"

namespace fern {

int64_t HfTensorSpec::rows() const {
  int64_t r = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) r *= shape[i];
  return r;
}

std::vector<HfTensorSpec> hf_tensor_specs(const ModelConfig& c) {
  std::vector<HfTensorSpec> v;
  const std::string P = "model.language_model.";
  const int64_t H = c.hidden_size, E = c.num_experts, I = c.moe_intermediate_size;
  const int64_t Is = c.shared_expert_intermediate_size;
  auto add = [&](std::string name, std::vector<int64_t> shape, HfRole role, int layer,
                 DType dt = DType::BF16) { v.push_back({std::move(name), std::move(shape), dt, role, layer}); };

  add(P + "embed_tokens.weight", {c.vocab_size, H}, HfRole::Embedding, -1);
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const std::string L = P + "layers." + std::to_string(i) + ".";
    add(L + "input_layernorm.weight", {H}, HfRole::Norm1p, i);
    add(L + "post_attention_layernorm.weight", {H}, HfRole::Norm1p, i);
    if (c.is_attention_layer(i)) {
      const int64_t qd = int64_t(c.num_attention_heads) * c.head_dim, kvd = int64_t(c.num_key_value_heads) * c.head_dim;
      add(L + "self_attn.q_proj.weight", {2 * qd, H}, HfRole::Linear, i);
      add(L + "self_attn.k_proj.weight", {kvd, H}, HfRole::Linear, i);
      add(L + "self_attn.v_proj.weight", {kvd, H}, HfRole::Linear, i);
      add(L + "self_attn.o_proj.weight", {H, qd}, HfRole::Linear, i);
      add(L + "self_attn.q_norm.weight", {c.head_dim}, HfRole::Norm1p, i);
      add(L + "self_attn.k_norm.weight", {c.head_dim}, HfRole::Norm1p, i);
    } else {
      const int64_t hv = c.linear_num_value_heads;
      add(L + "linear_attn.in_proj_qkv.weight", {c.gdn_conv_dim(), H}, HfRole::Linear, i);
      add(L + "linear_attn.in_proj_z.weight", {c.gdn_value_dim(), H}, HfRole::Linear, i);
      add(L + "linear_attn.in_proj_b.weight", {hv, H}, HfRole::Linear, i);
      add(L + "linear_attn.in_proj_a.weight", {hv, H}, HfRole::Linear, i);
      add(L + "linear_attn.conv1d.weight", {c.gdn_conv_dim(), 1, c.linear_conv_kernel_dim}, HfRole::Conv, i);
      add(L + "linear_attn.dt_bias", {hv}, HfRole::DtBias, i);
      add(L + "linear_attn.A_log", {hv}, HfRole::ALog, i, DType::F32);
      add(L + "linear_attn.norm.weight", {c.linear_value_head_dim}, HfRole::GatedNorm, i);
      add(L + "linear_attn.out_proj.weight", {H, c.gdn_value_dim()}, HfRole::Linear, i);
    }
    add(L + "mlp.gate.weight", {E, H}, HfRole::Router, i);
    add(L + "mlp.experts.gate_up_proj", {E, 2 * I, H}, HfRole::ExpertsGateUp, i);
    add(L + "mlp.experts.down_proj", {E, H, I}, HfRole::ExpertsDown, i);
    add(L + "mlp.shared_expert.gate_proj.weight", {Is, H}, HfRole::Linear, i);
    add(L + "mlp.shared_expert.up_proj.weight", {Is, H}, HfRole::Linear, i);
    add(L + "mlp.shared_expert.down_proj.weight", {H, Is}, HfRole::Linear, i);
    add(L + "mlp.shared_expert_gate.weight", {1, H}, HfRole::SharedGate, i);
  }
  add(P + "norm.weight", {H}, HfRole::Norm1p, -1);
  add("lm_head.weight", {c.vocab_size, H}, HfRole::LmHead, -1);
  return v;
}

std::string mlx_name_of(const std::string& hf_name) {
  const std::string P = "model.language_model.";
  if (hf_name.rfind(P, 0) == 0) return "language_model.model." + hf_name.substr(P.size());
  if (hf_name == "lm_head.weight") return "language_model.lm_head.weight";
  internal_fail(__FILE__, __LINE__, "known HF tensor name", fmt::format("no MLX name for {}", hf_name));
}

std::string module_of(const std::string& weight_name) {
  const std::string suffix = ".weight";
  if (weight_name.size() > suffix.size() &&
      weight_name.compare(weight_name.size() - suffix.size(), suffix.size(), suffix) == 0)
    return weight_name.substr(0, weight_name.size() - suffix.size());
  return weight_name;
}

}  // namespace fern
