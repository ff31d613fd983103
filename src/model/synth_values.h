// Values of synthetic weights: a counter-based generator keyed by (seed, tensor name, element index), so any
// element, row or tensor can be generated alone, in any order and in parallel, with the same result; and the
// per-tensor value ranges that keep activations finite and non-degenerate (docs/FORMATS.md explains them).
#pragma once
#include <cstdint>
#include <string>

#include "model/config.h"
#include "model/hf_layout.h"

namespace fern {

struct SynthDist {
  enum class Kind : uint8_t { Uniform, ALog, DtBias } kind = Kind::Uniform;
  float center = 0.0f, half_width = 0.0f;  // Uniform: center + half_width * U(-1, 1)
  bool bf16 = true;                         // values rounded to bf16 (the tensor's dtype)
};

uint64_t synth_tensor_key(uint64_t seed, const std::string& name);
// Uniform in [0, 1) from the key and the element index (24 bits of a splitmix64 hash).
float synth_unit(uint64_t key, uint64_t index);

SynthDist synth_distribution(const ModelConfig& cfg, const HfTensorSpec& spec, float logit_scale);
// Elements [first, first + n) (row-major) of the tensor with this key and distribution.
void synth_fill(const SynthDist& d, uint64_t key, int64_t first, int64_t n, float* out);

}  // namespace fern
