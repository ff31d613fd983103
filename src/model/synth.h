// Deterministic random checkpoints of any configuration (`fern synth`), for tests, benchmarks and the built-in
// demo model. The same (config, seed) always gives the same values, whether written to disk in either layout or
// built straight into memory.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "model/loader.h"
#include "model/stream_tensor.h"
#include "model/weights.h"

namespace fern {

struct SynthOptions {
  uint64_t seed = 0;
  CheckpointFormat format = CheckpointFormat::Mlx4;
  // Multiplies the lm_head so that logits are peaked (top-1 comparisons become meaningful on random weights).
  float logit_scale = 1.0f;
  // Called with (bytes written, total bytes) while write_synth_checkpoint() writes (for a progress bar).
  std::function<void(uint64_t, uint64_t)> progress;
};

// Presets: "tiny" (milliseconds on the CPU; real head dims 256/128), "small" (a few hundred MB),
// "qwen3.6-35b-a3b" (the full size). Throws fern::Error for an unknown name.
ModelConfig synth_preset(const std::string& name);

// Writes a complete model directory: config.json, safetensors, tokenizer.json (copied from `tokenizer_json`
// when given), generation_config.json. Streams tensor by tensor with bounded memory.
void write_synth_checkpoint(const ModelConfig& cfg, const SynthOptions& opt, const std::string& out_dir,
                            const std::string& tokenizer_json = "");

// The same weights as write_synth_checkpoint(cfg, opt) would write, loaded, but built in host memory.
std::shared_ptr<ModelWeights> synth_weights(const ModelConfig& cfg, const SynthOptions& opt);

// Streaming form, for building the model straight into device memory without touching the disk: calls `fn`
// once per checkpoint tensor (a quantized weight comes as one StreamTensor whose three parts are
// <module>.weight U32, .scales BF16, .biases BF16), in file order, with exactly the names, dtypes, shapes and
// bytes that write_synth_checkpoint(cfg, opt) writes. Nothing is generated until the consumer calls
// StreamTensor::fill (or fill_parallel) for the rows it wants, into its own (e.g. pinned) buffers; any rows may
// be filled in any order and from several threads, always with the same bytes.
using SynthTensor = StreamTensor;
void synth_for_each_tensor(const ModelConfig& cfg, const SynthOptions& opt,
                           const std::function<void(const SynthTensor&)>& fn);

// The checkpoint config of a synthetic model in `format`: for Mlx4, `cfg` with mlx-lm's quantization settings.
ModelConfig synth_checkpoint_config(const ModelConfig& cfg, CheckpointFormat format);

// The fp32 value of element `index` (row-major) of HF tensor `name` of role-dependent scale: the generator that
// every layout is derived from (exposed for tests).
float synth_hf_value(const ModelConfig& cfg, const SynthOptions& opt, const std::string& name, int64_t index);

}  // namespace fern
