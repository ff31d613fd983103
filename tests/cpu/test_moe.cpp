// Sparse MoE block of the CPU backend against a naive double-precision reference of MODEL.md 2.5, and the
// router's tie rule (lowest expert index wins).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "cpu/cpu_backend.h"
#include "cpu/cpu_ops.h"
#include "cpu/random_model.h"
#include "cpu/reference.h"
#include "test_util.h"

namespace fern {
namespace {

// MODEL.md 2.5 for T tokens in double, experts taken in the order the router picked them.
std::vector<double> ref_moe(const std::vector<float>& xf, int64_t T, const MoeWeights& w, const ModelConfig& c) {
  const int64_t H = c.hidden_size, E = c.num_experts;
  const int k = c.num_experts_per_tok;
  const auto x = test::to_double(xf);
  const auto logits = test::ref_linear(x, T, w.router);
  std::vector<double> out(T * H, 0.0);
  auto mlp = [&](const std::vector<double>& xr, const LinearWeight& g, const LinearWeight& u,
                 const LinearWeight& d) {
    auto gv = test::ref_linear(xr, 1, g), uv = test::ref_linear(xr, 1, u);
    for (size_t i = 0; i < gv.size(); ++i) gv[i] = test::ref_silu(gv[i]) * uv[i];
    return test::ref_linear(gv, 1, d);
  };
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> p(logits.begin() + t * E, logits.begin() + (t + 1) * E);
    const double mx = *std::max_element(p.begin(), p.end());
    double sum = 0;
    for (auto& v : p) sum += (v = std::exp(v - mx));
    for (auto& v : p) v /= sum;
    std::vector<int64_t> order(E);
    for (int64_t e = 0; e < E; ++e) order[e] = e;
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
    double picked = 0;
    for (int i = 0; i < k; ++i) picked += p[order[i]];
    const std::vector<double> xr(x.begin() + t * H, x.begin() + (t + 1) * H);
    for (int i = 0; i < k; ++i) {
      const int64_t e = order[i];
      const double wt = c.norm_topk_prob ? p[e] / picked : p[e];
      auto y = mlp(xr, w.gate.expert(e), w.up.expert(e), w.down.expert(e));
      for (int64_t j = 0; j < H; ++j) out[t * H + j] += wt * y[j];
    }
    auto sh = mlp(xr, w.shared_gate, w.shared_up, w.shared_down);
    const double s = test::ref_sigmoid(test::ref_linear(xr, 1, w.shared_expert_gate)[0]);
    for (int64_t j = 0; j < H; ++j) out[t * H + j] += s * sh[j];
  }
  return out;
}

struct MoeCase {
  bool quantized;
  bool renormalise;
};

class CpuMoe : public ::testing::TestWithParam<MoeCase> {};

TEST_P(CpuMoe, MatchesDoubleReference) {
  ModelConfig c = test::tiny_test_config(1);
  c.norm_topk_prob = GetParam().renormalise;
  test::RandomWeightsOptions o;
  o.quantized = GetParam().quantized;
  o.seed = 3;
  auto mw = test::random_weights(c, o);
  const MoeWeights& w = mw->layers[0].moe;
  double worst = 0;
  for (int64_t T : {1, 3, 40}) {  // 40 tokens x top-8 of 16: every expert sees several tokens
    auto x = test::randn(size_t(T * c.hidden_size), uint64_t(T));
    std::vector<float> got(x.size());
    cpu::moe(got.data(), x.data(), T, w, c, 2);
    auto ref = test::to_float(ref_moe(x, T, w, c));
    const double e = test::nmse(got.data(), ref.data(), ref.size());
    // fp32 against double through router, softmax and two chained products: measured worst NMSE 4.3e-13. A wrong
    // expert, weight or missing shared term gives > 1e-3; a routing flip between near-equal experts would show
    // as ~1e-3 too, which random data at this size does not produce.
    EXPECT_LT(e, 1e-10) << "T " << T;
    worst = std::max(worst, e);
  }
  std::printf("moe vs double reference: worst NMSE %.3g\n", worst);
}

TEST_P(CpuMoe, TiedRouterLogitsPickTheLowestIndex) {
  // Router rows identical in pairs (2e, 2e+1) give bitwise-equal logits; with k = 7 the last pick splits a pair,
  // and the reference (stable sort) keeps the lower index, as the backend must.
  ModelConfig c = test::tiny_test_config(1);
  c.num_experts_per_tok = 7;
  c.norm_topk_prob = GetParam().renormalise;
  test::RandomWeightsOptions o;
  o.quantized = GetParam().quantized;
  auto mw = test::random_weights(c, o);
  MoeWeights& w = mw->layers[0].moe;
  const size_t row_bytes = w.router.w.nbytes() / size_t(c.num_experts);
  char* base = static_cast<char*>(w.router.w.data);
  for (int64_t e = 0; e < c.num_experts; e += 2)
    std::copy_n(base + e * row_bytes, row_bytes, base + (e + 1) * row_bytes);
  if (w.router.quantized())
    for (Tensor* t : {&w.router.scales, &w.router.biases}) {
      const size_t rb = t->nbytes() / size_t(c.num_experts);
      char* b = static_cast<char*>(t->data);
      for (int64_t e = 0; e < c.num_experts; e += 2) std::copy_n(b + e * rb, rb, b + (e + 1) * rb);
    }
  const int64_t T = 6;
  auto x = test::randn(size_t(T * c.hidden_size), 4);
  std::vector<float> logits(T * c.num_experts), wt(T * 7);
  std::vector<int32_t> idx(T * 7);
  cpu::linear(logits.data(), x.data(), T, w.router, 2);
  cpu::moe_route(logits.data(), T, c.num_experts, 7, c.norm_topk_prob, idx.data(), wt.data());
  for (int64_t t = 0; t < T; ++t) {
    // The odd one out is the lower expert of its pair.
    std::vector<int> count(c.num_experts / 2, 0);
    for (int i = 0; i < 7; ++i) ++count[idx[t * 7 + i] / 2];
    for (int i = 0; i < 7; ++i) {
      if (count[idx[t * 7 + i] / 2] == 1) {
        EXPECT_EQ(idx[t * 7 + i] % 2, 0) << "token " << t;
      }
    }
  }
  std::vector<float> got(x.size());
  cpu::moe(got.data(), x.data(), T, w, c, 2);
  auto ref = test::to_float(ref_moe(x, T, w, c));
  EXPECT_LT(test::nmse(got.data(), ref.data(), ref.size()), 1e-10);  // as above
}

INSTANTIATE_TEST_SUITE_P(Weights, CpuMoe,
                         ::testing::Values(MoeCase{false, true}, MoeCase{true, true}, MoeCase{true, false}),
                         [](const auto& info) {
                           return std::string(info.param.quantized ? "Affine" : "Bf16") +
                                  (info.param.renormalise ? "Renorm" : "Raw");
                         });

TEST(CpuMoeRoute, TieRuleAndWeights) {
  const int64_t E = 16;
  std::vector<float> l(3 * E, 0.0f);  // token 0: all equal
  for (int64_t e = 0; e < E; ++e) l[E + e] = (e % 4 == 1) ? 2.0f : 0.0f;  // token 1: four leaders, then ties
  for (int64_t e = 0; e < E; ++e) l[2 * E + e] = float(e % 5);           // token 2: ties at every level
  std::vector<int32_t> idx(3 * 8);
  std::vector<float> w(3 * 8);
  cpu::moe_route(l.data(), 3, E, 8, true, idx.data(), w.data());
  EXPECT_EQ(std::vector<int32_t>(idx.begin(), idx.begin() + 8), (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(std::vector<int32_t>(idx.begin() + 8, idx.begin() + 16),
            (std::vector<int32_t>{1, 5, 9, 13, 0, 2, 3, 4}));
  EXPECT_EQ(std::vector<int32_t>(idx.begin() + 16, idx.end()), (std::vector<int32_t>{4, 9, 14, 3, 8, 13, 2, 7}));
  for (int i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(w[i], 1.0f / 8);
  float s = 0;
  for (int i = 8; i < 16; ++i) s += w[i];
  EXPECT_NEAR(s, 1.0f, 1e-6);
  EXPECT_NEAR(w[8] / w[12], std::exp(2.0), 1e-4);  // renormalising keeps the softmax ratios
}

}  // namespace
}  // namespace fern
