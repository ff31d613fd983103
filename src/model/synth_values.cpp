#include "model/synth_values.h"

#include <cmath>

#include "core/bf16.h"

namespace fern {
namespace {

inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

uint64_t synth_tensor_key(uint64_t seed, const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a over the name, then mixed with the seed
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ULL;
  return mix64(h ^ mix64(seed + 0x9e3779b97f4a7c15ULL));
}

float synth_unit(uint64_t key, uint64_t index) {
  const uint64_t z = mix64(key + (index + 1) * 0x9e3779b97f4a7c15ULL);
  return static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
}

SynthDist synth_distribution(const ModelConfig& cfg, const HfTensorSpec& spec, float logit_scale) {
  SynthDist d;
  d.bf16 = spec.dtype == DType::BF16;
  const float sqrt3 = std::sqrt(3.0f);
  // Uniform weights of standard deviation sigma have half-width sigma * sqrt(3).
  auto uniform_std = [&](double sigma) {
    d.kind = SynthDist::Kind::Uniform;
    d.center = 0.0f;
    d.half_width = static_cast<float>(sigma) * sqrt3;
  };
  switch (spec.role) {
    case HfRole::Embedding:
      uniform_std(1.0);  // the residual stream starts at RMS 1
      break;
    case HfRole::LmHead:
      uniform_std(logit_scale / std::sqrt(double(cfg.hidden_size)));  // logits ~ unit variance times the scale
      break;
    case HfRole::Linear:
    case HfRole::Router:
    case HfRole::SharedGate:
    case HfRole::ExpertsGateUp:
    case HfRole::ExpertsDown:
      // 1/sqrt(fan-in): a projection of a unit-RMS input has unit-RMS outputs, so attention scores, router
      // logits, beta/a gates and SwiGLU inputs all sit in the range where their nonlinearities are not saturated.
      uniform_std(1.0 / std::sqrt(double(spec.cols())));
      break;
    case HfRole::Norm1p:
      d.center = 0.0f;  // zero-centred: the gain 1 + w lies in [0.9, 1.1]
      d.half_width = 0.1f;
      break;
    case HfRole::GatedNorm:
      d.center = 1.0f;
      d.half_width = 0.1f;
      break;
    case HfRole::Conv:
      uniform_std(1.0 / std::sqrt(double(spec.cols())));  // fan-in = kernel taps
      break;
    case HfRole::ALog:
      d.kind = SynthDist::Kind::ALog;
      break;
    case HfRole::DtBias:
      d.kind = SynthDist::Kind::DtBias;
      break;
  }
  return d;
}

void synth_fill(const SynthDist& d, uint64_t key, int64_t first, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float u = synth_unit(key, static_cast<uint64_t>(first + i));
    float v;
    switch (d.kind) {
      case SynthDist::Kind::ALog:
        // A = exp(A_log) uniform in [1, 16] (the HF initialisation range).
        v = std::log(1.0f + 15.0f * u);
        break;
      case SynthDist::Kind::DtBias: {
        // softplus(dt_bias) = dt log-uniform in [1e-3, 1e-1] (the Mamba initialisation); with A in [1, 16] the
        // per-step decay exp(-A dt) spans about 0.2 .. 0.999, so some heads forget fast and some remember for
        // thousands of tokens.
        const float dt = std::exp(std::log(1e-3f) + u * (std::log(1e-1f) - std::log(1e-3f)));
        v = dt + std::log(-std::expm1(-dt));  // inverse softplus
        break;
      }
      default:
        v = d.center + d.half_width * (2.0f * u - 1.0f);
    }
    out[i] = d.bf16 ? round_bf16(v) : v;
  }
}

}  // namespace fern
