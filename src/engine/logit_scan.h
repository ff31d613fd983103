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

// Indices of the k largest values of v[0, n) (k <= n), sorted by decreasing value, ties broken by the lower index.
// NaN must not occur. One pass that keeps at most 2k candidates above a rising threshold, skipping 16-value blocks
// whose largest value is below it: O(n) with a vectorized test for most of the vocabulary when k is small.
void top_k_indices(const float* v, size_t n, size_t k, std::vector<int32_t>& out);

}  // namespace fern
