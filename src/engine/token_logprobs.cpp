#include "engine/token_logprobs.h"

#include <cmath>

#include "core/error.h"
#include "engine/logit_scan.h"

namespace fern {

void LogprobCalculator::compute(std::span<const float> logits, int top_n) {
  FERN_CHECK(!logits.empty() && top_n >= 0, "logprobs of {} logits, top {}", logits.size(), top_n);
  logits_.assign(logits.begin(), logits.end());
  const size_t n = logits_.size();
  const LogitScan scan = scan_logits(logits_.data(), n);
  if (scan.has_nan) fail("the model produced NaN logits");
  if (!std::isfinite(scan.max)) {
    // +inf: that token has probability 1 (log 0), every other 0 (-inf); all -inf: nothing is defined, report 0.
    log_z_ = scan.max == INFINITY ? double(INFINITY) : 0.0;
  } else {
    weights_.resize(n);
    const double z = exp_weights(logits_.data(), n, scan.max, -INFINITY, weights_.data(), block_sums_);
    log_z_ = double(scan.max) + std::log(z);  // z >= 1: the maximum itself weighs exp(0)
  }
  top_k_indices(logits_.data(), n, static_cast<size_t>(top_n), top_);
}

TokenLogprob LogprobCalculator::entry(int32_t chosen) const {
  FERN_CHECK(chosen >= 0 && size_t(chosen) < logits_.size(), "logprob of token {} of {}", chosen, logits_.size());
  auto lp = [&](int32_t i) -> float {
    const double v = logits_[size_t(i)];
    if (std::isinf(log_z_)) return v == INFINITY ? 0.0f : -INFINITY;
    return static_cast<float>(v - log_z_);
  };
  TokenLogprob e;
  e.id = chosen;
  e.logprob = lp(chosen);
  e.top.reserve(top_.size());
  for (int32_t i : top_) e.top.emplace_back(i, lp(i));
  return e;
}

}  // namespace fern
