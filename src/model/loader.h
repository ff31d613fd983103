// Loading a model directory (config.json + safetensors, single file or sharded) in either layout: the official
// HF bf16 layout or the MLX community affine 4-bit layout. Tensors are views into read-only mmaps; only small
// tensors are converted (norms +1 for HF, fp32 vectors, squeezed conv weights). See MODEL.md section 3.
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "model/weights.h"

namespace fern {

enum class CheckpointFormat { HfBf16, Mlx4 };

struct LoadOptions {
  // Called with (bytes done, bytes total) while binding/validating, for a progress bar.
  std::function<void(size_t, size_t)> progress;
};

class TensorSource;

// Mlx4 when config.json has `quantization`/`quantization_config` or the files hold MLX names
// (`language_model.model.*`, `*.scales`); HfBf16 otherwise.
CheckpointFormat detect_format(const std::string& model_dir);
std::shared_ptr<ModelWeights> load_model(const std::string& model_dir, const LoadOptions& opt = {});
// Binds the tensors of `src` (files or memory) in the given layout; every shape is checked against `cfg`.
std::shared_ptr<ModelWeights> bind_model(const ModelConfig& cfg, const TensorSource& src, CheckpointFormat format,
                                         const LoadOptions& opt = {});
const char* format_name(CheckpointFormat f);

}  // namespace fern
