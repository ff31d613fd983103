// Helpers shared by the files that implement CudaBackend's ops (cuda_backend.cpp and the backend_*_decode.cpp /
// backend_*_prefill.cpp files, which keep the one-token and the multi-row paths of each block apart).
#pragma once
#include <span>
#include <vector>

#include "core/error.h"
#include "cuda/cuda_backend_impl.h"
#include "cuda/qweight.h"
#include "model/config.h"

namespace fern::cuda_backend_detail {

// Counter slices: GDN [0, 1024), argmax [1024, kMoeCounterBase), the fused MoE router [kMoeCounterBase, kCounters).
constexpr int kArgmaxCounterBase = 1024;
constexpr int kMoeCounterBase = 1 << 16;
constexpr int kCounters = kMoeCounterBase + 4096;
// The one-launch MoE of decode (moe_fused.cu) keeps its handoff counters at the top of the GDN slice, whose step
// kernel uses [0, Hk) (one counter per key head; [0, Hk + Hv) before the gated norm moved to the out_proj GEMV):
// moe_decode_ takes that path only for models with Hk + Hv <= kMoeFusedCounterBase (the older, larger bound kept).
constexpr int kMoeFusedCounterBase = kArgmaxCounterBase - 16;
// Experts + 1 (the shared-expert gate) the fold's pre-logits can hold (CudaBackend::fold_pre_).
constexpr int kFoldPreMax = 512;
constexpr size_t kFoldPreBytes = sizeof(long long) * kFoldPreMax * cuda::kFoldStride;

inline float* f32(const Tensor& t, const char* what) {
  FERN_CHECK(t.dtype == DType::F32 && t.device == Device::Cuda, "{}: expected an F32 tensor on the GPU, got {} on {}",
             what, dtype_name(t.dtype), t.device == Device::Cuda ? "GPU" : "host");
  return t.ptr<float>();
}

// The outputs of a multi-matrix op as the kernels take them: output i [T, ws[i].out], F32 on the GPU (checked; `op`
// names the op in the errors).
inline std::vector<float*> out_rows(std::span<const Tensor> outs, std::span<const LinearWeight* const> ws, int64_t T,
                                    const char* op) {
  std::vector<float*> ys;
  for (size_t i = 0; i < ws.size(); ++i) {
    const LinearWeight& w = *ws[i];
    FERN_CHECK(outs[i].dim(-1) == w.out && outs[i].numel() == T * w.out, "{} {}: out {} for {} rows of [{}, {}]", op,
               w.name, outs[i].shape_str(), T, w.out, w.in);
    ys.push_back(f32(outs[i], op));
  }
  return ys;
}

inline CudaState& cuda_state(SequenceState& s) {
  auto* c = dynamic_cast<CudaState*>(&s);
  FERN_CHECK(c != nullptr, "sequence state was not made by the CUDA backend");
  return *c;
}

inline cuda::GdnShape gdn_shape(const ModelConfig& cfg) {
  cuda::GdnShape sh;
  sh.Hk = cfg.linear_num_key_heads;
  sh.Hv = cfg.linear_num_value_heads;
  sh.Dk = cfg.linear_key_head_dim;
  sh.Dv = cfg.linear_value_head_dim;
  sh.conv_dim = static_cast<int>(cfg.gdn_conv_dim());
  sh.kernel = cfg.linear_conv_kernel_dim;
  sh.eps = static_cast<float>(cfg.rms_norm_eps);
  return sh;
}

inline cuda::AttnShape attn_shape(const ModelConfig& cfg, int64_t capacity) {
  cuda::AttnShape sh;
  sh.Hq = cfg.num_attention_heads;
  sh.Hkv = cfg.num_key_value_heads;
  sh.D = cfg.head_dim;
  sh.rot = cfg.rotary_dim();
  sh.theta = static_cast<float>(cfg.rope_theta);
  sh.eps = static_cast<float>(cfg.rms_norm_eps);
  sh.capacity = capacity;
  return sh;
}

}  // namespace fern::cuda_backend_detail
