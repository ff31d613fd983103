// Gated DeltaNet core for one token (decode). gdn_decode_ (through gdn_core, whose shapes it has checked): the step
// kernel, then the gated norm kernel (gdn.cu). gdn_core_linear, the path of the forward pass: the step kernel writes
// the raw delta-rule output and the out_proj GEMV applies the gated norm while staging it (linear.cu,
// linear_gated_norm), so the norm costs no launch and no round trip at the end of the step kernel. For prompt rows
// gdn_prefill_linear_ (cuda_backend.cpp) computes the norm straight into out_proj's GEMM rows instead. gdn_mixer,
// with FERN_CUDA_GDN_FUSE=1, 2 or 3: the input projections and the step kernel as one launch (cuda::gdn_proj_step).
#include "core/env.h"
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

bool CudaBackend::gdn_out_fused_(Tensor mixed, const GdnWeights& w, const ModelConfig& cfg) const {
  const cuda::GdnShape sh = gdn_shape(cfg);
  return mixed.dim(0) == 1 && cuda::gdn_step_ok(sh) && cuda::linear_gated_norm_ok(cuda::make_qw(w.out_proj), sh.Dv) &&
         w.out_proj.in == cfg.gdn_value_dim() && w.norm_w.numel() == sh.Dv;
}

void CudaBackend::gdn_out_proj_(Tensor out, Tensor y, Tensor z, const GdnWeights& w, const ModelConfig& cfg) {
  const cuda::GdnShape sh = gdn_shape(cfg);
  const cuda::QW wo = cuda::make_qw(w.out_proj);
  // z was written before the step kernel, which sits between: the GEMV may read it before its PDL wait.
  cuda::RouteFold fold;
  const bool folded = take_fold_(out, wo, &fold, /*attn=*/false);  // the MoE's router in this GEMV too
  cuda::linear_gated_norm(ctx(), wo, f32(y, "gdn y"), f32(z, "gdn z"), f32(w.norm_w, "norm_w"), sh.eps, sh.Dv,
                          f32(out, "gdn out"), /*early_z=*/true, folded ? &fold : nullptr);
}

void CudaBackend::gdn_core_linear(Tensor out, Tensor y, Tensor mixed, Tensor z, Tensor b, Tensor a,
                                  const GdnWeights& w, const ModelConfig& cfg, SequenceState& state, int layer) {
  const cuda::GdnShape sh = gdn_shape(cfg);
  const int64_t V = cfg.gdn_value_dim();
  if (!gdn_out_fused_(mixed, w, cfg)) {
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
  cuda::gdn_step_raw(ctx(0), sh, 0, f32(mixed, "gdn mixed"), f32(b, "gdn b"), f32(a, "gdn a"),
                     f32(w.conv_w, "conv_w"), f32(w.A_log, "A_log"), f32(w.dt_bias, "dt_bias"), conv, rec,
                     f32(y, "gdn y"), early);
  last_gdn_state_ = rec;
  gdn_out_proj_(out, y, z, w, cfg);
}

// The projections and the step in one launch for one token (cuda::gdn_proj_step, the GDN form of the projections'
// kernel: docs/notes/cuda-decode-v39-gdn-fused.md) where FERN_CUDA_GDN_FUSE=1, 2 or 3 (the step blocks' state
// requested after their rows, or into shared memory at the start; 3 as 2 without the register cap that lets
// out_proj's blocks in beside the step's: linear.cu gdn_proj_kernel) and the shapes, formats and GPU allow it, then
// out_proj as gdn_core_linear runs it; otherwise the ops one after the other (Backend::gdn_mixer). The switch is
// read at every call (0, the default until measured: the two launches; an unknown value is an error naming it).
// The fused forms always fold the input norm into their kernel, so FERN_CUDA_NORM_FOLD=0 keeps the ops.
void CudaBackend::gdn_mixer(Tensor out, Tensor h, Tensor norm_w, float eps, Tensor xn, Tensor mixed, Tensor z,
                            Tensor b, Tensor a, Tensor y, const GdnWeights& w, const ModelConfig& cfg,
                            SequenceState& state, int layer) {
  const int form = env_choice("FERN_CUDA_GDN_FUSE", {"0", "1", "2", "3"}, 0);
  const int64_t H = h.dim(-1), V = cfg.gdn_value_dim();
  const LinearWeight* const ws[] = {&w.in_proj_qkv, &w.in_proj_z, &w.in_proj_b, &w.in_proj_a};
  const cuda::GdnShape sh = gdn_shape(cfg);
  const cuda::Ctx c = ctx(0, kMoeFusedCounterBase);  // the GDN counters' slice
  // The fused launch's checks, the cheap ones first (the default, form 0, and prompt rows stop at them).
  bool fused = form != 0 && h.numel() == H && norm_w.numel() == H && xn.numel() == H && ws[0]->in == H &&
               env_choice("FERN_CUDA_NORM_FOLD", {"0", "1"}, 1) == 1 && gdn_out_fused_(mixed, w, cfg);
  cuda::QW q[4];
  if (fused) {
    for (int i = 0; i < 4; ++i) q[i] = cuda::make_qw(*ws[i]);
    fused = cuda::gdn_proj_step_ok(c, q, 4, sh, form);
  }
  if (!fused) {
    Backend::gdn_mixer(out, h, norm_w, eps, xn, mixed, z, b, a, y, w, cfg, state, layer);
    return;
  }
  const Tensor outs[] = {mixed, z, b, a};
  const std::vector<float*> ys = out_rows(outs, ws, 1, "gdn_mixer");
  FERN_CHECK(y.numel() == V && out.numel() == w.out_proj.out, "gdn_mixer: shapes y {} out {} for out_proj [{}, {}]",
             y.shape_str(), out.shape_str(), w.out_proj.out, w.out_proj.in);
  join_side();
  CudaState& st = cuda_state(state);
  float* rec = f32(st.recurrent_state.at(layer), "recurrent state");
  cuda::gdn_proj_step(c, form, q, f32(h, "gdn_mixer h"), f32(norm_w, "gdn_mixer norm"), eps, f32(xn, "gdn_mixer xn"),
                      ys.data(), sh, f32(w.conv_w, "conv_w"), f32(w.A_log, "A_log"), f32(w.dt_bias, "dt_bias"),
                      f32(st.conv_state.at(layer), "conv state"), rec, f32(y, "gdn y"));
  last_gdn_state_ = rec;
  ++gdn_fused_;
  gdn_out_proj_(out, y, z, w, cfg);
}

}  // namespace fern
