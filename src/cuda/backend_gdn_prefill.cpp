// Gated DeltaNet core for a chunk of T > 1 prompt rows (prefill). Shapes are checked by gdn_core.
// Supported head shapes (all real ones) run the multi-row kernels of gdn_prefill.cu: conv/norm pre-pass, one
// register-resident scan over the rows, gated norm (three launches per layer instead of one per row). Any other
// shape keeps the one-token kernel, launched once per row; FERN_GDN_PREFILL=rows forces that path (to bisect
// whole-model differences between the two).
#include <cstdlib>
#include <cstring>

#include "cuda/backend_internal.h"
#include "cuda/gdn_prefill.h"

namespace fern {
using namespace cuda_backend_detail;

void CudaBackend::gdn_prefill_(Tensor y, Tensor mixed, Tensor z, Tensor b, Tensor a, const GdnWeights& w,
                               const ModelConfig& cfg, SequenceState& state, int layer) {
  CudaState& st = cuda_state(state);
  const int T = static_cast<int>(mixed.dim(0));
  const cuda::GdnShape sh = gdn_shape(cfg);
  float* conv = f32(st.conv_state.at(layer), "conv state");
  float* rec = f32(st.recurrent_state.at(layer), "recurrent state");
  const char* force = std::getenv("FERN_GDN_PREFILL");
  if (cuda::gdn_prefill_ok(sh) && !(force && std::strcmp(force, "rows") == 0)) {
    Tensor xc = scratch(DType::F32, {cuda::gdn_prefill_scratch_floats(sh, T)});
    cuda::gdn_prefill(ctx(0), sh, T, f32(mixed, "gdn mixed"), f32(z, "gdn z"), f32(b, "gdn b"), f32(a, "gdn a"),
                      f32(w.conv_w, "conv_w"), f32(w.A_log, "A_log"), f32(w.dt_bias, "dt_bias"),
                      f32(w.norm_w, "norm_w"), conv, rec, f32(y, "gdn y"), f32(xc, "gdn scratch"));
  } else {
    const bool early = last_gdn_state_ != rec;
    // Rows are sequential through the state: one decode-step launch per row.
    for (int t = 0; t < T; ++t)
      cuda::gdn_step(ctx(0), sh, t, f32(mixed, "gdn mixed"), f32(z, "gdn z"), f32(b, "gdn b"), f32(a, "gdn a"),
                     f32(w.conv_w, "conv_w"), f32(w.A_log, "A_log"), f32(w.dt_bias, "dt_bias"),
                     f32(w.norm_w, "norm_w"), conv, rec, f32(y, "gdn y"), early);
  }
  last_gdn_state_ = rec;
}

}  // namespace fern
