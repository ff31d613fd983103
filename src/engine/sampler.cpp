#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "engine/logit_scan.h"

namespace fern {

namespace {

uint64_t fresh_seed() {
  std::random_device rd;
  return (uint64_t(rd()) << 32) ^ uint64_t(rd());
}

}  // namespace

int32_t argmax(std::span<const float> logits) {
  const LogitScan scan = scan_logits(logits.data(), logits.size());
  if (!scan.has_nan && !logits.empty())  // the common case, vectorized; with NaN the scalar loop skips them
    return static_cast<int32_t>(first_index_of(logits.data(), logits.size(), scan.max));
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

PickParams pick_params(const SamplingParams& p, int64_t vocab) {
  PickParams k;
  k.temperature = p.temperature;
  k.top_k = p.top_k > 0 && p.top_k < vocab ? p.top_k : 0;
  k.top_p = p.top_p;
  k.min_p = p.min_p;
  k.presence_penalty = p.presence_penalty;
  k.frequency_penalty = p.frequency_penalty;
  k.repetition_penalty = p.repetition_penalty;
  k.seed = p.seed.value_or(0);
  return k;
}

SamplingParams sampling_params(const PickParams& k) {
  SamplingParams p;
  p.temperature = k.temperature;
  p.top_k = k.top_k;
  p.top_p = k.top_p;
  p.min_p = k.min_p;
  p.presence_penalty = k.presence_penalty;
  p.frequency_penalty = k.frequency_penalty;
  p.repetition_penalty = k.repetition_penalty;
  return p;
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

int32_t Sampler::sample(std::span<float> logits) { return sample_at(logits, uniform()); }

int32_t Sampler::sample_at(std::span<float> logits, double u) {
  FERN_CHECK(!logits.empty(), "sampling from empty logits");
  float* v = logits.data();
  const size_t n = logits.size();
  // The penalties cannot turn a number into NaN (every term is finite), so one scan after them checks for NaN
  // and finds the maximum.
  apply_penalties(logits);
  const LogitScan scan = scan_logits(v, n);
  if (scan.has_nan) fail("the model produced NaN logits");
  if (p_.temperature <= 0.0f) return static_cast<int32_t>(first_index_of(v, n, scan.max));

  const float inv_t = 1.0f / p_.temperature;
  scale_logits(v, n, inv_t);
  const float mx = scan.max * inv_t;  // rounding is monotonic: the largest scaled value
  if (!std::isfinite(mx)) return static_cast<int32_t>(first_index_of(v, n, mx));  // nothing to weigh
  const bool top_k = p_.top_k > 0 && static_cast<size_t>(p_.top_k) < n;

  if (!top_k && p_.top_p >= 1.0f) {
    // Every token weighs in (min-p aside): the weights in one vectorized pass, then a walk in index order that
    // skips whole blocks by their sums.
    const float floor = p_.min_p > 0.0f ? mx + std::log(p_.min_p) : -INFINITY;
    weights_.resize(n);
    const double total = exp_weights(v, n, mx, floor, weights_.data(), block_sums_);
    double r = u * total;
    for (size_t b = 0; b < block_sums_.size(); ++b) {
      if (r >= block_sums_[b]) {
        r -= block_sums_[b];
        continue;
      }
      const size_t hi = std::min(n, (b + 1) * kWeightBlock);
      for (size_t i = b * kWeightBlock; i < hi; ++i) {
        r -= weights_[i];
        if (r < 0) return static_cast<int32_t>(i);
      }
      // The block's sum was added in another order: a sliver of r is left for the next block.
    }
    for (size_t i = n; i-- > 0;)
      if (weights_[i] > 0.0f) return static_cast<int32_t>(i);
    return static_cast<int32_t>(first_index_of(v, n, mx));
  }

  // Candidates: the top-k (sorted), or for top-p alone the 64 or 1,024 best when they hold top_p of the mass
  // (exact, and avoids sorting the vocabulary), else value buckets.
  std::vector<int32_t>& cand = candidates_;
  double z_all = 0;
  if (top_k) {
    top_k_indices(v, n, static_cast<size_t>(p_.top_k), cand);
  } else {
    weights_.resize(n);
    z_all = exp_weights(v, n, mx, -INFINITY, weights_.data(), block_sums_);
    bool found = false;
    for (size_t k : {size_t(64), size_t(1024)}) {
      top_k_indices(v, n, std::min(k, n), cand);
      double mass = 0;
      for (int32_t i : cand) mass += std::exp(double(v[i] - mx));
      if (mass >= double(p_.top_p) * z_all || cand.size() == n) {
        found = true;
        break;
      }
    }
    if (!found) return sample_nucleus_by_buckets(v, n, mx, z_all, u);
  }

  // Normaliser over the candidate set (top-k renormalises; otherwise the whole vocabulary).
  if (p_.top_p < 1.0f) {
    double z = z_all;
    if (top_k) {
      z = 0;
      for (int32_t i : cand) z += std::exp(double(v[i] - mx));
    }
    double cum = 0;
    size_t keep = 0;
    while (keep < cand.size()) {
      cum += std::exp(double(v[cand[keep]] - mx)) / z;
      ++keep;
      if (cum >= double(p_.top_p)) break;
    }
    cand.resize(std::max<size_t>(keep, 1));
  }
  if (p_.min_p > 0.0f) {
    // p_i >= min_p * p_max  <=>  logit_i >= logit_max + log(min_p); the candidates are sorted, the first is the max.
    const float thr = v[cand.front()] + std::log(p_.min_p);
    std::erase_if(cand, [&](int32_t i) { return v[i] < thr; });
  }
  double total = 0;
  for (int32_t i : cand) total += std::exp(double(v[i] - mx));
  double r = u * total;
  for (int32_t i : cand) {
    r -= std::exp(double(v[i] - mx));
    if (r < 0) return i;
  }
  // Rounding left a sliver of mass: the last candidate with non-zero weight.
  for (auto it = cand.rbegin(); it != cand.rend(); ++it)
    if (std::exp(double(v[*it] - mx)) > 0) return *it;
  return cand.front();
}

int32_t Sampler::sample_nucleus_by_buckets(const float* v, size_t n, float mx, double z_all, double u) {
  // The nucleus in decreasing order of value, without sorting the vocabulary: value buckets hold contiguous ranges
  // of values, so walking their masses from the top bucket down is walking the sorted tokens a bucket at a time;
  // only the bucket where the nucleus ends and the bucket the draw lands in are sorted. Weights are weights_ (set
  // by the caller for every token), the same numbers the block sums were made of.
  value_bucket_masses(v, weights_.data(), n, bucket_mass_);
  const double target = double(p_.top_p) * z_all;
  double above = 0;  // mass of the buckets above the cut bucket
  size_t cut = kValueBuckets;
  while (cut-- > 0) {
    if (above + bucket_mass_[cut] >= target) break;
    above += bucket_mass_[cut];
  }
  if (cut >= kValueBuckets) {  // rounding kept the target out of reach: the whole vocabulary is the nucleus
    cut = 0;
    while (cut + 1 < kValueBuckets && bucket_mass_[cut] == 0.0) ++cut;
    above -= bucket_mass_[cut];
  }
  std::vector<int32_t>& in_cut = candidates_;
  bucket_indices_sorted(v, n, static_cast<uint32_t>(cut), in_cut);
  double total = above;
  size_t keep = 0;
  while (keep < in_cut.size()) {
    total += weights_[in_cut[keep]];
    ++keep;
    if (total >= target) break;
  }
  in_cut.resize(keep);

  double r = u * total;
  std::vector<int32_t> in_bucket;
  for (size_t b = kValueBuckets; b-- > cut + 1;) {
    if (bucket_mass_[b] == 0.0) continue;
    if (r >= bucket_mass_[b]) {
      r -= bucket_mass_[b];
      continue;
    }
    bucket_indices_sorted(v, n, static_cast<uint32_t>(b), in_bucket);
    for (int32_t i : in_bucket) {
      r -= weights_[i];
      if (r < 0) return i;
    }
    // The bucket's sum was added in another order: a sliver of r is left for the next bucket.
  }
  for (int32_t i : in_cut) {
    r -= weights_[i];
    if (r < 0) return i;
  }
  for (auto it = in_cut.rbegin(); it != in_cut.rend(); ++it)
    if (weights_[*it] > 0.0f) return *it;
  return static_cast<int32_t>(first_index_of(v, n, mx));
}

}  // namespace fern
