// Log-probabilities of the model's next-token distribution for the API's `logprobs` / `top_logprobs`: the
// log-softmax of the raw logits (before penalties, logit bias and temperature, as vLLM reports by default), for
// the chosen token and the most likely ones.
#pragma once
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace fern {

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0;                                 // of `id`
  std::vector<std::pair<int32_t, float>> top;        // the most likely tokens, best first (ties: lower id)
};

class LogprobCalculator {
 public:
  // Reads the logits (F32 [vocab]); throws fern::Error on NaN. A copy and three passes over the vocabulary
  // (0.13-0.15 ms at 248K on the 2-core development machine).
  void compute(std::span<const float> logits, int top_n);
  // After compute(): the entry for the token that was picked.
  TokenLogprob entry(int32_t chosen) const;

 private:
  std::vector<float> logits_;     // a copy: the sampler scales its logits in place afterwards
  std::vector<float> weights_;
  std::vector<double> block_sums_;
  std::vector<int32_t> top_;
  double log_z_ = 0;              // max + log(sum of exp(logit - max))
};

}  // namespace fern
