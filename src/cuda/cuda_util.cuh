// Small device helpers shared by the CUDA kernels: warp/block reductions, streaming loads, activations.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "core/bf16.h"
#include "cuda/cuda_check.h"

namespace fern::cuda {

// v itself, opaque to the compiler: values derived from it are recomputed where they are used instead of being
// hoisted out of a loop (and held in registers across it) as loop invariants.
__device__ __forceinline__ int opaque(int v) {
  asm volatile("" : "+r"(v));
  return v;
}

// *p read with acquire semantics at GPU scope: the poll of a handoff counter (the writers fence, then count in),
// after which the reader sees what the counted writers stored before their fence.
__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// a.x^2 + a.y^2 + a.z^2 + a.w^2 with the multiply-adds written out, so that every norm kernel that sums its squares
// this way gets the same bits (rmsnorm_vec_kernel and rmsnorm_xbf_q4_kernel must): left to the compiler, a*a + b*b
// contracts into fma(a, a, b*b) or fma(b, b, a*a), chosen per kernel (measured: rare last-bit differences).
__device__ __forceinline__ float sum_sq4(float4 a) { return fmaf(a.x, a.x, a.y * a.y) + fmaf(a.z, a.z, a.w * a.w); }

// Sum over all threads of a block (blockDim.x a multiple of 32, at most 1024). `red` holds 32 floats of shared
// memory; every thread gets the result.
__device__ __forceinline__ float block_sum(float v, float* red) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) red[wid] = v;
  __syncthreads();
  float r = lane < nw ? red[lane] : 0.0f;
  return warp_sum(r);
}

// The norm weights of an RMSNorm block's threads (the layout of norm_row_load; zeros past the row): constant weights,
// so they may be requested before the PDL wait.
template <int VPT, int NT>
__device__ __forceinline__ void norm_weights_load(const float* __restrict__ w, int D, float4 (&wv)[VPT]) {
#pragma unroll
  for (int v = 0; v < VPT; ++v) {
    const int i = threadIdx.x + v * NT;
    wv[v] = i < D / 4 ? __ldg(reinterpret_cast<const float4*>(w) + i) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

// One float4 of a normed row: x inv w, in that order.
__device__ __forceinline__ float4 norm_apply(float4 x, float inv, float4 w) {
  return make_float4(x.x * inv * w.x, x.y * inv * w.y, x.z * inv * w.z, x.w * inv * w.w);
}

// The row of an RMSNorm block (NT threads per row, VPT float4s per thread, D / 4 of them in all, 16-byte aligned):
// x's row r, or resid + delta written back to resid (x unused), into xv (threads past the row keep theirs unset);
// returns 1 / rms(row) with eps. Shared by the norm kernels (elementwise.cu rmsnorm_vec_kernel, gemm_wg.cu
// rmsnorm_xbf_q4_kernel), whose rows must have the same bits. Reads the row: call it after the PDL wait.
template <int VPT, int NT>
__device__ __forceinline__ float norm_row_load(const float* x, float* resid, const float* delta, int64_t r, int D,
                                               float eps, float4 (&xv)[VPT], float* red) {
  const int n4 = D / 4;
  float ss = 0.0f;
#pragma unroll
  for (int v = 0; v < VPT; ++v) {
    const int i = threadIdx.x + v * NT;
    if (i < n4) {
      float4 a;
      if (resid) {
        float4* rr = reinterpret_cast<float4*>(resid + r * D);
        const float4 b = reinterpret_cast<const float4*>(delta + r * D)[i];
        a = rr[i];
        a = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
        rr[i] = a;
      } else {
        a = reinterpret_cast<const float4*>(x + r * D)[i];
      }
      xv[v] = a;
      ss += sum_sq4(a);
    }
  }
  ss = block_sum(ss, red);
  return rsqrtf(ss / float(D) + eps);
}

// Named hardware barrier ID (1..15; 0 is __syncthreads) of `threads` threads (a multiple of 32): only the warps that
// take part wait, so that another warp of the block can run other work meanwhile. The ID is an immediate, so that
// ptxas reserves only the barriers used.
template <int ID>
__device__ __forceinline__ void named_sync(int threads) {
  asm volatile("bar.sync %0, %1;" ::"n"(ID), "r"(threads) : "memory");
}

// Sum of s and maximum of m (m >= 0) over all threads of a block in one exchange (the same two barriers as
// block_sum); every thread gets both. BAR > 0: over warps 1.. only, which meet at named barrier BAR (warp 0 runs
// other work meanwhile and must not call it; its slot of red is neither written nor read).
template <int BAR = 0>
__device__ __forceinline__ float2 block_sum_max(float s, float m, float2* red) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  auto sync = [] {
    if constexpr (BAR == 0) {
      __syncthreads();
    } else {
      named_sync<BAR>(static_cast<int>(blockDim.x) - 32);
    }
  };
  s = warp_sum(s);
  m = warp_max(m);
  sync();
  if (lane == 0) red[wid] = make_float2(s, m);
  sync();
  const float2 r = lane < nw && (BAR == 0 || lane > 0) ? red[lane] : make_float2(0.0f, 0.0f);
  return make_float2(warp_sum(r.x), warp_max(r.y));
}

__device__ __forceinline__ float block_max(float v, float* red) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) red[wid] = v;
  __syncthreads();
  float r = lane < nw ? red[lane] : -INFINITY;
  return warp_max(r);
}

__device__ __forceinline__ float bf16_at(const uint16_t* p, int64_t i) { return bf16_to_f32(__ldg(p + i)); }

// 16-byte read-only load that does not keep the line in L1 (weights are streamed once per step).
__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

// Programmatic dependent launch (sm_90+): a kernel launched with the PDL attribute may start while its
// predecessor finishes; pdl_wait() blocks until the predecessor's memory is visible (a no-op without the
// attribute or below sm_90), pdl_trigger() lets the successor launch. Every kernel calls pdl_wait() before it
// reads anything a previous kernel wrote, and may read weights (constant during a step) before it.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + __expf(-x)); }

// The gated RMSNorm of one value head of the GDN core's output (MODEL.md 2.4 step 9: rmsnorm(y) w silu(z)), by one
// warp: o[m] receives element lane + 32 m (m < PER, Dv <= 32 PER; zero past Dv). Shared by gdn_gated_norm_kernel
// (gdn.cu) and gated_norm_xbf_q4_kernel (gemm_wg.cu), whose rows must have the same bits. Reads y and z (plain
// pointers: written by the previous kernel): call it after the PDL wait.
template <int PER>
__device__ __forceinline__ void gated_norm_head(const float* yr, const float* zr, const float* __restrict__ w, int Dv,
                                                float eps, int lane, float (&o)[PER]) {
  float zv[PER];
  float ss = 0.0f;
#pragma unroll
  for (int m = 0; m < PER; ++m) {
    const int c = lane + 32 * m;
    o[m] = c < Dv ? yr[c] : 0.0f;
    zv[m] = c < Dv ? zr[c] : 0.0f;
    ss = fmaf(o[m], o[m], ss);
  }
  const float inv = rsqrtf(warp_sum(ss) / float(Dv) + eps);
#pragma unroll
  for (int m = 0; m < PER; ++m) {
    const int c = lane + 32 * m;
    if (c < Dv) o[m] = o[m] * inv * __ldg(w + c) * silu(zv[m]);
  }
}

// sin and cos of the partial-RoPE angle of pair i (< rot / 2) at position pos. Every kernel that rotates q or k
// (the prefill and decode preps, attn.cu; the fused decode prep, attn_decode_tc.cu) takes it from here, so that a
// row rotated by any of them carries the same bits into the cache.
__device__ __forceinline__ void rope_sincos(float theta, int rot, int64_t pos, int i, float& sn, float& cs) {
  const float inv_freq = 1.0f / powf(theta, float(2 * i) / float(rot));
  sincosf(float(pos) * inv_freq, &sn, &cs);
}
__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + __expf(-x)); }

}  // namespace fern::cuda
