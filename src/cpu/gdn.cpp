// Gated DeltaNet core (MODEL.md 2.4 steps 3-9): causal depthwise conv + SiLU carrying the conv state, the gates,
// l2-normalised q/k, the delta rule per value head, and the gated RMSNorm.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/cpu_ops.h"
#include "cpu/simd.h"

namespace fern::cpu {
namespace {

// y_t[c] = silu(sum_j w[c, j] x_{t-K+1+j}[c]) with x before the call taken from conv_state (oldest first); then
// conv_state becomes the last K-1 inputs.
void causal_conv_silu(float* out, const float* mixed, int64_t T, int64_t C, int64_t Kc, const float* w,
                      float* conv_state, int nt) {
  const int64_t Ks = Kc - 1;
#pragma omp parallel num_threads(nt) if (T > 1)
  {
    std::vector<float> acc(C);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = 0; j < Kc; ++j) {
        const int64_t p = t - Ks + j;  // absolute offset from the call's first token
        const float* x = p >= 0 ? mixed + p * C : conv_state + (Ks + p) * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) acc[c] += w[c * Kc + j] * x[c];
      }
      float* o = out + t * C;
      for (int64_t c = 0; c < C; ++c) o[c] = silu(acc[c]);
    }
  }
  // New state: rows T..T+Ks-1 of the concatenation [conv_state; mixed].
  std::vector<float> next(Ks * C);
  for (int64_t r = 0; r < Ks; ++r) {
    const int64_t p = T + r - Ks;
    const float* src = p >= 0 ? mixed + p * C : conv_state + (Ks + p) * C;
    std::copy_n(src, C, &next[r * C]);
  }
  std::copy(next.begin(), next.end(), conv_state);
}

// x <- x * rsqrt(sum(x^2) + 1e-6) * scale (FLA's l2norm, eps inside the root on the sum).
void l2norm_scaled(float* x, int64_t n, float scale) {
  const float inv = static_cast<float>(1.0 / std::sqrt(sum_squares(x, n) + 1e-6)) * scale;
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace

void gdn_core(float* y, const float* mixed, const float* z, const float* b, const float* a, int64_t T,
              const GdnWeights& w, const ModelConfig& cfg, float* conv_state, float* rec_state, GdnForm form,
              int nt) {
  const int64_t C = cfg.gdn_conv_dim(), Kc = cfg.linear_conv_kernel_dim;
  const int64_t Hk = cfg.linear_num_key_heads, Hv = cfg.linear_num_value_heads;
  const int64_t Dk = cfg.linear_key_head_dim, Dv = cfg.linear_value_head_dim;
  const int64_t key_dim = Hk * Dk, value_dim = Hv * Dv, ratio = Hv / Hk;
  const float eps = static_cast<float>(cfg.rms_norm_eps);

  std::vector<float> xc(T * C);
  causal_conv_silu(xc.data(), mixed, T, C, Kc, w.conv_w.ptr<float>(), conv_state, nt);

  // Gates: beta = sigmoid(b); g = -exp(A_log) softplus(a + dt_bias) (the log of the per-step decay).
  std::vector<float> beta(T * Hv), g(T * Hv);
  const float* A_log = w.A_log.ptr<float>();
  const float* dt_bias = w.dt_bias.ptr<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t hh = 0; hh < Hv; ++hh) {
      beta[t * Hv + hh] = sigmoid(b[t * Hv + hh]);
      g[t * Hv + hh] = -std::exp(A_log[hh]) * softplus(a[t * Hv + hh] + dt_bias[hh]);
    }

  // q and k heads l2-normalised in place; q also scaled by Dk^-1/2.
  const float q_scale = static_cast<float>(1.0 / std::sqrt(double(Dk)));
#pragma omp parallel for num_threads(nt) schedule(static) if (T > 1)
  for (int64_t t = 0; t < T; ++t)
    for (int64_t hk = 0; hk < Hk; ++hk) {
      l2norm_scaled(&xc[t * C + hk * Dk], Dk, q_scale);
      l2norm_scaled(&xc[t * C + key_dim + hk * Dk], Dk, 1.0f);
    }

  // Delta rule per value head (value head h reads key head h / ratio); its output goes straight into y.
  const bool chunked = form == GdnForm::Chunked || (form == GdnForm::Auto && T > 1);
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (T * Hv * Dk * Dv >= kParallelWork)
  for (int64_t hv = 0; hv < Hv; ++hv) {
    DeltaRuleHead h;
    h.q = &xc[(hv / ratio) * Dk];
    h.k = &xc[key_dim + (hv / ratio) * Dk];
    h.v = &xc[2 * key_dim + hv * Dv];
    h.q_stride = h.k_stride = h.v_stride = C;
    h.g = &g[hv];
    h.beta = &beta[hv];
    h.gate_stride = Hv;
    h.o = y + hv * Dv;
    h.o_stride = value_dim;
    h.S = rec_state + hv * Dk * Dv;
    h.T = T;
    h.Dk = Dk;
    h.Dv = Dv;
    if (chunked)
      delta_rule_chunked(h);
    else
      delta_rule_recurrent(h);
  }

  // Gated RMSNorm per head: y = rmsnorm(o) * w * silu(z).
  const float* nw = w.norm_w.ptr<float>();
#pragma omp parallel for num_threads(nt) schedule(static) if (T > 1)
  for (int64_t t = 0; t < T; ++t)
    for (int64_t hv = 0; hv < Hv; ++hv) {
      float* o = y + t * value_dim + hv * Dv;
      const float* zz = z + t * value_dim + hv * Dv;
      const float inv = static_cast<float>(1.0 / std::sqrt(sum_squares(o, Dv) / double(Dv) + double(eps)));
      for (int64_t j = 0; j < Dv; ++j) o[j] = o[j] * inv * nw[j] * silu(zz[j]);
    }
}

}  // namespace fern::cpu
