// Gated DeltaNet core for one token (decode). gdn_decode_ (through gdn_core, whose shapes it has checked): the step
// kernel, then the gated norm kernel (gdn.cu). gdn_core_linear, the path of the forward pass: the step kernel writes
// the raw delta-rule output and the out_proj GEMV applies the gated norm while staging it (linear.cu,
// linear_gated_norm), so the norm costs no launch and no round trip at the end of the step kernel. For prompt rows
// gdn_prefill_linear_ (cuda_backend.cpp) computes the norm straight into out_proj's GEMM rows instead.
#include "cuda/backend_internal.h"

namespace fern {
using namespace cuda_backend_detail;

void CudaBackend::gdn_decode_(Tensor y, Tensor mixed, Tensor z, Tensor b, Tensor a, const GdnWeights& w,
                              const ModelConfig& cfg, SequenceState& state, int layer) {
  CudaState& st = cuda_state(state);
  float* conv = f32(st.conv_state.at(layer), "conv state");
  float* rec = f32(st.recurrent_state.at(layer), "recurrent state");
  // The state may be prefetched before the PDL wait unless the previous gdn launch wrote this same state (a model
  // with one GDN layer, or two calls in a row): then the launch just before this one might be that writer.
  const bool early = last_gdn_state_ != rec;
  cuda::gdn_step(ctx(0), gdn_shape(cfg), 0, f32(mixed, "gdn mixed"), f32(z, "gdn z"), f32(b, "gdn b"), f32(a, "gdn a"),
                 f32(w.conv_w, "conv_w"), f32(w.A_log, "A_log"), f32(w.dt_bias, "dt_bias"), f32(w.norm_w, "norm_w"),
                 conv, rec, f32(y, "gdn y"), early);
  last_gdn_state_ = rec;
}

void CudaBackend::gdn_core_linear(Tensor out, Tensor y, Tensor mixed, Tensor z, Tensor b, Tensor a,
                                  const GdnWeights& w, const ModelConfig& cfg, SequenceState& state, int layer) {
  const cuda::GdnShape sh = gdn_shape(cfg);
  const cuda::QW wo = cuda::make_qw(w.out_proj);
  const int64_t V = cfg.gdn_value_dim();
  const bool fused = mixed.dim(0) == 1 && cuda::gdn_step_ok(sh) && cuda::linear_gated_norm_ok(wo, sh.Dv) &&
                     w.out_proj.in == V && w.norm_w.numel() == sh.Dv;
  if (!fused) {
    if (mixed.dim(0) > 1 && gdn_prefill_linear_(out, y, mixed, z, b, a, w, cfg, state, layer)) return;
    Backend::gdn_core_linear(out, y, mixed, z, b, a, w, cfg, state, layer);  // gdn_core's checks, then linear
    return;
  }
  FERN_CHECK(mixed.numel() == sh.conv_dim && z.numel() == V && b.numel() == sh.Hv && a.numel() == sh.Hv &&
                 y.numel() == V && out.numel() == w.out_proj.out,
             "gdn_core_linear: shapes mixed {} z {} b {} a {} y {} out {} for out_proj [{}, {}]", mixed.shape_str(),
             z.shape_str(), b.shape_str(), a.shape_str(), y.shape_str(), out.shape_str(), w.out_proj.out,
             w.out_proj.in);
  FERN_CHECK(sh.Hk <= kArgmaxCounterBase, "gdn_core_linear: too many key heads");
  join_side();
  CudaState& st = cuda_state(state);
  float* conv = f32(st.conv_state.at(layer), "conv state");
  float* rec = f32(st.recurrent_state.at(layer), "recurrent state");
  const bool early = last_gdn_state_ != rec;  // gdn_decode_ says why
  float* yp = f32(y, "gdn y");
  cuda::gdn_step_raw(ctx(0), sh, 0, f32(mixed, "gdn mixed"), f32(b, "gdn b"), f32(a, "gdn a"),
                     f32(w.conv_w, "conv_w"), f32(w.A_log, "A_log"), f32(w.dt_bias, "dt_bias"), conv, rec, yp, early);
  last_gdn_state_ = rec;
  // z was written before the step kernel, which sits between: the GEMV may read it before its PDL wait.
  cuda::RouteFold fold;
  const bool folded = take_fold_(out, wo, &fold, /*attn=*/false);  // the MoE's router in this GEMV too
  cuda::linear_gated_norm(ctx(), wo, yp, f32(z, "gdn z"), f32(w.norm_w, "norm_w"), sh.eps, sh.Dv,
                          f32(out, "gdn out"), /*early_z=*/true, folded ? &fold : nullptr);
}

}  // namespace fern
