// Token sampling on host logits: penalties, logit bias, temperature, top-k, top-p, min-p, and a seeded RNG so that
// a request with a seed is reproducible. temperature == 0 is greedy (argmax, lowest index on ties).
#pragma once
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ops/token_pick.h"

namespace fern {

struct SamplingParams {
  float temperature = 1.0f;         // 0 = greedy
  int top_k = 0;                    // 0 = off
  float top_p = 1.0f;               // 1 = off
  float min_p = 0.0f;               // 0 = off; keeps tokens with p >= min_p * p_max
  float presence_penalty = 0.0f;    // OpenAI: subtracted once from every token already generated
  float frequency_penalty = 0.0f;   // OpenAI: subtracted per occurrence in the generated tokens
  float repetition_penalty = 1.0f;  // HF/vLLM: divides positive (multiplies negative) logits of prompt+output tokens
  std::optional<uint64_t> seed;     // none = seeded from std::random_device
  std::vector<std::pair<int32_t, float>> logit_bias;  // added to the logit before everything else
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  // Tokens of the prompt (only the repetition penalty looks at them).
  void set_prompt(std::span<const int32_t> prompt);
  // Picks the next token. Modifies `logits` in place (penalties, temperature). Throws fern::Error on NaN logits.
  // A few passes over the vocabulary, vectorized (logit_scan.h): tens of microseconds at 248K tokens.
  int32_t sample(std::span<float> logits);
  // The same pick for a given uniform draw u in [0, 1) instead of the request's RNG (what a backend that picks
  // tokens where the logits are must match: Backend::pick). Every call of sample() makes exactly one draw.
  int32_t sample_at(std::span<float> logits, double u);
  // Records a generated token (for the penalties); call it for every token that is fed back.
  void accept(int32_t token);

  const SamplingParams& params() const { return p_; }
  // Uniform double in [0, 1) from the request's RNG (53 random bits, identical on every platform).
  double uniform();

 private:
  void apply_penalties(std::span<float> logits) const;
  // top-p alone when the 1,024 best tokens hold less than top_p of the mass (flat distributions); weights_ holds
  // every token's weight, z_all their sum, mx the largest (scaled) logit. Samples in the same order as a full sort
  // would, a bucket at a time.
  int32_t sample_nucleus_by_buckets(const float* v, size_t n, float mx, double z_all, double u);
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::unordered_map<int32_t, int> generated_counts_;
  std::unordered_set<int32_t> seen_;  // prompt + generated, for the repetition penalty
  std::vector<float> weights_;        // per token, reused from token to token (the vocabulary is ~1 MB of them)
  std::vector<double> block_sums_;
  std::vector<double> bucket_mass_;
  std::vector<int32_t> candidates_;
};

// The parameters of a backend's pick (ops/token_pick.h) for these sampling parameters (top-k only below the
// vocabulary's size, as the Sampler takes it; the seed as given, 0 when none), and back (logit bias and seed aside).
PickParams pick_params(const SamplingParams& p, int64_t vocab);
SamplingParams sampling_params(const PickParams& p);

// Index of the largest value (lowest index on ties); NaN values are never chosen.
int32_t argmax(std::span<const float> logits);

}  // namespace fern
