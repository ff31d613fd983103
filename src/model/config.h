// ModelConfig: the text model's hyper-parameters, parsed from a checkpoint's config.json (MODEL.md section 1).
// Parsing accepts nested `text_config` or a flat config, `layer_types` or `full_attention_interval`,
// `rope_parameters` or the legacy rope spellings, and `quantization` / `quantization_config` with per-module
// overrides. Every size is validated (positive, bounded, products checked in 64 bits) and an error names the key.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace fern {

enum class LayerType : uint8_t { LinearAttention, FullAttention };

// MLX affine quantization parameters of one module (or the checkpoint default).
struct QuantParams {
  int bits = 4;
  int group_size = 64;
  bool enabled = true;  // false for a module the converter left in floating point (override value `false`)
};

struct QuantConfig {
  QuantParams defaults;                              // top-level "bits" / "group_size"
  std::map<std::string, QuantParams> overrides;      // module path (no ".weight") -> params
  // Params for a module path like "language_model.model.layers.3.mlp.gate".
  QuantParams for_module(const std::string& module_path) const;
};

struct ModelConfig {
  std::string model_type;              // "qwen3_5_moe_text", "qwen3_5_moe", "qwen3_next", ...
  int64_t vocab_size = 248320;
  int64_t hidden_size = 2048;
  int num_hidden_layers = 40;
  std::vector<LayerType> layer_types;  // size num_hidden_layers

  // Gated attention (full_attention layers).
  int num_attention_heads = 16;
  int num_key_value_heads = 2;
  int head_dim = 256;
  double rope_theta = 1e7;
  double partial_rotary_factor = 0.25;
  int rotary_dim() const { return static_cast<int>(head_dim * partial_rotary_factor); }
  int64_t max_position_embeddings = 262144;

  // Gated DeltaNet (linear_attention layers).
  int linear_num_key_heads = 16;
  int linear_num_value_heads = 32;
  int linear_key_head_dim = 128;
  int linear_value_head_dim = 128;
  int linear_conv_kernel_dim = 4;
  int64_t gdn_key_dim() const { return int64_t(linear_num_key_heads) * linear_key_head_dim; }
  int64_t gdn_value_dim() const { return int64_t(linear_num_value_heads) * linear_value_head_dim; }
  int64_t gdn_conv_dim() const { return 2 * gdn_key_dim() + gdn_value_dim(); }

  // Mixture of experts (every layer).
  int num_experts = 256;
  int num_experts_per_tok = 8;
  int moe_intermediate_size = 512;
  int shared_expert_intermediate_size = 512;
  bool norm_topk_prob = true;          // Qwen3.5 always renormalises

  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  std::vector<int32_t> eos_token_ids;  // from config / generation_config; empty if unknown

  std::optional<QuantConfig> quantization;  // present for MLX checkpoints

  bool is_attention_layer(int layer) const { return layer_types.at(layer) == LayerType::FullAttention; }
  int num_attention_layers() const;
  int num_linear_layers() const { return num_hidden_layers - num_attention_layers(); }
};

// Parses config.json text. `source` names the file in error messages.
ModelConfig parse_model_config(const std::string& json_text, const std::string& source);
// Reads eos ids from generation_config.json text (`eos_token_id`: int or list); empty when absent.
std::vector<int32_t> parse_generation_eos(const std::string& json_text, const std::string& source);
// config.json text for `cfg` in the official nested layout (top-level qwen3_5_moe + text_config), with
// `quantization` and `quantization_config` when cfg.quantization is set (as mlx-lm writes them).
std::string model_config_to_json(const ModelConfig& cfg);
// generation_config.json text (eos ids and the released sampling defaults).
std::string generation_config_to_json(const ModelConfig& cfg);
// Checks a configuration built in code (presets) with the same rules as the parser; `source` names it.
void validate_model_config(const ModelConfig& cfg, const std::string& source);
// Reads <dir>/config.json (and generation_config.json for eos ids when present).
ModelConfig load_model_config(const std::string& model_dir);

}  // namespace fern
