// Log-probabilities for the API: the log-softmax of the raw logits against a double reference at the real
// vocabulary, the most likely tokens against a full sort (ties to the lower id), the chosen token's entry, and
// the edge cases (NaN is an error; +inf takes all the probability).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "engine/token_logprobs.h"
#include "test_util.h"

namespace fern {
namespace {

TEST(TokenLogprobs, LogSoftmaxAndTopMatchDoubleReference) {
  for (size_t n : {size_t(5), size_t(1000), size_t(248320)}) {
    for (float scale : {0.5f, 4.0f}) {
      std::vector<float> l = test::randn(n, 900 + n, scale);
      if (n > 10) l[3] = l[7];  // a tie among the candidates
      double mx = *std::max_element(l.begin(), l.end()), z = 0;
      for (float x : l) z += std::exp(double(x) - mx);
      const double log_z = mx + std::log(z);
      std::vector<int32_t> order(n);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });

      LogprobCalculator calc;
      calc.compute(l, 5);
      for (int32_t chosen : {order[0], order[n / 2], int32_t(n - 1)}) {
        const TokenLogprob e = calc.entry(chosen);
        EXPECT_EQ(e.id, chosen);
        // Bound: the float weights' 3e-7 relative error moves log z by as much; the logprob itself is a float
        // near -12 at worst here (6e-7 absolute rounding at that size).
        EXPECT_NEAR(e.logprob, double(l[chosen]) - log_z, 2e-6) << n << " " << chosen;
        ASSERT_EQ(e.top.size(), std::min<size_t>(5, n));
        for (size_t j = 0; j < e.top.size(); ++j) {
          EXPECT_EQ(e.top[j].first, order[j]) << n << " rank " << j;
          EXPECT_NEAR(e.top[j].second, double(l[order[j]]) - log_z, 2e-6);
        }
      }
    }
  }
}

TEST(TokenLogprobs, NoAlternativesNaNAndInfinity) {
  LogprobCalculator calc;
  std::vector<float> l = {1.0f, 2.0f, 3.0f};
  calc.compute(l, 0);
  EXPECT_TRUE(calc.entry(2).top.empty());
  EXPECT_NEAR(calc.entry(2).logprob, 3.0 - std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0)), 1e-6);
  std::vector<float> bad = {1.0f, NAN, 3.0f};
  EXPECT_THROW(calc.compute(bad, 2), Error);
  std::vector<float> inf = {1.0f, INFINITY, 3.0f};
  calc.compute(inf, 2);
  EXPECT_EQ(calc.entry(1).logprob, 0.0f);
  EXPECT_EQ(calc.entry(0).logprob, -INFINITY);
  EXPECT_EQ(calc.entry(0).top.front().first, 1);
}

}  // namespace
}  // namespace fern
