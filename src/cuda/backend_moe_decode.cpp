// Sparse MoE block for one token (decode): the whole block in one launch (moe_fused.cu) where the formats allow,
// otherwise fused router + top-k, the selected experts' gate/up with SiLU*up, and down with the routing weights and
// the gated shared expert (moe.cu). Shapes are checked by moe(). moe_residual hands the preceding residual add +
// RMSNorm and the following residual add to the same launch.
#include <cstdlib>
#include <cstring>

#include "core/env.h"
#include "cuda/backend_internal.h"
#include "cuda/cuda_check.h"

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

// FERN_CUDA_MOE_FOLD=1 (the default) / 0: the MoE's router in the mixer's output projection or in the MoE launch
// (read at every announcement, for comparisons; an unknown value is an error naming the switch).
// gdn: in the GDN layers' out_proj only (for comparisons).
int fold_mode() { return env_choice("FERN_CUDA_MOE_FOLD", {"0", "1", "gdn"}, 1); }
// The pre-logits' spacing (FERN_CUDA_MOE_FOLD_STRIDE=1: packed, 32: a 256-byte line each, the default; for
// comparisons).
int fold_stride() { return env_choice("FERN_CUDA_MOE_FOLD_STRIDE", {"1", "32"}, 1) == 0 ? 1 : cuda::kFoldStride; }

}  // namespace

bool CudaBackend::moe_fused_(Tensor out, const float* x, const MoeWeights& w, const ModelConfig& cfg,
                             const cuda::MoeNorm* norm) {
  // The fused kernel's counters share the GDN slice (backend_internal.h).
  if (out.dim(0) != 1 || !fused_enabled() ||
      cfg.linear_num_key_heads + cfg.linear_num_value_heads > kMoeFusedCounterBase)
    return false;
  const int k = cfg.num_experts_per_tok;
  const cuda::MoeScratch s = moe_scratch(*this, 1, k, w.router.out, w.gate.out, w.shared_gate.out);
  return cuda::moe_fused(ctx(kMoeFusedCounterBase, cuda::kMoeFusedCounters), cuda::make_moe_qw(w), x, s,
                         f32(out, "moe out"), k, norm);
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

void CudaBackend::expect_moe_residual(Tensor resid, Tensor delta, Tensor norm_w, const MoeWeights& w,
                                      const ModelConfig& cfg) {
  ahead_ = {};
  const int64_t H = resid.dim(-1);
  if (fold_mode() == 0 || !fused_enabled() ||
      cfg.linear_num_key_heads + cfg.linear_num_value_heads > kMoeFusedCounterBase || resid.numel() != H ||
      delta.numel() != H || norm_w.numel() != H ||
      resid.dtype != DType::F32 || delta.dtype != DType::F32 || norm_w.dtype != DType::F32 ||
      !moe_shapes_ok(w, H, cfg) || w.router.out + 1 > kFoldPreMax)
    return;
  // The router repacked for the fold's loads (route_fold_pack), once per router: weights live as long as the backend,
  // so their addresses are not reused. Made here, ahead of the mixer's launches, by an eager step (a capture before
  // any eager step keeps the router in the MoE), and without PDL: the mixer's kernels, which wait for their
  // predecessors, sit between it and the projection that reads it before its own wait.
  if (fold_packed_.find(w.router.w.data) == fold_packed_.end()) {
    const cuda::QW r = cuda::make_qw(w.router), g = cuda::make_qw(w.shared_expert_gate);
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    FERN_CUDA_CHECK(cudaStreamIsCapturing(stream_, &cap));
    if (cap != cudaStreamCaptureStatusNone || !cuda::route_fold_pack_ok(r, g)) return;
    join_side();
    Tensor t = alloc(DType::U8, {int64_t(cuda::route_fold_pack_bytes(r))});
    cuda::Ctx c = ctx();
    c.pdl = false;
    cuda::route_fold_pack(c, r, g, t.data);
    fold_packed_.emplace(r.w, t.data);
  }
  ahead_ = {resid.data, delta.data, norm_w.data, &w, &cfg};
}

bool CudaBackend::take_fold_(Tensor out, const cuda::QW& proj, cuda::RouteFold* f, bool attn) {
  if (ahead_.delta == nullptr || out.data != ahead_.delta) return false;
  const MoeAhead a = ahead_;
  ahead_ = {};  // one projection writes delta: this one, folded or not
  if (attn && fold_mode() == 2) return false;
  const int k = a.cfg->num_experts_per_tok;
  if (out.numel() != proj.out || !cuda::moe_fused_fold_ok(ctx(kMoeFusedCounterBase, cuda::kMoeFusedCounters),
                                                          cuda::make_moe_qw(*a.w), k))
    return false;
  f->router = cuda::make_qw(a.w->router);
  f->sgr = cuda::make_qw(a.w->shared_expert_gate);
  f->norm_w = static_cast<const float*>(a.norm_w);
  f->resid = static_cast<float*>(const_cast<void*>(a.resid));
  f->pre = fold_pre_;
  f->stride = fold_stride();
  const auto it = fold_packed_.find(f->router.w);  // made by expect_moe_residual
  if (it == fold_packed_.end()) return false;
  f->packed = it->second;
  if (!cuda::route_fold_ok(proj, *f)) return false;
  folded_ = a;
  folded_stride_ = f->stride;
  ++moe_folds_;
  return true;
}

void CudaBackend::moe_residual(Tensor resid, Tensor delta, Tensor xn, Tensor norm_w, float eps, Tensor out,
                               const MoeWeights& w, const ModelConfig& cfg) {
  const int64_t H = resid.dim(-1);
  ahead_ = {};
  if (folded_.resid != nullptr) {
    // The projection has added delta to resid and left the router's pre-logits: only the fold's MoE form may follow.
    const MoeAhead a = folded_;
    folded_ = {};
    FERN_CHECK(a.resid == resid.data && a.delta == delta.data && a.norm_w == norm_w.data && a.w == &w &&
                   xn.numel() == H && out.numel() == H,
               "moe_residual: not the call expect_moe_residual announced (its router ran in the projection)");
    join_side();
    cuda::MoeNorm n;
    n.resid = f32(resid, "moe_residual resid");
    n.w = f32(norm_w, "moe_residual norm");
    n.eps = eps;
    n.xn = f32(xn, "moe_residual xn");
    n.add_out = true;
    n.pre = fold_pre_;
    n.pre_stride = folded_stride_;
    FERN_CHECK(moe_fused_(out.reshape({1, H}), nullptr, w, cfg, &n), "moe_residual: the fold's MoE form was refused");
    return;
  }
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
  // Several rows: the residual add after the block in the MoE's combine pass (FERN_MOE_RESID=combine, the default;
  // add: its own launch, as before). The same sums in the same order: the same bits. Read at every call. Measured on
  // the H200 (docs/notes/cuda-prefill-v29-resid-combine.md): a 4K prefill's kernels 0.44 ms shorter (combine 3.63 ms
  // + add 1.08 -> combine 4.27 ms of the frontier).
  const int64_t T = resid.dim(0);
  const bool in_combine = env_choice("FERN_MOE_RESID", {"combine", "add"}, 0) == 0;
  if (T > 1 && in_combine && resid.dtype == DType::F32 && out.dtype == DType::F32 && resid.numel() == T * H &&
      out.numel() == T * H && xn.numel() == T * H && out.data != resid.data && out.data != xn.data) {
    FERN_CHECK(delta.numel() == T * H && norm_w.numel() == H, "moe_residual: delta {} norm {} for {} rows of {}",
               delta.shape_str(), norm_w.shape_str(), T, H);
    join_side();
    moe_checks_(w, cfg);
    const MoeInNorm nm{f32(resid, "moe_residual resid"), f32(delta, "moe_residual delta"),
                       f32(norm_w, "moe_residual norm"), eps};
    bool added = false;
    with_released_scratch([&] { added = moe_prefill_(out, xn, w, cfg, &nm); });
    if (!added) add(resid, resid, out);
    return;
  }
  Backend::moe_residual(resid, delta, xn, norm_w, eps, out, w, cfg);
}

}  // namespace fern
