// Sparse MoE block for one token (decode): the whole block in one launch (moe_fused.cu) where the formats allow,
// otherwise fused router + top-k, the selected experts' gate/up with SiLU*up, and down with the routing weights and
// the gated shared expert (moe.cu). Shapes are checked by moe(). moe_residual hands the preceding residual add +
// RMSNorm and the following residual add to the same launch.
#include <cstdlib>
#include <cstring>

#include "core/env.h"
#include "cuda/backend_internal.h"

namespace fern {
using namespace cuda_backend_detail;
namespace {

// FERN_CUDA_MOE_FUSED=0 keeps the three launches (for comparisons).
bool fused_enabled() {
  static const bool on = env_choice("FERN_CUDA_MOE_FUSED", {"0", "1"}, 1) == 1;
  return on;
}

cuda::MoeScratch moe_scratch(CudaBackend& be, int T, int k, int64_t E, int64_t I, int64_t Is) {
  cuda::MoeScratch s;
  s.router_logits = be.scratch(DType::F32, {T, E}).ptr<float>();
  s.sgate_logit = be.scratch(DType::F32, {T}).ptr<float>();
  s.topk_ids = be.scratch(DType::I32, {T, k}).ptr<int32_t>();
  s.topk_w = be.scratch(DType::F32, {T, k}).ptr<float>();
  s.sgate = be.scratch(DType::F32, {T}).ptr<float>();
  s.h = be.scratch(DType::F32, {T, k * I + Is}).ptr<float>();
  return s;
}

// What moe() checks, for the fused entry that bypasses it (on failure the default path reports the error).
bool moe_shapes_ok(const MoeWeights& w, int64_t H, const ModelConfig& cfg) {
  const int64_t E = w.router.out;
  const int k = cfg.num_experts_per_tok;
  return w.router.in == H && w.gate.experts == E && w.up.experts == E && w.down.experts == E && k >= 1 && k <= E &&
         k <= 64;
}

}  // namespace

bool CudaBackend::moe_fused_(Tensor out, const float* x, const MoeWeights& w, const ModelConfig& cfg,
                             const cuda::MoeNorm* norm) {
  // The fused kernel's counters share the GDN slice (backend_internal.h).
  if (out.dim(0) != 1 || !fused_enabled() ||
      cfg.linear_num_key_heads + cfg.linear_num_value_heads > kMoeFusedCounterBase)
    return false;
  const int k = cfg.num_experts_per_tok;
  const cuda::MoeScratch s = moe_scratch(*this, 1, k, w.router.out, w.gate.out, w.shared_gate.out);
  const cuda::MoeQW q{cuda::make_qw(w.router), cuda::make_qw(w.shared_expert_gate), cuda::make_qw(w.gate),
                      cuda::make_qw(w.up),     cuda::make_qw(w.down),               cuda::make_qw(w.shared_gate),
                      cuda::make_qw(w.shared_up), cuda::make_qw(w.shared_down)};
  return cuda::moe_fused(ctx(kMoeFusedCounterBase, cuda::kMoeFusedCounters), q, x, s, f32(out, "moe out"), k, norm);
}

void CudaBackend::moe_decode_(Tensor out, Tensor x, const MoeWeights& w, const ModelConfig& cfg) {
  const float* xp = f32(x, "moe x");
  if (moe_fused_(out, xp, w, cfg, nullptr)) return;
  const int T = static_cast<int>(x.dim(0));
  const int k = cfg.num_experts_per_tok;
  const cuda::MoeScratch s = moe_scratch(*this, T, k, w.router.out, w.gate.out, w.shared_gate.out);
  cuda::moe_route(ctx(kMoeCounterBase, kCounters - kMoeCounterBase), cuda::make_qw(w.router),
                  cuda::make_qw(w.shared_expert_gate), xp, s, T, k);
  cuda::moe_gate_up(ctx(), cuda::make_qw(w.gate), cuda::make_qw(w.up), cuda::make_qw(w.shared_gate),
                    cuda::make_qw(w.shared_up), xp, s, T, k);
  cuda::moe_down(ctx(), cuda::make_qw(w.down), cuda::make_qw(w.shared_down), s, f32(out, "moe out"), T, k);
}

void CudaBackend::moe_residual(Tensor resid, Tensor delta, Tensor xn, Tensor norm_w, float eps, Tensor out,
                               const MoeWeights& w, const ModelConfig& cfg) {
  const int64_t H = resid.dim(-1);
  const bool one_row = resid.numel() == H && delta.numel() == H && xn.numel() == H && norm_w.numel() == H &&
                       out.numel() == H && moe_shapes_ok(w, H, cfg);
  if (one_row) {
    join_side();
    cuda::MoeNorm n;
    n.resid = f32(resid, "moe_residual resid");
    n.delta = f32(delta, "moe_residual delta");
    n.w = f32(norm_w, "moe_residual norm");
    n.eps = eps;
    n.xn = f32(xn, "moe_residual xn");
    n.add_out = true;
    if (moe_fused_(out.reshape({1, H}), nullptr, w, cfg, &n)) return;
  }
  Backend::moe_residual(resid, delta, xn, norm_w, eps, out, w, cfg);
}

}  // namespace fern
