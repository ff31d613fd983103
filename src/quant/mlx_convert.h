// HF bf16 layout -> MLX community affine layout, tensor by tensor, as mlx-lm's converter does it (MODEL.md 3b):
// names moved under language_model., fused experts split into switch_mlp.gate_proj/up_proj, every linear whose
// input width is a multiple of the group size quantized (router and shared-expert gate at 8 bits), zero-centred
// norms stored as bf16(1 + w), conv [C,1,K] -> [C,K,1], everything bf16 except A_log (F32).
// Both `fern quantize` and `fern synth --format mlx4` go through here, so the synthetic mlx4 checkpoint is by
// construction quantize(the synthetic HF checkpoint). Tested by tests/model/test_quant_convert.cpp.
#pragma once
#include <functional>
#include <vector>

#include "model/config.h"
#include "model/hf_layout.h"
#include "model/stream_tensor.h"

namespace fern {

// Reads rows [row0, row0+n) of an HF tensor (rows as in HfTensorSpec::rows) as fp32 values into out
// [n, spec.cols()]. Must be safe to call from several threads.
using HfRowReader = std::function<void(const HfTensorSpec& spec, int64_t row0, int64_t n, float* out)>;

// The quantization settings mlx-lm writes for this model: `bits`/`group_size` by default, 8 bits for every
// layer's router (mlp.gate) and shared-expert gate.
QuantConfig mlx_default_quant(const ModelConfig& cfg, int bits = 4, int group_size = 64);

// The MLX tensors for the HF tensor list `specs`, each filled from `read`.
std::vector<StreamTensor> mlx_stream_tensors(const ModelConfig& cfg, const std::vector<HfTensorSpec>& specs,
                                             const QuantConfig& quant, HfRowReader read);

// The HF tensors themselves (same names, shapes and dtypes), each filled from `read`.
std::vector<StreamTensor> hf_stream_tensors(const std::vector<HfTensorSpec>& specs, HfRowReader read);

}  // namespace fern
