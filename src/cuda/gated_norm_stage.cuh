// The GDN core's gated RMSNorm (MODEL.md 2.4 step 9) staged as a GEMV's input row: shared by the out_proj GEMV
// (linear.cu, linear_gated_norm) and the fused step + out_proj launch (gdn_out.cu).
#pragma once
#include "cuda/cuda_util.cuh"

namespace fern::cuda {

// The gate of the GDN core's gated norm for one float4: silu(z) * w.
__device__ __forceinline__ float4 norm_gate(const float4& z, const float4& w) {
  return make_float4(silu(z.x) * w.x, silu(z.y) * w.y, silu(z.z) * w.z, silu(z.w) * w.w);
}

// stage_x (qdot.cuh) of the GDN core's gated RMSNorm (MODEL.md 2.4 step 9) of its raw output y [n]: per head of
// hd values, y * rsqrt(mean(y^2) + eps) * w * silu(z). Thread f holds float4 f of the row (f = threadIdx.x + q * NT);
// a head is hd/4 consecutive float4s, so hd/4 consecutive lanes of one warp (hd <= 128, a power of two; at the
// real hd = 128 the 32 lanes of a warp hold exactly one head for each q): its sum of squares is a shuffle
// reduction within those lanes, no block barrier. gv holds the gate silu(z) * w of each float4: computed before
// the PDL wait by the caller when z may be read there (gate_ready), else here from z read through L2 (the norm
// weight's float4 w is the same for every q of a thread). y is read through L2 after the wait (stage_x says why
// never through the non-coherent path).
template <int NT, int NV, typename Sink>
__device__ __forceinline__ void stage_x_gated_norm(const float* y, const float* z, float4 (&gv)[NV],
                                                   bool gate_ready, float4 w, float eps, int n, int hd,
                                                   const Sink& sink) {
  const float4* y4 = reinterpret_cast<const float4*>(y);
  const float4* z4 = reinterpret_cast<const float4*>(z);
  const int hl = hd / 4;  // lanes per head
  const float rhd = 1.0f / float(hd);  // exact (hd a power of two): a multiply instead of a division per float4
  float4 yv[NV], zv[NV];
#pragma unroll
  for (int q = 0; q < NV; ++q) {
    const int f = threadIdx.x + q * NT;
    yv[q] = f < n / 4 ? __ldcg(y4 + f) : make_float4(0.f, 0.f, 0.f, 0.f);
    if (!gate_ready) zv[q] = f < n / 4 ? __ldcg(z4 + f) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
#pragma unroll
  for (int q = 0; q < NV; ++q) {
    if (q * NT >= n / 4) break;  // the same on every thread: all lanes take part in the shuffles
    const int f = threadIdx.x + q * NT;
    if (!gate_ready) gv[q] = norm_gate(zv[q], w);
    float ss = (yv[q].x * yv[q].x + yv[q].y * yv[q].y) + (yv[q].z * yv[q].z + yv[q].w * yv[q].w);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
      if (o < hl) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = rsqrtf(ss * rhd + eps);
    const float4 o = make_float4(yv[q].x * inv * gv[q].x, yv[q].y * inv * gv[q].y, yv[q].z * inv * gv[q].z,
                                 yv[q].w * inv * gv[q].w);  // zero beyond the row (yv is)
    sink(f, f < n / 4, o);
  }
  __syncthreads();
}

}  // namespace fern::cuda
