// The gated delta rule of one value head (MODEL.md 2.4 step 8) in its two forms: the token-by-token recurrence
// (decode) and the chunked WY form (prefill). Both run in fp32 on a [Dk, Dv] state S[i = key dim][j = value dim].
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/cpu_ops.h"
#include "cpu/simd.h"

namespace fern::cpu {

void delta_rule_recurrent(const DeltaRuleHead& h) {
  const int64_t Dk = h.Dk, Dv = h.Dv;
  std::vector<float> m(Dv), u(Dv);
  for (int64_t t = 0; t < h.T; ++t) {
    const float* q = h.q + t * h.q_stride;
    const float* k = h.k + t * h.k_stride;
    const float* v = h.v + t * h.v_stride;
    float* o = h.o + t * h.o_stride;
    const float decay = std::exp(h.g[t * h.gate_stride]);
    const float beta = h.beta[t * h.gate_stride];
    // S <- decay * S and m = S^T k (what the memory predicts for k), in one pass over S.
    std::fill(m.begin(), m.end(), 0.0f);
    for (int64_t i = 0; i < Dk; ++i) {
      float* row = h.S + i * Dv;
      const float ki = k[i];
#pragma omp simd
      for (int64_t j = 0; j < Dv; ++j) {
        row[j] *= decay;
        m[j] += row[j] * ki;
      }
    }
    for (int64_t j = 0; j < Dv; ++j) u[j] = beta * (v[j] - m[j]);
    // S <- S + k u^T, then o = S^T q read from the updated state, again in one pass.
    std::fill(o, o + Dv, 0.0f);
    for (int64_t i = 0; i < Dk; ++i) {
      float* row = h.S + i * Dv;
      const float ki = k[i], qi = q[i];
#pragma omp simd
      for (int64_t j = 0; j < Dv; ++j) {
        row[j] += ki * u[j];
        o[j] += row[j] * qi;
      }
    }
  }
}

// One chunk of L <= C tokens (MODEL.md 2.4, chunked form). The reference pads the tail chunk with zeros
// (k = v = 0, beta = 0, g = 0); such rows add exact zeros to every sum below, so only the L real rows are
// computed. With Gamma the in-chunk cumulative log decay:
//   A[r,s] = beta_r (k_r . k_s) exp(Gamma_r - Gamma_s), s < r;  (I + A) U = diag(beta) V;
//   (I + A) W = diag(beta exp(Gamma)) K;  V' = U - W S0;
//   O = diag(exp(Gamma)) Q S0 + (Mask . Q K^T) V',  Mask[r,s] = exp(Gamma_r - Gamma_s) for s <= r;
//   S = exp(Gamma_L) S0 + (diag(exp(Gamma_L - Gamma)) K)^T V'.
// Every exponent is <= 0, so extreme decays underflow to 0 instead of overflowing.
void delta_rule_chunked(const DeltaRuleHead& h, int64_t chunk) {
  const int64_t Dk = h.Dk, Dv = h.Dv, C = chunk;
  std::vector<float> K(C * Dk), Q(C * Dk), U(C * Dv), W(C * Dk), A(C * C), bet(C), dec(C), S0(Dk * Dv);
  // Gamma in double: a cumulative sum of log decays reaches hundreds within a chunk when decays are strong, and
  // the fp32 difference of two such sums would carry an absolute error of ~1e-5 into every decay factor.
  std::vector<double> gam(C);
  for (int64_t c0 = 0; c0 < h.T; c0 += C) {
    const int64_t L = std::min(C, h.T - c0);
    double cum = 0.0;
    for (int64_t r = 0; r < L; ++r) {
      const int64_t t = c0 + r;
      std::copy_n(h.k + t * h.k_stride, Dk, &K[r * Dk]);
      std::copy_n(h.q + t * h.q_stride, Dk, &Q[r * Dk]);
      cum += h.g[t * h.gate_stride];
      gam[r] = cum;
      bet[r] = h.beta[t * h.gate_stride];
    }
    // A (strictly lower part) and the forward substitutions for U and W.
    for (int64_t r = 0; r < L; ++r) {
      for (int64_t s = 0; s < r; ++s)
        A[r * C + s] = bet[r] * dot(&K[r * Dk], &K[s * Dk], Dk) * static_cast<float>(std::exp(gam[r] - gam[s]));
      float* ur = &U[r * Dv];
      const float* v = h.v + (c0 + r) * h.v_stride;
      for (int64_t j = 0; j < Dv; ++j) ur[j] = bet[r] * v[j];
      float* wr = &W[r * Dk];
      const float wscale = bet[r] * static_cast<float>(std::exp(gam[r]));
      for (int64_t i = 0; i < Dk; ++i) wr[i] = wscale * K[r * Dk + i];
      for (int64_t s = 0; s < r; ++s) {
        axpy(ur, -A[r * C + s], &U[s * Dv], Dv);
        axpy(wr, -A[r * C + s], &W[s * Dk], Dk);
      }
    }
    std::copy_n(h.S, Dk * Dv, S0.data());
    // V' = U - W S0, written over U.
    for (int64_t r = 0; r < L; ++r)
      for (int64_t i = 0; i < Dk; ++i) axpy(&U[r * Dv], -W[r * Dk + i], &S0[i * Dv], Dv);
    // O = diag(exp(Gamma)) Q S0 + (Mask . Q K^T) V'.
    for (int64_t r = 0; r < L; ++r) {
      float* o = h.o + (c0 + r) * h.o_stride;
      std::fill(o, o + Dv, 0.0f);
      for (int64_t i = 0; i < Dk; ++i) axpy(o, Q[r * Dk + i], &S0[i * Dv], Dv);
      const float er = static_cast<float>(std::exp(gam[r]));
      for (int64_t j = 0; j < Dv; ++j) o[j] *= er;
      for (int64_t s = 0; s <= r; ++s)
        axpy(o, dot(&Q[r * Dk], &K[s * Dk], Dk) * static_cast<float>(std::exp(gam[r] - gam[s])), &U[s * Dv], Dv);
    }
    // S = exp(Gamma_L) S0 + sum_r exp(Gamma_L - Gamma_r) k_r V'_r^T.
    const double gl = gam[L - 1];
    const float el = static_cast<float>(std::exp(gl));
    for (int64_t r = 0; r < L; ++r) dec[r] = static_cast<float>(std::exp(gl - gam[r]));
    for (int64_t i = 0; i < Dk; ++i) {
      float* row = h.S + i * Dv;
      for (int64_t j = 0; j < Dv; ++j) row[j] = el * S0[i * Dv + j];
      for (int64_t r = 0; r < L; ++r) axpy(row, dec[r] * K[r * Dk + i], &U[r * Dv], Dv);
    }
  }
}

}  // namespace fern::cpu
