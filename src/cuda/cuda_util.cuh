// Small device helpers shared by the CUDA kernels: warp/block reductions, streaming loads, activations.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "core/bf16.h"
#include "cuda/cuda_check.h"

namespace fern::cuda {

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

// Streams read once per step (decode weights, the KV cache in decode attention) ask the L2 to evict their lines
// first, so that they do not push out what every kernel re-reads: kernel code, activations, counters. A decode step
// streams ~1.8 GB through a 50 MB L2; at 128K context each attention layer alone streams 270 MB of KV, after which
// the next fused MoE ran ~5 us slower than the others (its code and inputs refetched from HBM; the kernel timeline,
// docs/notes/cuda-decode-v11-timeline.md). FERN_L2_EVICT_FIRST=0 at compile time turns the hint off (comparisons).
#ifndef FERN_L2_EVICT_FIRST
#define FERN_L2_EVICT_FIRST 1
#endif
#if FERN_L2_EVICT_FIRST && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define FERN_L2_HINT 1
#else
#define FERN_L2_HINT 0
#endif

#if FERN_L2_HINT
// An L2 cache policy: every line it touches is evicted first. Not volatile, so repeated calls fold into one.
__device__ __forceinline__ uint64_t l2_evict_first() {
  uint64_t pol;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}
#endif

// 16-byte read-only load that does not keep the line in L1 and is evicted first from L2 (weights are streamed
// once per step).
__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 r;
#if FERN_L2_HINT
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p), "l"(l2_evict_first()));
#else
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
#endif
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
__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + __expf(-x)); }

}  // namespace fern::cuda
