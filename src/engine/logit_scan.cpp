#include "engine/logit_scan.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <utility>

#include "cpu/simd.h"

namespace fern {

namespace {

// Values per step of the scans (the compiler maps them onto whatever vector width it targets).
constexpr size_t kLanes = 16;

// exp(x) for -87 <= x <= 0 (callers clamp): x = n ln2 + f with |f| <= ln2/2, e^f by Horner on the degree-6 Taylor
// polynomial (truncation below f^7/7! = 1.2e-7), 2^n put into the exponent bits. ln2 is split as 0.693359375
// (9 bits, so n times it is exact) minus 2.12194440e-4.
FERN_CPU_INLINE float exp_clamped(float x) {
  const float t = x * 1.44269504088896341f;
  const float rounded = t + 12582912.0f;  // 1.5 * 2^23: the sum's low mantissa bits hold round(t)
  const float nf = rounded - 12582912.0f;
  const int32_t ni = std::bit_cast<int32_t>(rounded) - 0x4B400000;
  float f = x - nf * 0.693359375f;
  f = f + nf * 2.12194440e-4f;
  float p = 1.0f / 720.0f;
  p = p * f + 1.0f / 120.0f;
  p = p * f + 1.0f / 24.0f;
  p = p * f + 1.0f / 6.0f;
  p = p * f + 0.5f;
  p = p * f + 1.0f;
  p = p * f + 1.0f;
  return p * std::bit_cast<float>((ni + 127) << 23);  // n >= -126 for x >= -87: a normal power of two
}

constexpr float kExpFloor = -87.0f;

}  // namespace

FERN_CPU_CLONES LogitScan scan_logits(const float* v, size_t n) {
  float mx[kLanes];
  int nan[kLanes];
  for (size_t j = 0; j < kLanes; ++j) {
    mx[j] = -INFINITY;
    nan[j] = 0;
  }
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
#pragma omp simd
    for (size_t j = 0; j < kLanes; ++j) {
      const float x = v[i + j];
      nan[j] |= x != x;
      mx[j] = x > mx[j] ? x : mx[j];
    }
  }
  LogitScan s;
  for (; i < n; ++i) {
    const float x = v[i];
    s.has_nan |= x != x;
    s.max = x > s.max ? x : s.max;
  }
  for (size_t j = 0; j < kLanes; ++j) {
    s.has_nan |= nan[j] != 0;
    s.max = mx[j] > s.max ? mx[j] : s.max;
  }
  return s;
}

FERN_CPU_CLONES size_t first_index_of(const float* v, size_t n, float value) {
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    int hit = 0;
#pragma omp simd reduction(| : hit)
    for (size_t j = 0; j < kLanes; ++j) hit |= v[i + j] == value;
    if (hit) break;
  }
  for (; i < n; ++i)
    if (v[i] == value) return i;
  return n;
}

FERN_CPU_CLONES void scale_logits(float* v, size_t n, float s) {
  for (size_t i = 0; i < n; ++i) v[i] *= s;
}

float exp_nonpositive(float x) { return x < kExpFloor ? 0.0f : exp_clamped(x); }

FERN_CPU_CLONES double exp_weights(const float* v, size_t n, float max, float floor, float* w,
                                   std::vector<double>& block_sums) {
  const size_t nb = (n + kWeightBlock - 1) / kWeightBlock;
  block_sums.assign(nb, 0.0);
  double total = 0.0;
  for (size_t b = 0; b < nb; ++b) {
    const size_t lo = b * kWeightBlock, hi = std::min(n, lo + kWeightBlock);
    // A block's sum in float (each lane adds kWeightBlock / width weights, so it is within ~32 ulp of the exact
    // sum: 2e-6 relative at worst, like the weights' own 3e-7), the blocks' sums in double.
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (size_t i = lo; i < hi; ++i) {
      const float x = v[i], d = x - max;
      const float e = exp_clamped(d < kExpFloor ? kExpFloor : d);  // -inf clamps too
      const bool keep = (x >= floor) & (d >= kExpFloor);             // a select, not a branch
      const float wt = keep ? e : 0.0f;
      w[i] = wt;
      s += wt;
    }
    block_sums[b] = double(s);
    total += double(s);
  }
  return total;
}

namespace {

using Entry = std::pair<float, int32_t>;

bool better(const Entry& a, const Entry& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); }

// Keeps the k best entries of `buf` and returns the worst of them (rare: once per k entries that got in).
[[gnu::noinline]] float keep_best(std::vector<Entry>& buf, size_t k) {
  std::nth_element(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(k - 1), buf.end(), better);
  buf.resize(k);
  return buf[k - 1].first;
}

}  // namespace

FERN_CPU_CLONES void top_k_indices(const float* v, size_t n, size_t k, std::vector<int32_t>& out) {
  out.clear();
  k = std::min(k, n);
  if (k == 0) return;
  std::vector<Entry> buf;
  const size_t cap = 2 * k;
  buf.reserve(std::min(n, cap) + kLanes);
  // Until the buffer first fills, every value enters (thr = -inf lets -inf in too: `full` is false). Afterwards
  // thr is the k-th best value seen so far; values are visited in index order, so a later value equal to thr
  // loses the tie to every kept one: only values above thr can enter.
  float thr = -INFINITY;
  bool full = false;
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    if (full) {
      int above = 0;
#pragma omp simd reduction(| : above)
      for (size_t j = 0; j < kLanes; ++j) above |= v[i + j] > thr;
      if (!above) continue;
    }
    for (size_t j = 0; j < kLanes; ++j) {
      const float x = v[i + j];
      if (full && !(x > thr)) continue;
      buf.emplace_back(x, static_cast<int32_t>(i + j));
    }
    if (buf.size() >= cap && buf.size() < n) {  // at most kLanes past cap: the reserve holds them
      thr = keep_best(buf, k);
      full = true;
    }
  }
  for (; i < n; ++i)
    if (!full || v[i] > thr) buf.emplace_back(v[i], static_cast<int32_t>(i));
  std::sort(buf.begin(), buf.end(), better);
  if (buf.size() > k) buf.resize(k);
  out.resize(buf.size());
  for (size_t j = 0; j < buf.size(); ++j) out[j] = buf[j].second;
}

void value_bucket_masses(const float* v, const float* w, size_t n, std::vector<double>& mass) {
  // Four histograms taken in turn, so that neighbouring tokens in one bucket do not wait on each other's add.
  constexpr size_t kWays = 4;
  std::vector<double> ways(kWays * kValueBuckets, 0.0);
  size_t i = 0;
  for (; i + kWays <= n; i += kWays)
    for (size_t j = 0; j < kWays; ++j) ways[j * kValueBuckets + value_bucket(v[i + j])] += double(w[i + j]);
  for (; i < n; ++i) ways[value_bucket(v[i])] += double(w[i]);
  mass.assign(kValueBuckets, 0.0);
  for (size_t b = 0; b < kValueBuckets; ++b)
    for (size_t j = 0; j < kWays; ++j) mass[b] += ways[j * kValueBuckets + b];
}

void bucket_indices_sorted(const float* v, size_t n, uint32_t bucket, std::vector<int32_t>& out) {
  out.clear();
  for (size_t i = 0; i < n; ++i)
    if (value_bucket(v[i]) == bucket) out.push_back(static_cast<int32_t>(i));
  std::sort(out.begin(), out.end(), [&](int32_t a, int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
}

}  // namespace fern
