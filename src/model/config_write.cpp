// Writing config.json / generation_config.json for synthetic and converted checkpoints.
// Round trip (write -> parse) is tested by tests/model/test_config.cpp.
#include <nlohmann/json.hpp>

#include "model/config.h"

namespace fern {

namespace {

nlohmann::json quant_params_json(const QuantParams& p) {
  if (!p.enabled) return false;
  return {{"group_size", p.group_size}, {"bits", p.bits}};
}

}  // namespace

std::string model_config_to_json(const ModelConfig& c) {
  using nlohmann::ordered_json;
  ordered_json t;
  t["model_type"] = "qwen3_5_moe_text";
  t["vocab_size"] = c.vocab_size;
  t["hidden_size"] = c.hidden_size;
  t["num_hidden_layers"] = c.num_hidden_layers;
  std::vector<std::string> lt;
  for (auto x : c.layer_types) lt.push_back(x == LayerType::FullAttention ? "full_attention" : "linear_attention");
  t["layer_types"] = lt;
  t["num_attention_heads"] = c.num_attention_heads;
  t["num_key_value_heads"] = c.num_key_value_heads;
  t["head_dim"] = c.head_dim;
  t["attn_output_gate"] = true;
  t["attention_bias"] = false;
  t["hidden_act"] = "silu";
  t["rms_norm_eps"] = c.rms_norm_eps;
  ordered_json rope;
  rope["rope_type"] = "default";
  rope["rope_theta"] = c.rope_theta;
  rope["partial_rotary_factor"] = c.partial_rotary_factor;
  // The release's mRoPE split of the 32 rotary frequencies; text positions make it plain 1-D RoPE anyway.
  if (c.rotary_dim() == 64) {
    rope["mrope_section"] = {11, 11, 10};
    rope["mrope_interleaved"] = true;
  }
  t["rope_parameters"] = rope;
  t["max_position_embeddings"] = c.max_position_embeddings;
  t["linear_num_key_heads"] = c.linear_num_key_heads;
  t["linear_num_value_heads"] = c.linear_num_value_heads;
  t["linear_key_head_dim"] = c.linear_key_head_dim;
  t["linear_value_head_dim"] = c.linear_value_head_dim;
  t["linear_conv_kernel_dim"] = c.linear_conv_kernel_dim;
  t["mamba_ssm_dtype"] = "float32";
  t["num_experts"] = c.num_experts;
  t["num_experts_per_tok"] = c.num_experts_per_tok;
  t["moe_intermediate_size"] = c.moe_intermediate_size;
  t["shared_expert_intermediate_size"] = c.shared_expert_intermediate_size;
  t["mtp_num_hidden_layers"] = 0;
  t["tie_word_embeddings"] = c.tie_word_embeddings;
  t["dtype"] = "bfloat16";
  if (!c.eos_token_ids.empty()) t["eos_token_id"] = c.eos_token_ids.front();

  ordered_json top;
  top["architectures"] = {"Qwen3_5MoeForConditionalGeneration"};
  top["model_type"] = "qwen3_5_moe";
  top["tie_word_embeddings"] = c.tie_word_embeddings;
  top["text_config"] = t;
  if (c.quantization) {
    ordered_json q;
    q["group_size"] = c.quantization->defaults.group_size;
    q["bits"] = c.quantization->defaults.bits;
    q["mode"] = "affine";
    for (const auto& [module, p] : c.quantization->overrides) q[module] = quant_params_json(p);
    top["quantization"] = q;
    top["quantization_config"] = q;
  }
  return top.dump(2) + "\n";
}

std::string generation_config_to_json(const ModelConfig& c) {
  nlohmann::ordered_json g;
  if (!c.eos_token_ids.empty()) {
    g["bos_token_id"] = c.eos_token_ids.back();
    g["eos_token_id"] = c.eos_token_ids;
    g["pad_token_id"] = c.eos_token_ids.back();
  }
  g["do_sample"] = true;
  g["temperature"] = 1.0;
  g["top_k"] = 20;
  g["top_p"] = 0.95;
  return g.dump(2) + "\n";
}

}  // namespace fern
