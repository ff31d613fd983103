// Tokens picked where the logits are (Backend::pick): the parameters, and the uniform draw each pick uses. The
// rule is the host Sampler's (engine/sampler.h, Sampler::sample_at) for the same draw, penalties included: a
// backend that picks on the device saves the copy of the logits to the host (1 MB at 248K tokens) and the host's
// passes over them. Plain C++ without fmt, so that .cu files include it.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define FERN_PICK_HD __host__ __device__
#else
#define FERN_PICK_HD
#endif

namespace fern {

struct PickParams {
  float temperature = 1.0f;   // 0 = greedy
  int top_k = 0;              // 0 = off; at most kPickMaxTopK
  float top_p = 1.0f;         // 1 = off
  float min_p = 0.0f;         // 0 = off
  float presence_penalty = 0.0f;    // as SamplingParams (engine/sampler.h)
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  uint64_t seed = 0;          // the request's draws are pick_uniform(seed, 0), (seed, 1), ...
  uint64_t draw = 0;          // the draw of the next pick
};

// Limits of the device form: top-k from per-block candidate lists of at most this many tokens, and logit-bias
// entries held on the device.
inline constexpr int kPickMaxTopK = 64;
inline constexpr int kPickMaxBias = 1024;

// Draw number `draw` of `seed` as a uniform double in [0, 1): 53 bits of a splitmix64 finaliser of the pair, the
// same bits on the host and the device.
FERN_PICK_HD inline double pick_uniform(uint64_t seed, uint64_t draw) {
  uint64_t z = seed + (draw + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return double(z >> 11) * (1.0 / 9007199254740992.0);
}

}  // namespace fern
