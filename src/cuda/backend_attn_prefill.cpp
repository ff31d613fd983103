// Gated attention core for a chunk of T > 1 prompt rows (prefill) over the chunk and the KV cache of earlier
// chunks. Shapes are checked by attn_core.
#include <algorithm>

#include "cuda/backend_internal.h"

namespace fern {
using namespace cuda_backend_detail;

void CudaBackend::attn_prefill_(Tensor o, Tensor qg, Tensor k, Tensor v, const AttnWeights& w, const ModelConfig& cfg,
                                SequenceState& state, int layer) {
  CudaState& st = cuda_state(state);
  const int T = static_cast<int>(qg.dim(0));
  const cuda::AttnShape sh = attn_shape(cfg, st.capacity);
  // The decode kernel over T query rows: they already give T-fold parallelism, so the split count is capped to keep
  // the partial results within 256 MiB of scratch.
  const int64_t per_split = int64_t(T) * sh.Hq * sh.D * 4;
  const int nsplit = static_cast<int>(std::clamp<int64_t>((int64_t(256) << 20) / per_split, 1, st.nsplit));
  Tensor q = scratch(DType::F32, {T, sh.Hq, sh.D});
  Tensor pml = scratch(DType::F32, {T, sh.Hq, nsplit, 2});
  Tensor pacc = scratch(DType::F32, {T, sh.Hq, nsplit, sh.D});
  Tensor kc = st.k_cache.at(layer), vc = st.v_cache.at(layer);
  cuda::attn_prep(ctx(), sh, st.d_pos, f32(qg, "attn qg"), f32(k, "attn k"), f32(v, "attn v"), f32(w.q_norm, "q_norm"),
                  f32(w.k_norm, "k_norm"), q.ptr<float>(), kc.ptr<uint16_t>(), vc.ptr<uint16_t>(), T);
  cuda::attn_decode(ctx(), sh, st.d_pos, q.ptr<float>(), qg.ptr<float>(), kc.ptr<uint16_t>(), vc.ptr<uint16_t>(),
                    pml.ptr<float>(), pacc.ptr<float>(), f32(o, "attn o"), T, nsplit);
}

}  // namespace fern
