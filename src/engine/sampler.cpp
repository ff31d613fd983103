#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace fern {

namespace {

uint64_t fresh_seed() {
  std::random_device rd;
  return (uint64_t(rd()) << 32) ^ uint64_t(rd());
}

// Indices of the `k` largest logits, sorted by decreasing logit (ties: lower index first).
void top_indices(std::span<const float> logits, size_t k, std::vector<int32_t>& idx) {
  idx.resize(logits.size());
  std::iota(idx.begin(), idx.end(), 0);
  auto better = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  k = std::min(k, idx.size());
  if (k * 4 >= idx.size()) {
    std::sort(idx.begin(), idx.end(), better);  // a heap-based partial sort of most of the array is slower
  } else {
    std::nth_element(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(k), idx.end(), better);
    std::sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(k), better);
  }
  idx.resize(k);
}

}  // namespace

int32_t argmax(std::span<const float> logits) {
  int32_t best = -1;
  float bv = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    float v = logits[i];
    if (std::isnan(v)) continue;
    if (best < 0 || v > bv) {
      best = static_cast<int32_t>(i);
      bv = v;
    }
  }
  if (best < 0) fail("the model produced NaN logits for every token");
  return best;
}

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed ? *p.seed : fresh_seed()) {}

void Sampler::set_prompt(std::span<const int32_t> prompt) {
  if (p_.repetition_penalty == 1.0f) return;
  seen_.insert(prompt.begin(), prompt.end());
}

void Sampler::accept(int32_t token) {
  generated_counts_[token]++;
  if (p_.repetition_penalty != 1.0f) seen_.insert(token);
}

double Sampler::uniform() { return double(rng_() >> 11) * 0x1.0p-53; }

void Sampler::apply_penalties(std::span<float> logits) const {
  const int64_t V = static_cast<int64_t>(logits.size());
  for (auto [tok, bias] : p_.logit_bias)
    if (tok >= 0 && tok < V) logits[tok] += bias;
  if (p_.repetition_penalty != 1.0f) {
    for (int32_t t : seen_) {
      if (t < 0 || t >= V) continue;
      float& l = logits[t];
      l = l > 0 ? l / p_.repetition_penalty : l * p_.repetition_penalty;
    }
  }
  if (p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f) {
    for (auto [t, n] : generated_counts_) {
      if (t < 0 || t >= V) continue;
      logits[t] -= p_.presence_penalty + p_.frequency_penalty * float(n);
    }
  }
}

int32_t Sampler::sample(std::span<float> logits) {
  FERN_CHECK(!logits.empty(), "sampling from empty logits");
  for (float v : logits)
    if (std::isnan(v)) fail("the model produced NaN logits");
  apply_penalties(logits);
  if (p_.temperature <= 0.0f) return argmax(logits);

  const float inv_t = 1.0f / p_.temperature;
  float mx = -INFINITY;
  for (float& v : logits) {
    v *= inv_t;
    mx = std::max(mx, v);
  }
  if (!std::isfinite(mx)) return argmax(logits);  // every logit -inf (or +inf): nothing to weigh

  // Candidates: the top-k (sorted), or for top-p alone a sorted prefix grown until it holds top_p of the mass
  // (exact, and avoids sorting the whole vocabulary on every token), or every token.
  std::vector<int32_t> cand;
  bool sorted = false;
  double z_all = 0;
  if (p_.top_k == 0 && p_.top_p < 1.0f)
    for (float v : logits) z_all += std::exp(double(v - mx));
  if (p_.top_k > 0) {
    top_indices(logits, static_cast<size_t>(p_.top_k), cand);
    sorted = true;
  } else if (p_.top_p < 1.0f) {
    // Past a few thousand candidates the distribution is flat: one full sort is cheaper than more doubling.
    for (size_t k = 256;; k = k >= 4096 ? logits.size() : k * 4) {
      top_indices(logits, k, cand);
      double mass = 0;
      for (int32_t i : cand) mass += std::exp(double(logits[i] - mx));
      if (mass >= double(p_.top_p) * z_all || cand.size() == logits.size()) break;
    }
    sorted = true;
  } else {
    cand.resize(logits.size());
    std::iota(cand.begin(), cand.end(), 0);
  }

  // Normaliser over the candidate set (top-k renormalises; otherwise the whole vocabulary).
  if (sorted && p_.top_p < 1.0f) {
    double z = z_all;
    if (p_.top_k > 0) {
      z = 0;
      for (int32_t i : cand) z += std::exp(double(logits[i] - mx));
    }
    double cum = 0;
    size_t keep = 0;
    while (keep < cand.size()) {
      cum += std::exp(double(logits[cand[keep]] - mx)) / z;
      ++keep;
      if (cum >= double(p_.top_p)) break;
    }
    cand.resize(std::max<size_t>(keep, 1));
  }
  if (p_.min_p > 0.0f) {
    // p_i >= min_p * p_max  <=>  logit_i >= logit_max + log(min_p); the max is the first candidate or mx.
    float best = -INFINITY;
    for (int32_t i : cand) best = std::max(best, logits[i]);
    const float thr = best + std::log(p_.min_p);
    std::erase_if(cand, [&](int32_t i) { return logits[i] < thr; });
  }
  double total = 0;
  for (int32_t i : cand) total += std::exp(double(logits[i] - mx));
  double r = uniform() * total;
  for (int32_t i : cand) {
    r -= std::exp(double(logits[i] - mx));
    if (r < 0) return i;
  }
  // Rounding left a sliver of mass: the last candidate with non-zero weight.
  for (auto it = cand.rbegin(); it != cand.rend(); ++it)
    if (std::exp(double(logits[*it] - mx)) > 0) return *it;
  return cand.front();
}

}  // namespace fern
