// Sparse MoE block (MODEL.md 2.5): fp32 router softmax -> top-k -> renormalise, each selected expert's SwiGLU,
// the weighted sum, plus the sigmoid-gated shared expert. Tokens are grouped by expert so that each expert's
// weights are dequantized once per call however many tokens chose it.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/cpu_ops.h"
#include "cpu/simd.h"

namespace fern::cpu {

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
  if (w.shared_expert_gate.out != 1) fail("shared expert gate {} has {} outputs (want 1)", w.shared_expert_gate.name,
                                          w.shared_expert_gate.out);

  // Each selected expert's SwiGLU on its rows, y_e[r] = down(silu(gate(x_e[r])) * up(x_e[r])), and the shared
  // expert's on every row. Experts are taken in ascending order in batches of about kBatchRows rows: a batch's gate
  // and up products in one parallel region, its down products in another (a decode step's eight experts are one
  // batch, with the shared expert and its gate logit), and its outputs added to `out` before the next batch, so that
  // the buffers stay small and warm whatever the prompt length. Every token's sum is accumulated in ascending expert
  // order whatever the other tokens of the call chose, the shared expert's last (scaled by sigmoid(x . w_seg)).
  constexpr int64_t kBatchRows = 64;
  struct Mlp {
    int64_t e = 0;                      // expert index, or -1 for the shared expert
    LinearWeight gate, up, down;        // its matrices
    int64_t R = 0;                      // rows
    std::vector<float> x, g, u, y;      // its rows (routed experts), gate and up products, output
  };
  int64_t n = 0, rows_in_batch = 0;  // experts in the batch, their rows
  std::vector<Mlp> batch;  // the batch's experts; slots (and their vectors' capacity) are kept from batch to batch
  auto next_slot = [&]() -> Mlp& {
    if (n == static_cast<int64_t>(batch.size())) batch.emplace_back();
    return batch[n++];
  };
  std::vector<float> sg(T);
  std::vector<LinearJob> jobs;
  std::fill(out, out + T * H, 0.0f);
  auto run_batch = [&](bool with_shared) {
    jobs.clear();
    for (int64_t i = 0; i < n; ++i) {
      Mlp& m = batch[i];
      if (m.up.out != m.gate.out || m.down.in != m.gate.out)
        fail("expert matrices {} / {} / {}: {} gate rows, {} up rows, {} down inputs", m.gate.name, m.up.name,
             m.down.name, m.gate.out, m.up.out, m.down.in);
      m.g.resize(m.R * m.gate.out);
      m.u.resize(m.R * m.up.out);
      m.y.resize(m.R * H);
      const float* xm = m.e < 0 ? x : m.x.data();
      jobs.push_back({m.g.data(), xm, m.R, &m.gate});
      jobs.push_back({m.u.data(), xm, m.R, &m.up});
    }
    if (with_shared) jobs.push_back({sg.data(), x, T, &w.shared_expert_gate});
    linear_many(jobs, nt);
    jobs.clear();
    for (int64_t i = 0; i < n; ++i) {
      Mlp& m = batch[i];
      for (size_t j = 0; j < m.g.size(); ++j) m.g[j] = silu(m.g[j]) * m.u[j];
      jobs.push_back({m.y.data(), m.g.data(), m.R, &m.down});
    }
    linear_many(jobs, nt);
    for (int64_t i = 0; i < n; ++i) {
      const Mlp& m = batch[i];
      if (m.e < 0) {
        for (int64_t t = 0; t < T; ++t) axpy(out + t * H, sigmoid(sg[t]), &m.y[t * H], H);
      } else {
        const auto& rows = by_expert[m.e];
        for (int64_t r = 0; r < m.R; ++r) axpy(out + rows[r].first * H, rows[r].second, &m.y[r * H], H);
      }
    }
    n = 0;
    rows_in_batch = 0;
  };
  for (int64_t e = 0; e < E; ++e) {
    const auto& rows = by_expert[e];
    if (rows.empty()) continue;
    Mlp& m = next_slot();
    m.e = e;
    m.gate = w.gate.expert(e);
    m.up = w.up.expert(e);
    m.down = w.down.expert(e);
    m.R = static_cast<int64_t>(rows.size());
    m.x.resize(m.R * H);
    for (int64_t r = 0; r < m.R; ++r) std::copy_n(x + rows[r].first * H, H, &m.x[r * H]);
    rows_in_batch += m.R;
    if (rows_in_batch >= kBatchRows) run_batch(false);
  }
  Mlp& shared = next_slot();
  shared.e = -1;
  shared.gate = w.shared_gate;
  shared.up = w.shared_up;
  shared.down = w.shared_down;
  shared.R = T;
  run_batch(true);
}

}  // namespace fern::cpu
