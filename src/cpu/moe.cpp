// Sparse MoE block (MODEL.md 2.5): fp32 router softmax -> top-k -> renormalise, each selected expert's SwiGLU,
// the weighted sum, plus the sigmoid-gated shared expert. Tokens are grouped by expert so that each expert's
// weights are dequantized once per call however many tokens chose it.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/cpu_ops.h"
#include "cpu/simd.h"

namespace fern::cpu {
namespace {

// out[r] = down(silu(gate(x[r])) * up(x[r])) for R rows.
void swiglu_mlp(float* out, const float* x, int64_t R, const LinearWeight& gate, const LinearWeight& up,
                const LinearWeight& down, int nt) {
  const int64_t I = gate.out;
  std::vector<float> g(R * I), u(R * I);
  linear(g.data(), x, R, gate, nt);
  linear(u.data(), x, R, up, nt);
  for (int64_t i = 0; i < R * I; ++i) g[i] = silu(g[i]) * u[i];
  linear(out, g.data(), R, down, nt);
}

}  // namespace

void moe_route(const float* router_logits, int64_t T, int64_t E, int k, bool renormalise, int32_t* idx,
               float* weight) {
  std::vector<float> p(E);
  std::vector<char> taken(E);
  for (int64_t t = 0; t < T; ++t) {
    const float* l = router_logits + t * E;
    const float mx = *std::max_element(l, l + E);
    float sum = 0.0f;
    for (int64_t e = 0; e < E; ++e) {
      p[e] = std::exp(l[e] - mx);
      sum += p[e];
    }
    for (int64_t e = 0; e < E; ++e) p[e] /= sum;
    std::fill(taken.begin(), taken.end(), 0);
    float picked = 0.0f;
    for (int i = 0; i < k; ++i) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e)  // strict '>' keeps the lowest index among equal probabilities
        if (!taken[e] && (best < 0 || p[e] > p[best])) best = e;
      taken[best] = 1;
      idx[t * k + i] = static_cast<int32_t>(best);
      weight[t * k + i] = p[best];
      picked += p[best];
    }
    if (renormalise)
      for (int i = 0; i < k; ++i) weight[t * k + i] /= picked;
  }
}

void moe(float* out, const float* x, int64_t T, const MoeWeights& w, const ModelConfig& cfg, int nt) {
  const int64_t H = cfg.hidden_size, E = cfg.num_experts;
  const int k = cfg.num_experts_per_tok;
  for (const LinearWeight* s : {&w.gate, &w.up, &w.down})
    if (s->experts != E) fail("expert stack {} holds {} experts, config says {}", s->name, s->experts, E);
  if (k < 1 || k > E) fail("num_experts_per_tok {} with {} experts", k, E);

  std::vector<float> logits(T * E), wt(T * k);
  std::vector<int32_t> idx(T * k);
  linear(logits.data(), x, T, w.router, nt);
  moe_route(logits.data(), T, E, k, cfg.norm_topk_prob, idx.data(), wt.data());

  // Tokens of each expert, in token order.
  std::vector<std::vector<std::pair<int64_t, float>>> by_expert(E);
  for (int64_t t = 0; t < T; ++t)
    for (int i = 0; i < k; ++i) by_expert[idx[t * k + i]].push_back({t, wt[t * k + i]});

  // Experts in ascending index order, so every token's weighted sum is accumulated in the same order whatever
  // the other tokens of the call chose.
  std::fill(out, out + T * H, 0.0f);
  std::vector<float> xe, ye;
  for (int64_t e = 0; e < E; ++e) {
    const auto& rows = by_expert[e];
    if (rows.empty()) continue;
    const int64_t R = static_cast<int64_t>(rows.size());
    xe.resize(R * H);
    ye.resize(R * H);
    for (int64_t r = 0; r < R; ++r) std::copy_n(x + rows[r].first * H, H, &xe[r * H]);
    swiglu_mlp(ye.data(), xe.data(), R, w.gate.expert(e), w.up.expert(e), w.down.expert(e), nt);
    for (int64_t r = 0; r < R; ++r) axpy(out + rows[r].first * H, rows[r].second, &ye[r * H], H);
  }

  // Shared expert, scaled per token by sigmoid(x . w_seg).
  std::vector<float> shared(T * H), sg(T);
  swiglu_mlp(shared.data(), x, T, w.shared_gate, w.shared_up, w.shared_down, nt);
  if (w.shared_expert_gate.out != 1) fail("shared expert gate {} has {} outputs (want 1)", w.shared_expert_gate.name,
                                          w.shared_expert_gate.out);
  linear(sg.data(), x, T, w.shared_expert_gate, nt);
  for (int64_t t = 0; t < T; ++t) axpy(out + t * H, sigmoid(sg[t]), &shared[t * H], H);
}

}  // namespace fern::cpu
