// The passes the sampler makes over a vocabulary of logits (248,320 for Qwen3.6), written so that the compiler
// vectorizes them: one sampled token must cost microseconds, not the milliseconds of scalar loops with a double
// exp per token. Results are deterministic for a given build and machine; the order of exp_weights' sums follows
// the vector width, so another machine may differ in the last bits (as the CPU backend's logits do).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace fern {

struct LogitScan {
  bool has_nan = false;
  float max = -__builtin_inff();  // largest non-NaN value (-inf when there is none)
};

// NaN check and maximum in one pass.
LogitScan scan_logits(const float* v, size_t n);

// Index of the first element equal to `value` (n if none).
size_t first_index_of(const float* v, size_t n, float value);

// v[i] *= s for every i.
void scale_logits(float* v, size_t n, float s);

// exp(x) for x <= 0 in float, within 3e-7 relative of the exact value for x >= -87 (a degree-6 Taylor polynomial
// on [-ln2/2, ln2/2] after 2^n range reduction); 0 below -87 (e^-87 is 1.6e-38, nothing a sampler can pick),
// and for -inf.
float exp_nonpositive(float x);

// Sampling weights w[i] = exp(v[i] - max) for v[i] >= floor, else 0, with their sum per block of kWeightBlock
// entries in `block_sums`; returns the sum of the block sums (in block order, in double).
inline constexpr size_t kWeightBlock = 256;
double exp_weights(const float* v, size_t n, float max, float floor, float* w, std::vector<double>& block_sums);

// Order-preserving key of a float: a larger value has a larger key (-0 just below +0). NaN must not occur.
inline uint32_t order_key(float x) {
  const uint32_t bits = __builtin_bit_cast(uint32_t, x);
  return (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
}

// Value buckets: the top 12 bits of order_key (sign, exponent and 3 mantissa bits, so a bucket spans at most
// 1/8 of a power of two), numbered upward with the values.
inline constexpr int kValueBucketShift = 20;
inline constexpr size_t kValueBuckets = size_t(1) << (32 - kValueBucketShift);
inline uint32_t value_bucket(float x) { return order_key(x) >> kValueBucketShift; }

// mass[b] = the sum (in double) of w[i] over the i with value_bucket(v[i]) == b; `mass` gets kValueBuckets entries.
void value_bucket_masses(const float* v, const float* w, size_t n, std::vector<double>& mass);

// The indices i with value_bucket(v[i]) == bucket, sorted by decreasing value, ties by the lower index.
void bucket_indices_sorted(const float* v, size_t n, uint32_t bucket, std::vector<int32_t>& out);

// Indices of the k largest values of v[0, n) (k <= n), sorted by decreasing value, ties broken by the lower index.
// NaN must not occur. One pass that keeps at most 2k candidates above a rising threshold, skipping 16-value blocks
// whose largest value is below it: O(n) with a vectorized test for most of the vocabulary when k is small.
void top_k_indices(const float* v, size_t n, size_t k, std::vector<int32_t>& out);

}  // namespace fern
