// The tensors of the official HF bf16 layout for a configuration (MODEL.md 3a), in file order, and their MLX
// names (MODEL.md 3b). The synthetic generator writes exactly this list; the quantizer and the mlx4 generator
// convert it tensor by tensor.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"

namespace fern {

enum class HfRole : uint8_t {
  Embedding,     // embed_tokens [V, H]
  LmHead,        // lm_head [V, H]
  Linear,        // a projection [out, in]
  Router,        // mlp.gate [E, H] (8-bit in MLX files)
  SharedGate,    // mlp.shared_expert_gate [1, H] (8-bit in MLX files)
  ExpertsGateUp, // mlp.experts.gate_up_proj [E, 2I, H] (MLX: switch_mlp.gate_proj and up_proj)
  ExpertsDown,   // mlp.experts.down_proj [E, H, I]
  Norm1p,        // zero-centred RMSNorm weight (MLX stores 1 + w)
  GatedNorm,     // linear_attn.norm.weight, plain
  Conv,          // linear_attn.conv1d.weight [C, 1, K] (MLX: [C, K, 1], same bytes)
  ALog,          // linear_attn.A_log [Hv], F32
  DtBias,        // linear_attn.dt_bias [Hv]
};

struct HfTensorSpec {
  std::string name;             // full HF name, e.g. "model.language_model.layers.0.linear_attn.A_log"
  std::vector<int64_t> shape;
  DType dtype = DType::BF16;
  HfRole role = HfRole::Linear;
  int layer = -1;               // -1 for embedding, final norm and lm_head
  int64_t rows() const;         // product of all dims but the last
  int64_t cols() const { return shape.back(); }
};

// HF names use prefix "model.language_model." (the multimodal release); lm_head is "lm_head.weight".
std::vector<HfTensorSpec> hf_tensor_specs(const ModelConfig& cfg);

// "model.language_model.X" -> "language_model.model.X", "lm_head.weight" -> "language_model.lm_head.weight".
std::string mlx_name_of(const std::string& hf_name);
// Module path (name without ".weight") of a linear weight.
std::string module_of(const std::string& weight_name);

}  // namespace fern
