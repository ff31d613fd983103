// Sparse MoE block for one token (decode): the whole block in one launch (moe_fused.cu) where the formats allow,
// otherwise fused router + top-k, the selected experts' gate/up with SiLU*up, and down with the routing weights and
// the gated shared expert (moe.cu). Shapes are checked by moe(). moe_residual hands the preceding residual add +
// RMSNorm and the following residual add to the same launch; moe_residual_project also the next layer's input norm
// and projections.
#include <cstdlib>
#include <cstring>

#include "cuda/backend_internal.h"

namespace fern {
using namespace cuda_backend_detail;
namespace {

// FERN_CUDA_MOE_NEXT=0 keeps the next layer's projections in their own launch (moe_residual_project; read at every
// call, for comparisons); 1 or unset runs them in the MoE's launch where the kernel takes them. Any other value is
// an error naming the switch.
bool next_enabled() {
  const char* e = std::getenv("FERN_CUDA_MOE_NEXT");
  if (e == nullptr || std::strcmp(e, "1") == 0) return true;
  if (std::strcmp(e, "0") == 0) return false;
  fail("FERN_CUDA_MOE_NEXT: want 1 or 0, got '{}'", e);
}

// FERN_CUDA_MOE_FUSED=0 keeps the three launches (for comparisons).
bool fused_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("FERN_CUDA_MOE_FUSED");
    return e == nullptr || std::strcmp(e, "0") != 0;
  }();
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
                             const cuda::MoeNorm* norm, const cuda::MoeNext* next) {
  // The fused kernel's counters share the GDN slice (backend_internal.h).
  if (out.dim(0) != 1 || !fused_enabled() ||
      cfg.linear_num_key_heads + cfg.linear_num_value_heads > kMoeFusedCounterBase)
    return false;
  const int k = cfg.num_experts_per_tok;
  const cuda::MoeScratch s = moe_scratch(*this, 1, k, w.router.out, w.gate.out, w.shared_gate.out);
  const cuda::MoeQW q{cuda::make_qw(w.router), cuda::make_qw(w.shared_expert_gate), cuda::make_qw(w.gate),
                      cuda::make_qw(w.up),     cuda::make_qw(w.down),               cuda::make_qw(w.shared_gate),
                      cuda::make_qw(w.shared_up), cuda::make_qw(w.shared_down)};
  return cuda::moe_fused(ctx(kMoeFusedCounterBase, cuda::kMoeFusedCounters), q, x, s, f32(out, "moe out"), k, norm,
                         next);
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

void CudaBackend::moe_residual_project(Tensor resid, Tensor delta, Tensor xn, Tensor norm_w, float eps, Tensor out,
                                       const MoeWeights& w, const ModelConfig& cfg, Tensor next_norm_w,
                                       std::span<const Tensor> next_outs,
                                       std::span<const LinearWeight* const> next_ws) {
  FERN_CHECK(next_outs.size() == next_ws.size(), "moe_residual_project: {} outputs for {} weights", next_outs.size(),
             next_ws.size());
  const int64_t H = resid.dim(-1);
  bool one_row = resid.numel() == H && delta.numel() == H && xn.numel() == H && norm_w.numel() == H &&
                 out.numel() == H && next_norm_w.numel() == H && moe_shapes_ok(w, H, cfg) && !next_ws.empty() &&
                 next_ws.size() <= size_t(cuda::kMoeNextMats) && next_enabled();
  for (size_t i = 0; one_row && i < next_ws.size(); ++i)
    one_row = next_ws[i]->in == H && next_outs[i].numel() == next_ws[i]->out && next_outs[i].dtype == DType::F32;
  if (one_row) {
    join_side();
    cuda::MoeNorm n;
    n.resid = f32(resid, "moe_residual_project resid");
    n.delta = f32(delta, "moe_residual_project delta");
    n.w = f32(norm_w, "moe_residual_project norm");
    n.eps = eps;
    n.xn = f32(xn, "moe_residual_project xn");
    n.add_out = true;
    cuda::MoeNext nx;
    nx.n = static_cast<int>(next_ws.size());
    for (int i = 0; i < nx.n; ++i) {
      nx.w[i] = cuda::make_qw(*next_ws[size_t(i)]);
      nx.y[i] = f32(next_outs[size_t(i)], "moe_residual_project next out");
    }
    nx.norm_w = f32(next_norm_w, "moe_residual_project next norm");
    nx.eps = eps;
    nx.xn = n.xn;  // written again, after the MoE's own use: xn ends as the next layer's normed input
    if (moe_fused_(out.reshape({1, H}), nullptr, w, cfg, &n, &nx)) return;
  }
  Backend::moe_residual_project(resid, delta, xn, norm_w, eps, out, w, cfg, next_norm_w, next_outs, next_ws);
}

}  // namespace fern
