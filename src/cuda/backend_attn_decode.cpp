// Gated attention core for one token (decode): prep (norms, RoPE, KV append) and the split-K GQA attention
// with the state's fixed split count (a captured step keeps its grid). Shapes are checked by attn_core.
// The attention itself runs on the tensor cores (attn_decode_tc.cu) where the head shape allows, else on the
// CUDA-core split kernel (attn.cu); FERN_CUDA_ATTN_DECODE=tc|split forces one (read on every call). The tensor-core
// kernel also does the prep itself unless FERN_CUDA_ATTN_PREP=separate.
#include <cstdlib>
#include <cstring>

#include "core/env.h"
#include "cuda/attn_decode_tc.h"
#include "cuda/backend_internal.h"

namespace fern {
using namespace cuda_backend_detail;

namespace cuda {

AttnDecodeKernel attn_decode_kernel_choice() {
  return env_choice("FERN_CUDA_ATTN_DECODE", {"auto", "tc", "split"}, 0) == 2 ? AttnDecodeKernel::Split
                                                                              : AttnDecodeKernel::Tc;
}

bool attn_prep_fused() { return env_choice("FERN_CUDA_ATTN_PREP", {"fused", "separate"}, 0) == 0; }

}  // namespace cuda

void CudaBackend::attn_decode_(Tensor o, Tensor qg, Tensor k, Tensor v, const AttnWeights& w, const ModelConfig& cfg,
                               SequenceState& state, int layer) {
  CudaState& st = cuda_state(state);
  const cuda::AttnShape sh = attn_shape(cfg, st.capacity);
  const bool tc = cuda::attn_decode_kernel_choice() == cuda::AttnDecodeKernel::Tc && cuda::attn_decode_tc_ok(sh);
  const int nsplit = st.nsplit;
  Tensor pml = scratch(DType::F32, {1, sh.Hq, nsplit, 2});
  Tensor pacc = scratch(DType::F32, {1, sh.Hq, nsplit, sh.D});
  Tensor kc = st.k_cache.at(layer), vc = st.v_cache.at(layer);
  if (tc && cuda::attn_prep_fused()) {  // the prep inside the attention launch (attn_decode_tc.cu)
    cuda::attn_decode_tc_prep(ctx(), sh, st.d_pos, f32(qg, "attn qg"), f32(k, "attn k"), f32(v, "attn v"),
                              f32(w.q_norm, "q_norm"), f32(w.k_norm, "k_norm"), kc.ptr<uint16_t>(),
                              vc.ptr<uint16_t>(), pml.ptr<float>(), pacc.ptr<float>(), f32(o, "attn o"), nsplit);
    return;
  }
  Tensor q = scratch(DType::F32, {1, sh.Hq, sh.D});
  cuda::attn_prep(ctx(), sh, st.d_pos, f32(qg, "attn qg"), f32(k, "attn k"), f32(v, "attn v"), f32(w.q_norm, "q_norm"),
                  f32(w.k_norm, "k_norm"), q.ptr<float>(), kc.ptr<uint16_t>(), vc.ptr<uint16_t>(), 1);
  (tc ? cuda::attn_decode_tc : cuda::attn_decode)(ctx(), sh, st.d_pos, q.ptr<float>(), qg.ptr<float>(),
                                                  kc.ptr<uint16_t>(), vc.ptr<uint16_t>(), pml.ptr<float>(),
                                                  pacc.ptr<float>(), f32(o, "attn o"), 1, nsplit);
}

}  // namespace fern
