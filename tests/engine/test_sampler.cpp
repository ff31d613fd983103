// Sampler: greedy, reproducibility with a seed, the sampled distribution against softmax for temperature, top-k,
// top-p and min-p, penalties and logit bias, and the fast paths (top-p's growing prefix, top-k's selection, the
// temperature-only walk over weight blocks) against exact references at the real vocabulary size.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "engine/sampler.h"
#include "test_util.h"

namespace fern {
namespace {

std::vector<double> softmax(const std::vector<float>& l, double temp) {
  double mx = *std::max_element(l.begin(), l.end());
  std::vector<double> p(l.size());
  double z = 0;
  for (size_t i = 0; i < l.size(); ++i) z += p[i] = std::exp((l[i] - mx) / temp);
  for (auto& x : p) x /= z;
  return p;
}

// Empirical frequencies of `n` draws.
std::vector<double> frequencies(const SamplingParams& sp, const std::vector<float>& logits, int n) {
  Sampler s(sp);
  std::vector<double> f(logits.size(), 0.0);
  for (int i = 0; i < n; ++i) {
    std::vector<float> l = logits;
    f[static_cast<size_t>(s.sample(l))] += 1.0 / n;
  }
  return f;
}

// 200k draws: the standard error of a frequency is at most sqrt(0.25/200000) = 0.0011, so 0.006 is over 5 sigma
// (measured worst case over these tests: about 0.002).
constexpr int kDraws = 200000;
constexpr double kFreqTol = 0.006;

const std::vector<float> kLogits = {1.0f, 2.5f, -0.5f, 0.3f, 2.0f, -3.0f, 0.9f, 1.7f};

// One draw of the sampler on a copy of `base`, with what a reference needs to make the same draw: the random number
// a twin sampler with the same seed takes first, and the logits scaled by the temperature as the sampler scales them.
struct Draw {
  int32_t got;
  double u;
  std::vector<float> scaled;
};
Draw draw(const SamplingParams& sp, const std::vector<float>& base) {
  Sampler s(sp);
  std::vector<float> l = base;
  Draw d{s.sample(l), Sampler(sp).uniform(), base};
  for (auto& x : d.scaled) x *= 1.0f / sp.temperature;
  return d;
}

// Indices by decreasing value, ties to the lower index.
std::vector<int32_t> sorted_order(const std::vector<float>& t) {
  std::vector<int32_t> idx(t.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return t[a] > t[b]; });
  return idx;
}

TEST(Sampler, GreedyIsArgmaxLowestIndexOnTies) {
  SamplingParams sp;
  sp.temperature = 0;
  Sampler s(sp);
  std::vector<float> l = {0.1f, 3.0f, -1.0f, 3.0f};
  EXPECT_EQ(s.sample(l), 1);
  std::vector<float> big = test::randn(248320, 11, 2.0f);
  auto want = std::max_element(big.begin(), big.end()) - big.begin();
  EXPECT_EQ(s.sample(big), want);
}

TEST(Sampler, NaNLogitsAreAnError) {
  SamplingParams sp;
  Sampler s(sp);
  std::vector<float> l = {0.1f, NAN, 1.0f};
  EXPECT_THROW(s.sample(l), Error);
  std::vector<float> all_nan = {NAN, NAN};
  EXPECT_THROW(argmax(all_nan), Error);
  std::vector<float> some = {NAN, 2.0f, 1.0f};
  EXPECT_EQ(argmax(some), 1);
}

TEST(Sampler, SameSeedSameTokensOtherSeedOtherTokens) {
  std::vector<float> base = test::randn(4096, 3, 1.0f);
  auto run = [&](uint64_t seed) {
    SamplingParams sp;
    sp.temperature = 1.0f;
    sp.top_p = 0.95f;
    sp.seed = seed;
    Sampler s(sp);
    std::vector<int32_t> out;
    for (int i = 0; i < 50; ++i) {
      std::vector<float> l = base;
      int32_t t = s.sample(l);
      s.accept(t);
      out.push_back(t);
    }
    return out;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
}

TEST(Sampler, TemperatureMatchesSoftmax) {
  for (float temp : {1.0f, 0.5f, 1.7f}) {
    SamplingParams sp;
    sp.temperature = temp;
    sp.seed = 1234;
    auto f = frequencies(sp, kLogits, kDraws);
    auto p = softmax(kLogits, temp);
    for (size_t i = 0; i < p.size(); ++i) EXPECT_NEAR(f[i], p[i], kFreqTol) << "token " << i << " T " << temp;
  }
}

TEST(Sampler, TopKKeepsTheKBestRenormalised) {
  SamplingParams sp;
  sp.top_k = 3;
  sp.seed = 7;
  auto f = frequencies(sp, kLogits, kDraws);
  // The three best are tokens 1 (2.5), 4 (2.0), 7 (1.7).
  std::vector<float> top = {kLogits[1], kLogits[4], kLogits[7]};
  auto p = softmax(top, 1.0);
  EXPECT_NEAR(f[1], p[0], kFreqTol);
  EXPECT_NEAR(f[4], p[1], kFreqTol);
  EXPECT_NEAR(f[7], p[2], kFreqTol);
  for (size_t i : {0, 2, 3, 5, 6}) EXPECT_EQ(f[i], 0.0) << i;
}

TEST(Sampler, TopPAndMinPCutTheTail) {
  // Probabilities 0.5, 0.3, 0.15, 0.05 exactly.
  std::vector<float> l = {std::log(0.15f), std::log(0.5f), std::log(0.05f), std::log(0.3f)};
  SamplingParams sp;
  sp.top_p = 0.7f;  // 0.5 < 0.7 <= 0.8: keeps {0.5, 0.3}
  sp.seed = 9;
  auto f = frequencies(sp, l, kDraws);
  EXPECT_NEAR(f[1], 0.5 / 0.8, kFreqTol);
  EXPECT_NEAR(f[3], 0.3 / 0.8, kFreqTol);
  EXPECT_EQ(f[0], 0.0);
  EXPECT_EQ(f[2], 0.0);

  SamplingParams mp;
  mp.min_p = 0.25f;  // keeps p >= 0.125: {0.5, 0.3, 0.15}
  mp.seed = 10;
  auto g = frequencies(mp, l, kDraws);
  EXPECT_NEAR(g[1], 0.5 / 0.95, kFreqTol);
  EXPECT_NEAR(g[3], 0.3 / 0.95, kFreqTol);
  EXPECT_NEAR(g[0], 0.15 / 0.95, kFreqTol);
  EXPECT_EQ(g[2], 0.0);
}

TEST(Sampler, PresenceAndFrequencyPenalties) {
  SamplingParams sp;
  sp.temperature = 0;
  sp.presence_penalty = 0.5f;
  sp.frequency_penalty = 0.4f;
  Sampler s(sp);
  std::vector<float> l = {1.0f, 2.0f, 0.5f};
  std::vector<float> a = l;
  EXPECT_EQ(s.sample(a), 1);
  s.accept(1);
  std::vector<float> b = l;
  s.sample(b);
  EXPECT_FLOAT_EQ(b[1], 2.0f - 0.5f - 0.4f);  // once: presence + 1 x frequency
  EXPECT_FLOAT_EQ(b[0], 1.0f);
  s.accept(1);
  std::vector<float> c = l;
  EXPECT_EQ(s.sample(c), 0);  // 2 - 0.5 - 0.8 = 0.7 < 1.0
  EXPECT_FLOAT_EQ(c[1], 0.7f);
}

TEST(Sampler, RepetitionPenaltyAndLogitBias) {
  SamplingParams sp;
  sp.temperature = 0;
  sp.repetition_penalty = 2.0f;
  sp.logit_bias = {{2, 5.0f}};
  Sampler s(sp);
  std::vector<int32_t> prompt = {0, 3};
  s.set_prompt(prompt);
  std::vector<float> l = {3.0f, 2.0f, -10.0f, -1.0f};
  EXPECT_EQ(s.sample(l), 1);          // token 0: 3 / 2 = 1.5 < 2
  EXPECT_FLOAT_EQ(l[0], 1.5f);
  EXPECT_FLOAT_EQ(l[3], -2.0f);       // negative logits are multiplied
  EXPECT_FLOAT_EQ(l[2], -5.0f);       // bias added
}

// The top-p path takes the 64 or 1,024 best, or walks value buckets, instead of sorting the vocabulary; it must
// pick exactly what a full sort would, for the same random number. Real vocabulary size, peaked and flat logits.
TEST(Sampler, TopPPrefixPathEqualsFullSortReference) {
  // Scale 12: the nucleus is among the 64 best; 0.5 and 3: it is not among the 1,024 best (value buckets).
  for (float scale : {0.5f, 3.0f, 12.0f}) {
    std::vector<float> base = test::randn(248320, 21, scale);
    for (uint64_t seed = 0; seed < 10; ++seed) {
      SamplingParams sp;
      sp.temperature = 0.8f;
      sp.top_p = 0.9f;
      sp.seed = seed;
      const auto [got, u, t] = draw(sp, base);
      const float mx = *std::max_element(t.begin(), t.end());
      const std::vector<int32_t> idx = sorted_order(t);
      double z = 0;
      for (float x : t) z += std::exp(double(x - mx));
      double cum = 0;
      size_t keep = 0;
      while (keep < idx.size()) {
        cum += std::exp(double(t[idx[keep]] - mx)) / z;
        ++keep;
        if (cum >= sp.top_p) break;
      }
      double total = 0;
      for (size_t i = 0; i < keep; ++i) total += std::exp(double(t[idx[i]] - mx));
      double r = u * total;
      int32_t want = idx[keep - 1];
      for (size_t i = 0; i < keep; ++i) {
        r -= std::exp(double(t[idx[i]] - mx));
        if (r < 0) {
          want = idx[i];
          break;
        }
      }
      EXPECT_EQ(got, want) << "scale " << scale << " seed " << seed;
    }
  }
}

// Temperature alone (and with min-p) walks every token's weight in index order, skipping whole blocks by their
// sums. Against the exact walk (double exp, r = u * total): the token must be the one whose interval of the
// cumulative weight holds u * total, up to the weights' rounding (2e-6 of the total covers the float block sums
// and the float exp; an off-by-one token or a wrong block is off by a whole token's weight, far more for the
// tokens these draws land on). Real vocabulary, peaked and flat logits.
TEST(Sampler, TemperatureWalkMatchesTheExactCumulativeWeight) {
  for (float scale : {0.5f, 3.0f, 8.0f}) {
    std::vector<float> base = test::randn(248320, 31, scale);
    for (float min_p : {0.0f, 0.05f}) {
      int exact = 0;
      for (uint64_t seed = 0; seed < 8; ++seed) {
        SamplingParams sp;
        sp.temperature = 0.9f;
        sp.min_p = min_p;
        sp.seed = seed;
        const auto [got, u, t] = draw(sp, base);
        const float mx = *std::max_element(t.begin(), t.end());
        const float floor = min_p > 0 ? mx + std::log(min_p) : -INFINITY;
        std::vector<double> cum(t.size() + 1, 0.0);
        for (size_t i = 0; i < t.size(); ++i) cum[i + 1] = cum[i] + (t[i] >= floor ? std::exp(double(t[i] - mx)) : 0.0);
        const double r = u * cum.back(), tol = 2e-6 * cum.back();
        ASSERT_GE(got, 0);
        EXPECT_GE(r, cum[size_t(got)] - tol) << "scale " << scale << " seed " << seed;
        EXPECT_LE(r, cum[size_t(got) + 1] + tol) << "scale " << scale << " seed " << seed;
        EXPECT_GE(t[size_t(got)], floor);
        exact += r >= cum[size_t(got)] && r < cum[size_t(got) + 1];
      }
      EXPECT_GE(exact, 7) << "scale " << scale << ": most draws land well inside their token's interval";
    }
  }
}

// A vocabulary of four weight blocks with the mass on tokens at and around the blocks' edges: the walk that skips
// blocks by their sums must give every token its softmax probability.
TEST(Sampler, TemperatureAcrossWeightBlocksMatchesSoftmax) {
  std::vector<float> l(1000, -4.0f);
  const size_t heavy[] = {0, 255, 256, 257, 511, 512, 767, 999};
  for (size_t i = 0; i < std::size(heavy); ++i) l[heavy[i]] = 1.0f + 0.25f * float(i);
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.seed = 77;
  auto f = frequencies(sp, l, kDraws);
  auto p = softmax(l, 1.0);
  double rest_f = 1.0, rest_p = 1.0;
  for (size_t i : heavy) {
    EXPECT_NEAR(f[i], p[i], kFreqTol) << "token " << i;
    rest_f -= f[i];
    rest_p -= p[i];
  }
  EXPECT_NEAR(rest_f, rest_p, kFreqTol) << "the 992 light tokens together";
}

// top-k at the real vocabulary (the selection skips blocks below its threshold) picks exactly what a full sort
// would for the same random number.
TEST(Sampler, TopKAtTheRealVocabularyEqualsFullSortReference) {
  std::vector<float> base = test::randn(248320, 41, 3.0f);
  for (int k : {1, 20, 50, 1000}) {
    for (uint64_t seed = 0; seed < 4; ++seed) {
      SamplingParams sp;
      sp.temperature = 0.7f;
      sp.top_k = k;
      sp.seed = seed;
      const auto [got, u, t] = draw(sp, base);
      const std::vector<int32_t> idx = sorted_order(t);
      const float mx = t[idx[0]];
      double total = 0;
      for (int i = 0; i < k; ++i) total += std::exp(double(t[idx[i]] - mx));
      double r = u * total;
      int32_t want = idx[k - 1];
      for (int i = 0; i < k; ++i) {
        r -= std::exp(double(t[idx[i]] - mx));
        if (r < 0) {
          want = idx[i];
          break;
        }
      }
      EXPECT_EQ(got, want) << "k " << k << " seed " << seed;
    }
  }
}

TEST(Sampler, SampleIsSampleAtItsOwnDraw) {
  // sample() makes one draw and picks as sample_at() does for it (what a backend that picks tokens must match), for
  // every path: greedy, temperature alone, min-p, top-k, top-p from the best candidates and top-p by buckets.
  const std::vector<float> base = test::randn(248320, 43, 2.0f);
  const std::vector<float> flat = test::randn(248320, 44, 0.05f);
  struct Case {
    float t;
    int k;
    float p, min_p;
    const std::vector<float>* l;
  };
  for (const Case& c : {Case{0.0f, 0, 1.0f, 0.0f, &base}, Case{1.0f, 0, 1.0f, 0.0f, &base},
                        Case{0.8f, 0, 1.0f, 0.1f, &base}, Case{0.7f, 20, 0.8f, 0.0f, &base},
                        Case{1.0f, 0, 0.9f, 0.0f, &base}, Case{1.0f, 0, 0.9f, 0.0f, &flat}}) {
    for (uint64_t seed = 0; seed < 3; ++seed) {
      SamplingParams sp;
      sp.temperature = c.t;
      sp.top_k = c.k;
      sp.top_p = c.p;
      sp.min_p = c.min_p;
      sp.seed = seed;
      Sampler a(sp), b(sp);
      std::vector<float> la = *c.l, lb = *c.l;
      const int32_t got = a.sample(la);
      EXPECT_EQ(got, b.sample_at(lb, Sampler(sp).uniform())) << "t " << c.t << " k " << c.k << " p " << c.p;
      Sampler twin(sp);
      twin.uniform();
      EXPECT_EQ(a.uniform(), twin.uniform());  // exactly one draw per sample(), greedy included
    }
  }
}

}  // namespace
}  // namespace fern
