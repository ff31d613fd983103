// MLX affine quantization (quant/affine.h): hand-made groups whose codes, scales and biases are worked out by
// hand from the algorithm, packing order, and the error bound on seeded random rows at real widths.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "core/bf16.h"
#include "quant/affine.h"
#include "test_util.h"

namespace fern {
namespace {

// One group of 64: 3.0 (the maximum dominates), -1.0, and 62 values of 0.5.
// By hand: s0 = (3 - -1)/15 = 4/15; |max| >= |min| so the edge is 3 and s0 is negated; q0 = round(3/(-4/15)) =
// round(-11.25) = -11; s = 3/-11 = -0.272727; bias = 3. Codes: 3 -> 0, -1 -> round(-4/s) = round(14.67) = 15,
// 0.5 -> round(-2.5/s) = round(9.17) = 9.
TEST(QuantAffine, MaximumDominatesGivesNegativeScale) {
  std::vector<float> w(64, 0.5f);
  w[0] = 3.0f;
  w[1] = -1.0f;
  std::vector<uint8_t> q(64);
  AffineGroup g = quantize_group(w.data(), 64, 4, q.data());
  EXPECT_FLOAT_EQ(g.scale, 3.0f / -11.0f);
  EXPECT_FLOAT_EQ(g.bias, 3.0f);
  EXPECT_EQ(q[0], 0);
  EXPECT_EQ(q[1], 15);
  for (int i = 2; i < 64; ++i) ASSERT_EQ(q[i], 9) << i;
  // The dominant extreme is reproduced exactly.
  EXPECT_EQ(g.scale * q[0] + g.bias, 3.0f);
}

// Mirror image: -3.0 dominates, so the scale stays positive and the minimum is exact.
TEST(QuantAffine, MinimumDominatesGivesPositiveScale) {
  std::vector<float> w(64, -0.5f);
  w[5] = -3.0f;
  w[9] = 1.0f;
  std::vector<uint8_t> q(64);
  AffineGroup g = quantize_group(w.data(), 64, 4, q.data());
  EXPECT_FLOAT_EQ(g.scale, -3.0f / -11.0f);  // q0 = round(-3/(4/15)) = -11
  EXPECT_FLOAT_EQ(g.bias, -3.0f);
  EXPECT_EQ(q[5], 0);
  EXPECT_EQ(q[9], 15);                        // round(4/0.2727) = round(14.67)
  EXPECT_EQ(q[0], 9);                         // round(2.5/0.2727) = round(9.17)
}

// A constant group: max - min = 0, so s = -1e-7 (maximum is the edge), q0 = round(0.75/-1e-7) != 0,
// s = 0.75/q0, bias = 0.75 and every code is 0: dequantization gives 0.75 exactly.
TEST(QuantAffine, ConstantGroup) {
  std::vector<float> w(64, 0.75f);
  std::vector<uint32_t> packed(8);
  std::vector<uint16_t> s(1), b(1);
  quantize_row(w.data(), 64, 4, 64, packed.data(), s.data(), b.data());
  std::vector<float> out(64);
  dequantize_row(packed.data(), s.data(), b.data(), 64, 4, 64, out.data());
  for (float v : out) ASSERT_EQ(v, 0.75f);
  for (uint32_t p : packed) ASSERT_EQ(p, 0u);
}

// 8-bit: 64 values from -1 to 0.9. The minimum dominates: s0 = 1.9/255 = 0.0074510, q0 = round(-1/s0) =
// round(-134.21) = -134, s = -1/-134 = 0.0074627, bias = -1; code of w is round((w + 1)/s), 0 for -1 and
// round(1.9 * 134) = round(254.6) = 255 for 0.9.
TEST(QuantAffine, EightBit) {
  std::vector<float> w(64);
  for (int i = 0; i < 64; ++i) w[i] = -1.0f + 1.9f * i / 63.0f;
  std::vector<uint8_t> q(64);
  AffineGroup g = quantize_group(w.data(), 64, 8, q.data());
  EXPECT_FLOAT_EQ(g.scale, 1.0f / 134.0f);
  EXPECT_FLOAT_EQ(g.bias, -1.0f);
  EXPECT_EQ(q[0], 0);
  EXPECT_EQ(q[63], 255);
  for (int i = 0; i < 64; ++i) {
    EXPECT_EQ(q[i], static_cast<int>(std::round((w[i] + 1.0f) * 134.0f))) << i;
    EXPECT_LE(std::fabs(g.scale * q[i] + g.bias - w[i]), g.scale * 0.5f * 1.0001f);
  }
}

// Codes are packed from the least significant bits up: 4-bit column 8m+r in bits [4r, 4r+3] of word m.
// w = -1 + 0.125 (k mod 16): the minimum dominates, s0 = 1.875/15 = 0.125 exactly, q0 = -8, s = 0.125,
// bias = -1, so the code of column k is k mod 16.
TEST(QuantAffine, PackingOrder) {
  std::vector<float> w(64);
  for (int i = 0; i < 64; ++i) w[i] = -1.0f + 0.125f * (i % 16);
  std::vector<uint32_t> packed(8);
  std::vector<uint16_t> s(1), b(1);
  quantize_row(w.data(), 64, 4, 64, packed.data(), s.data(), b.data());
  EXPECT_EQ(bf16_to_f32(s[0]), 0.125f);
  EXPECT_EQ(bf16_to_f32(b[0]), -1.0f);
  for (int k = 0; k < 64; ++k) {
    const uint32_t want = k % 16;
    ASSERT_EQ(affine_code(packed.data(), k, 4), want) << k;
    ASSERT_EQ((packed[k / 8] >> (4 * (k % 8))) & 15u, want) << k;
  }
  EXPECT_EQ(packed[0], 0x76543210u);
}

// Seeded random rows at the real widths (2048 = hidden, 512 = expert intermediate) and an awkward one (4160).
// Bound from affine.h: |err| <= |s|/2 (inside codes) or |s| (codes 0 and N), plus the bf16 rounding of s and
// bias, 2^-9 (N|s| + |b|). NMSE measured on these rows: 0.0078-0.0086 at 4 bits, 4.4e-5-5.0e-5 at 8 bits
// (there the bf16 rounding of the bias dominates); the thresholds are 2x the largest.
TEST(QuantAffine, RandomRowsWithinBound) {
  for (int bits : {4, 8}) {
    for (int64_t n : {2048, 512, 4160}) {
      auto w = test::randn(static_cast<size_t>(n), 1000 + n + bits, 0.02f);
      for (auto& x : w) x = round_bf16(x);
      const int N = (1 << bits) - 1;
      std::vector<uint32_t> packed(static_cast<size_t>(n * bits / 32));
      std::vector<uint16_t> s(static_cast<size_t>(n / 64)), b(static_cast<size_t>(n / 64));
      quantize_row(w.data(), n, bits, 64, packed.data(), s.data(), b.data());
      std::vector<float> out(static_cast<size_t>(n));
      dequantize_row(packed.data(), s.data(), b.data(), n, bits, 64, out.data());
      for (int64_t k = 0; k < n; ++k) {
        const float sc = std::fabs(bf16_to_f32(s[k / 64])), bi = std::fabs(bf16_to_f32(b[k / 64]));
        const uint32_t q = affine_code(packed.data(), k, bits);
        const float bound = (q == 0 || q == static_cast<uint32_t>(N) ? 1.0f : 0.5f) * sc * 1.01f +
                            std::ldexp(1.0f, -9) * (N * sc + bi);
        ASSERT_LE(std::fabs(out[k] - w[k]), bound) << "bits " << bits << " n " << n << " k " << k;
      }
      const double e = test::nmse(out.data(), w.data(), static_cast<size_t>(n));
      std::printf("bits %d n %lld: nmse %.3g\n", bits, static_cast<long long>(n), e);
      EXPECT_LT(e, bits == 4 ? 1.75e-2 : 1e-4) << "bits " << bits << " n " << n;
      EXPECT_GT(e, 0.0);
    }
  }
}

}  // namespace
}  // namespace fern
