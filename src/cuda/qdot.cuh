// Dot products of 16-byte chunks of weights with activations staged in shared memory: the inner loop of every
// GEMV (linear, MoE gate/up and down). Why it looks like this (PERF.md: a naive nibble-by-nibble kernel was
// instruction-bound at 7% of bandwidth):
//  - One 16-byte load per chunk: 32 values (4-bit), 16 (8-bit) or 8 (bf16).
//  - A quantized value q never goes through an int->float conversion: placing it into the mantissa of a float
//    whose exponent is fixed gives OFF + q exactly (OFF = 128 for 4-bit, 256 for 8-bit) with one shift and one
//    logic op. The offset is folded into the group's bias: sum_k x_k (s q_k + b) = s * sum_k x_k (OFF + q_k)
//    + (b - OFF s) * sum_k x_k, and sum_k x_k per chunk is precomputed once per activation row (Xc).
//  - Activations are read from shared memory as float4 with an XOR swizzle so that the 8 lanes of a quarter-warp,
//    which read 8 consecutive chunks, hit 8 different bank quads.
#pragma once
#include <cstdint>

#include "cuda/cuda_util.cuh"
#include "cuda/kernels.h"

namespace fern::cuda {

template <int BITS>
struct ChunkTraits {
  static constexpr int kElems = 128 / BITS;  // values per 16-byte chunk
  static constexpr int kF4 = kElems / 4;     // float4s of x per chunk
};

// Physical float4 slot of logical float4 index f (conflict-free for consecutive chunks of 2, 4 or 8 float4s).
__device__ __forceinline__ int swz(int f) { return f ^ ((f >> 3) & 7); }

// Stages n floats of x (n a multiple of 4) into xs (swizzled float4s) and the per-chunk sums into xc.
// Called by the whole block; ends with __syncthreads().
template <int BITS>
__device__ __forceinline__ void stage_x(const float* __restrict__ x, int n, float4* xs, float* xc) {
  constexpr int E = ChunkTraits<BITS>::kElems;
  const float4* x4 = reinterpret_cast<const float4*>(x);
  for (int f = threadIdx.x; f < n / 4; f += blockDim.x) xs[swz(f)] = x4[f];
  __syncthreads();
  if constexpr (BITS != 16) {
    for (int c = threadIdx.x; c < n / E; c += blockDim.x) {
      float s = 0.0f;
#pragma unroll
      for (int m = 0; m < E / 4; ++m) {
        float4 v = xs[swz(c * (E / 4) + m)];
        s += (v.x + v.y) + (v.z + v.w);
      }
      xc[c] = s;
    }
    __syncthreads();
  }
}

__device__ __forceinline__ float mag4(uint32_t bits) { return __uint_as_float((bits & 0x000F0000u) | 0x43000000u); }
__device__ __forceinline__ float mag8(uint32_t bits) { return __uint_as_float((bits & 0x007F8000u) | 0x43800000u); }

// d[r] = sum_k x_k * (OFF + q_k) over chunk c of N rows (quantized) or sum_k x_k w_k (bf16); the activations
// are read from shared memory once for all N rows. xs: the staged row, wv[r]: row r's chunk.
template <int BITS, int N>
__device__ __forceinline__ void chunk_dot(const uint4 (&wv)[N], const float4* __restrict__ xs, int c,
                                          float (&d)[N]) {
  float a[N][2];
#pragma unroll
  for (int r = 0; r < N; ++r) a[r][0] = a[r][1] = 0.0f;
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    if constexpr (BITS == 4) {
      const float4 xa = xs[swz(c * 8 + 2 * m)], xb = xs[swz(c * 8 + 2 * m + 1)];
#pragma unroll
      for (int r = 0; r < N; ++r) {
        const uint32_t v = m == 0 ? wv[r].x : m == 1 ? wv[r].y : m == 2 ? wv[r].z : wv[r].w;
        a[r][0] = fmaf(xa.x, mag4(v << 16), a[r][0]);
        a[r][1] = fmaf(xa.y, mag4(v << 12), a[r][1]);
        a[r][0] = fmaf(xa.z, mag4(v << 8), a[r][0]);
        a[r][1] = fmaf(xa.w, mag4(v << 4), a[r][1]);
        a[r][0] = fmaf(xb.x, mag4(v), a[r][0]);
        a[r][1] = fmaf(xb.y, mag4(v >> 4), a[r][1]);
        a[r][0] = fmaf(xb.z, mag4(v >> 8), a[r][0]);
        a[r][1] = fmaf(xb.w, mag4(v >> 12), a[r][1]);
      }
    } else if constexpr (BITS == 8) {
      const float4 xa = xs[swz(c * 4 + m)];
#pragma unroll
      for (int r = 0; r < N; ++r) {
        const uint32_t v = m == 0 ? wv[r].x : m == 1 ? wv[r].y : m == 2 ? wv[r].z : wv[r].w;
        a[r][0] = fmaf(xa.x, mag8(v << 15), a[r][0]);
        a[r][1] = fmaf(xa.y, mag8(v << 7), a[r][1]);
        a[r][0] = fmaf(xa.z, mag8(v >> 1), a[r][0]);
        a[r][1] = fmaf(xa.w, mag8(v >> 9), a[r][1]);
      }
    } else {
      // bf16: word m holds values 2m (low half) and 2m+1 (high half); float4 m/2 of the chunk's 2.
      const float4 xa = xs[swz(c * 2 + m / 2)];
      const float x0 = (m & 1) ? xa.z : xa.x, x1 = (m & 1) ? xa.w : xa.y;
#pragma unroll
      for (int r = 0; r < N; ++r) {
        const uint32_t v = m == 0 ? wv[r].x : m == 1 ? wv[r].y : m == 2 ? wv[r].z : wv[r].w;
        a[r][0] = fmaf(x0, __uint_as_float(v << 16), a[r][0]);
        a[r][1] = fmaf(x1, __uint_as_float(v & 0xffff0000u), a[r][1]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < N; ++r) d[r] = a[r][0] + a[r][1];
}

template <int BITS>
constexpr float kOffset = BITS == 4 ? 128.0f : 256.0f;

// A chunk's contribution from its dot: s * dot + (b - OFF s) * Xc[c] (affine), dot (bf16).
template <int BITS>
__device__ __forceinline__ float apply_group(float d, float sc, float bi, const float* xc, int c) {
  if constexpr (BITS == 16) {
    return d;
  } else {
    return fmaf(sc, d, (bi - kOffset<BITS> * sc) * xc[c]);
  }
}

// One row's view for the chunk loop: the row's first 16-byte chunk and (affine) its scales/biases.
struct RowPtr {
  const uint4* w = nullptr;
  const uint16_t* s = nullptr;
  const uint16_t* b = nullptr;
};

// Contribution of chunk c of a row: s * dot + (b - OFF s) * Xc[c] (affine), dot (bf16).
template <int BITS>
__device__ __forceinline__ float chunk_term(uint4 wv, float sc, float bi, const float4* xs, const float* xc, int c) {
  const uint4 w1[1] = {wv};
  float d1[1];
  chunk_dot<BITS, 1>(w1, xs, c, d1);
  const float d = d1[0];
  if constexpr (BITS == 16) {
    return d;
  } else {
    return fmaf(sc, d, (bi - kOffset<BITS> * sc) * xc[c]);
  }
}

// Loads chunk c of a row (weights, and for affine the group's scale and bias).
template <int BITS>
__device__ __forceinline__ void load_chunk(const RowPtr& r, int c, int gs, uint4& wv, float& sc, float& bi) {
  wv = ld_stream(r.w + c);
  if constexpr (BITS != 16) {
    const int g = (c * ChunkTraits<BITS>::kElems) / gs;
    sc = bf16_to_f32(__ldg(r.s + g));
    bi = bf16_to_f32(__ldg(r.b + g));
  } else {
    sc = bi = 0.0f;
  }
}

// Row pointer of row `row` of expert `e` (e = 0 for a plain matrix).
template <int BITS>
__device__ __forceinline__ RowPtr row_ptr(const QW& W, int64_t e, int64_t row) {
  RowPtr r;
  if constexpr (BITS == 16) {
    r.w = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(W.w) + e * W.w_expert + row * W.in);
  } else {
    const int64_t words = W.in * BITS / 32;
    const int64_t groups = static_cast<int>(W.in) / W.gs;  // 32-bit: a 64-bit division is a subroutine call
    r.w = reinterpret_cast<const uint4*>(static_cast<const uint32_t*>(W.w) + e * W.w_expert + row * words);
    r.s = W.s + e * W.sb_expert + row * groups;
    r.b = W.b + e * W.sb_expert + row * groups;
  }
  return r;
}

}  // namespace fern::cuda
