// The sampler's vectorized vocabulary passes (engine/logit_scan.h) against plain references: the NaN scan and the
// maximum, the first index of a value, exp of non-positive numbers against the double exp, the sampling weights
// and their block sums, the top-k selection against a full sort, and the value buckets of top-p's flat path, at
// the real vocabulary size and at lengths that leave partial vector steps and partial weight blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/logit_scan.h"
#include "test_util.h"

namespace fern {
namespace {

constexpr size_t kVocab = 248320;  // Qwen3.6's padded vocabulary
// Lengths around the 16-value steps and the 256-value weight blocks, and the demo tokenizer's vocabulary + 3.
constexpr size_t kLengths[] = {1, 2, 15, 16, 17, 255, 256, 257, 1000, 151939, kVocab};

TEST(LogitScan, ScanFindsTheMaximumAndAnyNaN) {
  for (size_t n : kLengths) {
    std::vector<float> v = test::randn(n, 100 + n, 3.0f);
    LogitScan s = scan_logits(v.data(), n);
    EXPECT_FALSE(s.has_nan) << n;
    EXPECT_EQ(s.max, *std::max_element(v.begin(), v.end())) << n;
    for (size_t at : {size_t(0), n / 2, n - 1}) {
      std::vector<float> w = v;
      w[at] = NAN;
      EXPECT_TRUE(scan_logits(w.data(), n).has_nan) << n << " at " << at;
    }
  }
  std::vector<float> ninf(37, -INFINITY);
  EXPECT_EQ(scan_logits(ninf.data(), ninf.size()).max, -INFINITY);
  ninf[30] = INFINITY;
  EXPECT_EQ(scan_logits(ninf.data(), ninf.size()).max, INFINITY);
  EXPECT_EQ(scan_logits(nullptr, 0).max, -INFINITY);
}

TEST(LogitScan, FirstIndexOfFindsTheLowestPosition) {
  for (size_t n : kLengths) {
    std::vector<float> v = test::randn(n, 200 + n, 1.0f);
    for (size_t at : {size_t(0), n / 3, n - 1}) {
      std::vector<float> w = v;
      w[at] = 42.0f;
      if (at + 5 < n) w[at + 5] = 42.0f;  // a later copy must not be the one found
      EXPECT_EQ(first_index_of(w.data(), n, 42.0f), at) << n;
    }
    EXPECT_EQ(first_index_of(v.data(), n, 42.0f), n) << n;
  }
}

// Bound: the degree-6 Taylor polynomial's truncation is below 1.2e-7 on |f| <= ln2/2, and the range reduction and
// seven float operations add a few roundings of 6e-8 each; 3e-7 leaves no room for a wrong coefficient or a wrong
// power of two (either is off by far more).
TEST(LogitScan, ExpOfNonPositiveNumbersWithin3e7) {
  double worst = 0;
  for (int i = 0; i <= 2000000; ++i) {
    const float x = -87.0f * float(i) / 2000000.0f;
    const double want = std::exp(double(x));
    worst = std::max(worst, std::abs(double(exp_nonpositive(x)) - want) / want);
  }
  for (float x : {-0.0f, -1e-30f, -1e-7f, -0.34657359f, -0.34657360f, -0.6931472f, -86.99f, -87.0f}) {
    const double want = std::exp(double(x));
    worst = std::max(worst, std::abs(double(exp_nonpositive(x)) - want) / want);
  }
  EXPECT_LT(worst, 3e-7);
  EXPECT_EQ(exp_nonpositive(-87.5f), 0.0f);
  EXPECT_EQ(exp_nonpositive(-INFINITY), 0.0f);
  EXPECT_EQ(exp_nonpositive(0.0f), 1.0f);
}

TEST(LogitScan, WeightsAndBlockSumsMatchDoubleExp) {
  for (size_t n : kLengths) {
    std::vector<float> v = test::randn(n, 300 + n, 4.0f);
    if (n > 20) v[7] = -INFINITY;  // a masked token weighs nothing
    const float mx = *std::max_element(v.begin(), v.end());
    for (float floor : {-INFINITY, mx - 3.0f}) {
      std::vector<float> w(n);
      std::vector<double> blocks;
      const double total = exp_weights(v.data(), n, mx, floor, w.data(), blocks);
      ASSERT_EQ(blocks.size(), (n + kWeightBlock - 1) / kWeightBlock);
      double ref_total = 0, worst = 0, block_worst = 0, block_sum_of_blocks = 0;
      for (size_t b = 0; b < blocks.size(); ++b) {
        double ref_block = 0;
        for (size_t i = b * kWeightBlock; i < std::min(n, (b + 1) * kWeightBlock); ++i) {
          const bool zero = !(v[i] >= floor) || v[i] - mx < -87.0f;  // below the floor, -inf, or below e^-87
          // The difference in float, as the sampler always took it (its rounding is the logits' business).
          const double want = zero ? 0.0 : std::exp(double(v[i] - mx));
          if (zero) {
            EXPECT_EQ(w[i], 0.0f) << n << " " << i;
          } else {
            worst = std::max(worst, std::abs(double(w[i]) - want) / want);
          }
          ref_block += want;
        }
        // Each block's float sum: within 32 roundings of the exact sum of its weights (2e-6), plus their 3e-7.
        if (ref_block > 0) block_worst = std::max(block_worst, std::abs(blocks[b] - ref_block) / ref_block);
        ref_total += ref_block;
        block_sum_of_blocks += blocks[b];
      }
      EXPECT_LT(worst, 3e-7) << n;
      EXPECT_LT(block_worst, 3e-6) << n;
      EXPECT_EQ(total, block_sum_of_blocks) << n;
      EXPECT_LT(std::abs(total - ref_total) / ref_total, 3e-6) << n;
    }
  }
}

// The reference: a full sort by (value descending, index ascending).
std::vector<int32_t> sorted_top(const std::vector<float>& v, size_t k) {
  std::vector<int32_t> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return v[a] > v[b]; });
  idx.resize(std::min(k, v.size()));
  return idx;
}

TEST(LogitScan, TopKEqualsAFullSortWithTiesAndInfinities) {
  for (size_t n : {size_t(1), size_t(17), size_t(1000), kVocab}) {
    std::vector<float> v = test::randn(n, 400 + n, 3.0f);
    std::vector<float> coarse = v;  // values on a 0.25 grid: thousands of ties at every rank
    for (float& x : coarse) x = std::round(x * 4.0f) / 4.0f;
    if (n > 20) {
      coarse[3] = -INFINITY;
      coarse[n - 2] = -INFINITY;
      coarse[n / 2] = INFINITY;
    }
    for (const auto* values : {&v, &coarse}) {
      for (size_t k : {size_t(1), size_t(2), size_t(20), size_t(64), size_t(1024), size_t(16384), n - 1, n, n + 5}) {
        if (k == 0 || (k > 16384 && n == kVocab && k < n)) continue;  // n - 1 at the full size: slow, nothing new
        std::vector<int32_t> got;
        top_k_indices(values->data(), n, k, got);
        EXPECT_EQ(got, sorted_top(*values, k)) << "n " << n << " k " << k << (values == &v ? "" : " coarse");
      }
    }
  }
  std::vector<float> ninf(40, -INFINITY);  // every value -inf: the lowest indices, in order
  std::vector<int32_t> got;
  top_k_indices(ninf.data(), ninf.size(), 5, got);
  EXPECT_EQ(got, (std::vector<int32_t>{0, 1, 2, 3, 4}));
}

TEST(LogitScan, OrderKeysAndValueBuckets) {
  const std::vector<float> ordered = {-INFINITY, -3.0e38f, -2.5f, -1.0f, -1e-30f, -0.0f, 0.0f, 1e-30f,
                                      1.0f,      1.124f,   1.126f, 2.0f, 3.0e38f, INFINITY};
  for (size_t i = 0; i + 1 < ordered.size(); ++i)
    EXPECT_LT(order_key(ordered[i]), order_key(ordered[i + 1])) << ordered[i] << " " << ordered[i + 1];
  EXPECT_EQ(value_bucket(1.0f), value_bucket(1.124f));  // a bucket spans 1/8 of a power of two: [1, 1.125)
  EXPECT_LT(value_bucket(1.124f), value_bucket(1.126f));

  for (size_t n : {size_t(17), size_t(1000), kVocab}) {
    std::vector<float> v = test::randn(n, 500 + n, 2.0f);
    for (size_t i = 0; i < n; i += 7) v[i] = std::round(v[i] * 8.0f) / 8.0f;  // ties inside buckets
    std::vector<float> w = test::randu(n, 600 + n, 0.0f, 1.0f);
    std::vector<double> mass;
    value_bucket_masses(v.data(), w.data(), n, mass);
    ASSERT_EQ(mass.size(), kValueBuckets);
    std::vector<double> want(kValueBuckets, 0.0);
    for (size_t i = 0; i < n; ++i) want[value_bucket(v[i])] += double(w[i]);
    for (size_t b = 0; b < kValueBuckets; ++b) EXPECT_NEAR(mass[b], want[b], 1e-12 * (1.0 + want[b])) << b;

    std::vector<int32_t> all(n);
    std::iota(all.begin(), all.end(), 0);
    std::stable_sort(all.begin(), all.end(), [&](int32_t a, int32_t b) { return v[a] > v[b]; });
    for (uint32_t bucket : {value_bucket(v[0]), value_bucket(v[n / 2]), value_bucket(0.3f), value_bucket(-9.0f)}) {
      std::vector<int32_t> got, ref;
      bucket_indices_sorted(v.data(), n, bucket, got);
      for (int32_t i : all)
        if (value_bucket(v[i]) == bucket) ref.push_back(i);
      EXPECT_EQ(got, ref) << "n " << n << " bucket " << bucket;
    }
  }
}

}  // namespace
}  // namespace fern
