// Gated full attention core (MODEL.md 2.3 steps 3-7): per-head q/k RMSNorm, partial rotate-half RoPE on the first
// rotary_dim dims, KV cache append, causal GQA attention with an fp32 softmax, and the sigmoid output gate.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/cpu_ops.h"
#include "cpu/simd.h"

namespace fern::cpu {
namespace {

// Rotate-half RoPE on x[0, rd): pairs (d, d + rd/2) turn by angle pos * inv_freq[d].
void rope(float* x, int64_t pos, const std::vector<float>& inv_freq) {
  const int64_t half = static_cast<int64_t>(inv_freq.size());
  for (int64_t d = 0; d < half; ++d) {
    // The angle is the fp32 product, as fp32 frameworks form it, before cos/sin.
    const float ang = static_cast<float>(pos) * inv_freq[d];
    const float c = std::cos(ang), s = std::sin(ang);
    const float x0 = x[d], x1 = x[d + half];
    x[d] = x0 * c - x1 * s;
    x[d + half] = x1 * c + x0 * s;
  }
}

}  // namespace

void attn_core(float* o, const float* qg, const float* k, const float* v, int64_t T, int64_t pos,
               const AttnWeights& w, const ModelConfig& cfg, float* k_cache, float* v_cache, int nt) {
  const int64_t H = cfg.num_attention_heads, KVH = cfg.num_key_value_heads, hd = cfg.head_dim;
  const int64_t rd = cfg.rotary_dim(), group = H / KVH, kv_row = KVH * hd;
  const float eps = static_cast<float>(cfg.rms_norm_eps);
  std::vector<float> inv_freq(rd / 2);
  for (int64_t i = 0; i < rd / 2; ++i)
    inv_freq[i] = static_cast<float>(1.0 / std::pow(cfg.rope_theta, double(2 * i) / double(rd)));

  // Keys: norm + RoPE into the cache; values: straight into the cache.
  for (int64_t t = 0; t < T; ++t) {
    float* kc = k_cache + (pos + t) * kv_row;
    rmsnorm(kc, k + t * kv_row, w.k_norm.ptr<float>(), KVH, hd, eps, 1);
    for (int64_t kh = 0; kh < KVH; ++kh) rope(kc + kh * hd, pos + t, inv_freq);
    std::copy_n(v + t * kv_row, kv_row, v_cache + (pos + t) * kv_row);
  }

  const float scale = static_cast<float>(1.0 / std::sqrt(double(hd)));
#pragma omp parallel num_threads(nt) if (H * T * (pos + T) * hd >= kParallelWork)
  {
    std::vector<float> q(hd), p(pos + T);
#pragma omp for collapse(2) schedule(dynamic, 4)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const float* qh = qg + t * (2 * H * hd) + h * 2 * hd;  // per head [query | gate]
        const float* gate = qh + hd;
        rmsnorm(q.data(), qh, w.q_norm.ptr<float>(), 1, hd, eps, 1);
        rope(q.data(), pos + t, inv_freq);
        const int64_t kh = h / group, n = pos + t + 1;  // causal: keys 0..pos+t
        float mx = -INFINITY;
        for (int64_t j = 0; j < n; ++j) {
          p[j] = dot(q.data(), k_cache + j * kv_row + kh * hd, hd) * scale;
          mx = std::max(mx, p[j]);
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < n; ++j) {
          p[j] = std::exp(p[j] - mx);
          sum += p[j];
        }
        float* out = o + t * (H * hd) + h * hd;
        std::fill(out, out + hd, 0.0f);
        for (int64_t j = 0; j < n; ++j) axpy(out, p[j], v_cache + j * kv_row + kh * hd, hd);
        const float inv = 1.0f / sum;
        for (int64_t d = 0; d < hd; ++d) out[d] *= inv * sigmoid(gate[d]);
      }
  }
}

}  // namespace fern::cpu
