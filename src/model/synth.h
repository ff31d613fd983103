// Deterministic random checkpoints of any configuration (`fern synth`), for tests, benchmarks and the built-in
// demo model. The same (config, seed) always gives the same values, whether written to disk in either layout or
// built straight into memory.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "model/loader.h"
#include "model/weights.h"

namespace fern {

struct SynthOptions {
  uint64_t seed = 0;
  CheckpointFormat format = CheckpointFormat::Mlx4;
  // Multiplies the lm_head so that logits are peaked (top-1 comparisons become meaningful on random weights).
  float logit_scale = 1.0f;
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

}  // namespace fern
