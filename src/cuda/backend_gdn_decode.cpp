// Gated DeltaNet core for one token (decode): one fused step kernel (gdn.cu). Shapes are checked by gdn_core.
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

}  // namespace fern
