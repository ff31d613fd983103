// The CPU backend's kernels as plain functions on fp32 host arrays, one family per source file (linear.cpp,
// norm.cpp, embed.cpp, gdn.cpp, delta_rule.cpp, attention.cpp, moe.cpp). CpuBackend (cpu_backend.cpp) checks the
// tensors and calls these; tests call them directly too. `nt` is the OpenMP thread count of a parallel region.
#pragma once
#include <cstdint>
#include <span>

#include "cpu/cpu_backend.h"
#include "model/config.h"
#include "model/weights.h"

namespace fern::cpu {

// ---- linear.cpp ----
// Throws fern::Error naming the weight when its tensors do not describe a valid dense or affine matrix.
void validate_linear(const LinearWeight& w);
// Row n of a plain (non-stacked) weight, dequantized to fp32: dst[k] = W[n, k], k < w.in.
void dequant_row(const LinearWeight& w, int64_t n, float* dst);
// out[t, n] = sum_k x[t, k] W[n, k] for t < T, n < w.out. The weight is read once per call, and every output is
// the same fp32 computation whatever T is and whatever the thread count (so results do not depend on how a prompt
// is chunked).
void linear(float* out, const float* x, int64_t T, const LinearWeight& w, int nt);
// Several products in one parallel region (a layer's projections, the MoE's experts): jobs[i].out = jobs[i].x
// W_i^T, each output the same as linear() gives it. One region instead of one per matrix saves a barrier and the
// idle tail of each.
struct LinearJob {
  float* out;
  const float* x;
  int64_t T;
  const LinearWeight* w;
};
void linear_many(std::span<const LinearJob> jobs, int nt);

// ---- embed.cpp ----
// out[t] = row ids[t] of the (possibly quantized) table; throws fern::Error for an id outside [0, rows).
void embed(float* out, const int32_t* ids, int64_t T, const LinearWeight& table, int nt);
// ids[t] = argmax_j logits[t, j], the lowest index on ties; NaNs are never chosen (all-NaN rows give 0).
void argmax(int32_t* ids, const float* logits, int64_t T, int64_t V);

// ---- norm.cpp ----
// out[r] = x[r] * rsqrt(mean(x[r]^2) + eps) * w for R rows of D values (out may equal x).
void rmsnorm(float* out, const float* x, const float* w, int64_t R, int64_t D, float eps, int nt);
float silu(float x);
float sigmoid(float x);
float softplus(float x);  // PyTorch's: identity above 20

// ---- delta_rule.cpp ----
// One value head of the gated delta rule (MODEL.md 2.4 step 8). Row t of q/k (Dk values), v/o (Dv values) is at
// pointer + t * stride; g (log decay) and beta at g[t * gate_stride]. S is the fp32 state [Dk, Dv], updated in place.
struct DeltaRuleHead {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t q_stride = 0, k_stride = 0, v_stride = 0;
  const float* g = nullptr;
  const float* beta = nullptr;
  int64_t gate_stride = 0;
  float* o = nullptr;
  int64_t o_stride = 0;
  float* S = nullptr;
  int64_t T = 0, Dk = 0, Dv = 0;
};
void delta_rule_recurrent(const DeltaRuleHead& h);
// The chunked (WY) form with chunks of `chunk` tokens, the tail zero-padded, seeded with the state in S.
void delta_rule_chunked(const DeltaRuleHead& h, int64_t chunk = 64);

// ---- gdn.cpp ----
// MODEL.md 2.4 steps 3-9 (see Backend::gdn_core). conv_state [K-1, conv_dim] and rec_state [Hv, Dk, Dv] are
// updated in place.
void gdn_core(float* y, const float* mixed, const float* z, const float* b, const float* a, int64_t T,
              const GdnWeights& w, const ModelConfig& cfg, float* conv_state, float* rec_state, GdnForm form,
              int nt);

// ---- attention.cpp ----
// MODEL.md 2.3 steps 3-7 (see Backend::attn_core) for T tokens at positions pos..pos+T-1; k_cache and v_cache
// [capacity, kv_heads, head_dim] receive rows pos..pos+T-1.
void attn_core(float* o, const float* qg, const float* k, const float* v, int64_t T, int64_t pos,
               const AttnWeights& w, const ModelConfig& cfg, float* k_cache, float* v_cache, int nt);

// ---- moe.cpp ----
// Router (fp32 softmax over all experts, top-k with the lowest index winning ties, renormalised when
// cfg.norm_topk_prob): writes the k chosen experts (by descending probability) and their weights per token.
void moe_route(const float* router_logits, int64_t T, int64_t E, int k, bool renormalise, int32_t* idx,
               float* weight);
void moe(float* out, const float* x, int64_t T, const MoeWeights& w, const ModelConfig& cfg, int nt);

}  // namespace fern::cpu
