// Gated attention for T query rows (MODEL.md 2.3 steps 3-7):
//  attn_prep:   q/k RMSNorm + partial RoPE (NeoX rotate-half on the first `rot` dims) + KV append (BF16), one
//               block per head; the position comes from device memory.
//  attn_decode: GQA-packed split-K attention. A block owns one KV head (or a group of its query heads, see
//               attn_head_groups) and one slice of the KV length; each of its warps walks positions of the slice,
//               every lane holding D/32 dims of the block's query heads, so one coalesced read of a K row and a V
//               row serves all of them. Partial
//               (max, sum, acc) per split are merged by a second kernel that also applies sigmoid(gate), which the
//               tensor-core decode kernel (attn_decode_tc.cu) shares.
// Inputs written by an earlier kernel are plain `const T*`, never `const T* __restrict__`: under PDL that kernel
// may still be running while this one is resident, and const + restrict would allow the non-coherent load path
// and its scheduling ahead of griddepcontrol.wait (qdot.cuh stage_x, docs/notes/cuda-decode-v6.md). Weights
// and the position counter (written only by advance_kernel, the last launch of a step) may stay restrict.
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/env.h"
#include "cuda/attn_decode_tc.h"
#include "cuda/kernels.h"
#include "cuda/launch.cuh"
#include "cuda/cuda_util.cuh"

namespace fern::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__global__ void __launch_bounds__(kThreads) attn_prep_kernel(AttnShape sh, const int32_t* __restrict__ d_pos,
                                                             const float* qg, const float* k,
                                                             const float* v,
                                                             const float* __restrict__ q_norm,
                                                             const float* __restrict__ k_norm, float* __restrict__ q_out,
                                                             uint16_t* __restrict__ k_cache,
                                                             uint16_t* __restrict__ v_cache) {
  pdl_wait();
  pdl_trigger();
  extern __shared__ float xs[];  // [D]
  __shared__ float red[32];
  const int b = blockIdx.x, t = blockIdx.y;
  const int D = sh.D;
  const int64_t pos = int64_t(d_pos[0]) + t;
  if (b >= sh.Hq + sh.Hkv) {  // v head: store as is
    const int kvh = b - sh.Hq - sh.Hkv;
    if (pos >= sh.capacity) return;
    const float* src = v + (int64_t(t) * sh.Hkv + kvh) * D;
    uint16_t* dst = v_cache + (pos * sh.Hkv + kvh) * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) dst[d] = f32_to_bf16(src[d]);
    return;
  }
  const bool is_q = b < sh.Hq;
  const int hh = is_q ? b : b - sh.Hq;
  const float* src = is_q ? qg + (int64_t(t) * sh.Hq + hh) * 2 * D : k + (int64_t(t) * sh.Hkv + hh) * D;
  const float* w = is_q ? q_norm : k_norm;
  float ss = 0.0f;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    const float x = src[d];
    xs[d] = x;
    ss += x * x;
  }
  ss = block_sum(ss, red);  // also orders the xs writes before the reads below
  const float inv = rsqrtf(ss / float(D) + sh.eps);
  const int half = sh.rot / 2;
  float* qdst = q_out + (int64_t(t) * sh.Hq + hh) * D;
  uint16_t* kdst = k_cache + (pos * sh.Hkv + hh) * D;
  if (!is_q && pos >= sh.capacity) return;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float r;
    if (d < sh.rot) {
      const int i = d < half ? d : d - half;
      float sn, cs;
      rope_sincos(sh.theta, sh.rot, pos, i, sn, cs);
      const float a = xs[i] * inv * w[i], bb = xs[i + half] * inv * w[i + half];
      r = d < half ? a * cs - bb * sn : bb * cs + a * sn;
    } else {
      r = xs[d] * inv * w[d];
    }
    if (is_q) qdst[d] = r;
    else kdst[d] = f32_to_bf16(r);
  }
}

// The same, one warp per (row, head) with the head in registers as float4 chunks (chunk c = dims 4c .. 4c + 3, lane
// c % 32; D a multiple of 4, at most 256), for prompt rows: the block-per-(head, row) kernel above took 345 us per
// 8,192-row call at the real shape (~5x its bytes at the copy bandwidth: 163,840 blocks of one 256-wide head each,
// two block barriers per head). The rotary partner of a dim (d +- rot/2) is in the same chunk slot of lane
// c -+ rot/8 (rot a multiple of 8, at most 128: all rotary dims in the first 32 chunks). Same per-element arithmetic
// as attn_prep_kernel; the sum of squares is added in another order.
constexpr int kPrepVpt = 2;  // float4 chunks per lane: D <= 256
__global__ void __launch_bounds__(kThreads) attn_prep_rows_kernel(AttnShape sh, int T, const int32_t* __restrict__ d_pos,
                                                                  const float* qg, const float* k, const float* v,
                                                                  const float* __restrict__ q_norm,
                                                                  const float* __restrict__ k_norm,
                                                                  float* __restrict__ q_out,
                                                                  uint16_t* __restrict__ k_cache,
                                                                  uint16_t* __restrict__ v_cache) {
  const int lane = threadIdx.x & 31;
  const int heads = sh.Hq + 2 * sh.Hkv;
  const int64_t item = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  pdl_wait();
  pdl_trigger();
  if (item >= int64_t(T) * heads) return;  // whole warps
  const int t = static_cast<int>(item / heads), b = static_cast<int>(item % heads);
  const int D = sh.D, n4 = D / 4;
  const int64_t pos = int64_t(d_pos[0]) + t;
  const auto store_bf16 = [](uint16_t* dst, float4 r) {
    *reinterpret_cast<uint2*>(dst) = make_uint2(uint32_t(f32_to_bf16(r.x)) | uint32_t(f32_to_bf16(r.y)) << 16,
                                                uint32_t(f32_to_bf16(r.z)) | uint32_t(f32_to_bf16(r.w)) << 16);
  };
  if (b >= sh.Hq + sh.Hkv) {  // v head: store as is
    const int kvh = b - sh.Hq - sh.Hkv;
    if (pos >= sh.capacity) return;
    const float* src = v + (int64_t(t) * sh.Hkv + kvh) * D;
    uint16_t* dst = v_cache + (pos * sh.Hkv + kvh) * D;
    for (int c = lane; c < n4; c += 32) store_bf16(dst + 4 * c, reinterpret_cast<const float4*>(src)[c]);
    return;
  }
  const bool is_q = b < sh.Hq;
  const int hh = is_q ? b : b - sh.Hq;
  if (!is_q && pos >= sh.capacity) return;
  const float* src = is_q ? qg + (int64_t(t) * sh.Hq + hh) * 2 * D : k + (int64_t(t) * sh.Hkv + hh) * D;
  const float* w = is_q ? q_norm : k_norm;
  float4 xv[kPrepVpt];
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kPrepVpt; ++j) {
    const int c = lane + 32 * j;
    xv[j] = c < n4 ? reinterpret_cast<const float4*>(src)[c] : make_float4(0.f, 0.f, 0.f, 0.f);
    ss += (xv[j].x * xv[j].x + xv[j].y * xv[j].y) + (xv[j].z * xv[j].z + xv[j].w * xv[j].w);
  }
  ss = warp_sum(ss);
  const float inv = rsqrtf(ss / float(D) + sh.eps);
  const int half = sh.rot / 2, hq = half / 4;  // partner chunks are hq lanes apart
  float* qdst = q_out + (int64_t(t) * sh.Hq + hh) * D;
  uint16_t* kdst = k_cache + (pos * sh.Hkv + hh) * D;
#pragma unroll
  for (int j = 0; j < kPrepVpt; ++j) {
    const int c = lane + 32 * j;
    float4 n = make_float4(0.f, 0.f, 0.f, 0.f);
    if (c < n4) {
      const float4 wv = __ldg(reinterpret_cast<const float4*>(w) + c);
      n = make_float4(xv[j].x * inv * wv.x, xv[j].y * inv * wv.y, xv[j].z * inv * wv.z, xv[j].w * inv * wv.w);
    }
    if (j == 0) {  // the rotary dims (all in the first 32 chunks); every lane takes part in the shuffles
      const int src_lane = lane < hq ? lane + hq : lane - hq;
      const float4 pn = make_float4(__shfl_sync(0xffffffffu, n.x, src_lane), __shfl_sync(0xffffffffu, n.y, src_lane),
                                    __shfl_sync(0xffffffffu, n.z, src_lane), __shfl_sync(0xffffffffu, n.w, src_lane));
      if (4 * c < sh.rot) {
        const bool first = 4 * c < half;
        const float nv[4] = {n.x, n.y, n.z, n.w}, pv[4] = {pn.x, pn.y, pn.z, pn.w};
        float r[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int d = 4 * c + e, i = first ? d : d - half;
          float sn, cs;
          rope_sincos(sh.theta, sh.rot, pos, i, sn, cs);
          r[e] = first ? nv[e] * cs - pv[e] * sn : nv[e] * cs + pv[e] * sn;
        }
        n = make_float4(r[0], r[1], r[2], r[3]);
      }
    }
    if (c < n4) {
      if (is_q) reinterpret_cast<float4*>(qdst)[c] = n;
      else store_bf16(kdst + 4 * c, n);
    }
  }
}

// The split kernel walks one KV position per warp iteration (version 4: the next two positions' rows in flight). A version that kept 4 positions in flight per warp
// (raw BF16 rows in registers, 252 registers) measured 27-29% slower on the H200 with nsplit = 1 (4K: 6.0 vs
// 4.7 ms for 10 layers; 128K: 180 vs 139 ms): the loop is bound by the dependent shuffle reductions at 8 warps per
// SM, not by load latency (docs/notes/cuda-decode-v2.md). Version 3 keeps the one-position structure and only
// requests the warp's next K/V rows (raw BF16, DPL more registers) before this position's arithmetic: at the
// default split counts a warp walks few positions (4K context, 64 splits: 8), so the first load's latency is
// otherwise paid once per position.
template <int DPL>
struct RawRow {
  uint32_t w[DPL / 2];
};

template <int DPL>
__device__ __forceinline__ void load_raw_row(const uint16_t* p, RawRow<DPL>& r) {
  if constexpr (DPL == 8) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    r.w[0] = u.x;
    r.w[1] = u.y;
    r.w[2] = u.z;
    r.w[3] = u.w;
  } else {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    r.w[0] = u.x;
    r.w[1] = u.y;
  }
}

template <int DPL>
__device__ __forceinline__ void unpack_row(const RawRow<DPL>& r, float (&out)[DPL]) {
#pragma unroll
  for (int i = 0; i < DPL / 2; ++i) {
    out[2 * i] = __uint_as_float(r.w[i] << 16);
    out[2 * i + 1] = __uint_as_float(r.w[i] & 0xffff0000u);
  }
}

// G query heads per block: all heads of one KV head, or a part of them (head groups, gridDim.x = Hkv * groups).
template <int G, int DPL>
__global__ void __launch_bounds__(kThreads, G <= 4 ? 2 : 1) attn_split_kernel(AttnShape sh, const int32_t* __restrict__ d_pos,
                                                              const float* q,
                                                              const uint16_t* k_cache,
                                                              const uint16_t* v_cache,
                                                              float* __restrict__ part_ml,
                                                              float* __restrict__ part_acc) {
  constexpr int D = DPL * 32;
  __shared__ float wm[kWarps][G];
  __shared__ __align__(16) float sacc[G][D];
  __shared__ float sl[G];
  const int groups = gridDim.x / sh.Hkv;
  const int kvh = blockIdx.x / groups, sp = blockIdx.y, t = blockIdx.z, nsplit = gridDim.y;
  const int hb = kvh * (G * groups) + (blockIdx.x % groups) * G;  // the block's first query head
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  // The position and the cache rows before it are not written by the kernel just before this one (attn_prep, which
  // appends rows [pos, pos + T)): their writers are at least two launches back, finished once this kernel starts
  // (every kernel triggers its successor only after its own wait). So the warp's first K/V rows are requested before
  // the PDL wait when they are old rows; q and the new rows after it.
  const int64_t pos0 = d_pos[0];
  const int64_t L = pos0 + t + 1;
  const int64_t chunk = (L + nsplit - 1) / nsplit;
  const int64_t lo = sp * chunk, hi = min(L, lo + chunk);
  const int64_t row_stride = int64_t(sh.Hkv) * D;
  const uint16_t* kbase = k_cache + kvh * D + lane * DPL;
  const uint16_t* vbase = v_cache + kvh * D + lane * DPL;
  // The warp's next two positions, requested two iterations ahead: buffer A holds positions lo + warp + 2j kWarps,
  // buffer B the ones in between (two buffers alternate rather than shift: moving a register whose load is in
  // flight would wait for it).
  RawRow<DPL> ka, va, kb, vb;
  const int64_t p0 = lo + warp, p1 = p0 + kWarps;
  const bool early0 = p0 < hi && p0 < pos0, early1 = p1 < hi && p1 < pos0;
  if (early0) {
    load_raw_row<DPL>(kbase + p0 * row_stride, ka);
    load_raw_row<DPL>(vbase + p0 * row_stride, va);
  }
  if (early1) {
    load_raw_row<DPL>(kbase + p1 * row_stride, kb);
    load_raw_row<DPL>(vbase + p1 * row_stride, vb);
  }
  pdl_wait();
  pdl_trigger();
  const float scale = rsqrtf(float(D));
  float qr[G][DPL];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    const float* qp = q + (int64_t(t) * sh.Hq + hb + g) * D + lane * DPL;
#pragma unroll
    for (int i = 0; i < DPL; ++i) qr[g][i] = qp[i] * scale;
  }
  float m[G], l[G], acc[G][DPL];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[g][i] = 0.0f;
  }
  if (!early0 && p0 < hi) {
    load_raw_row<DPL>(kbase + p0 * row_stride, ka);
    load_raw_row<DPL>(vbase + p0 * row_stride, va);
  }
  if (!early1 && p1 < hi) {
    load_raw_row<DPL>(kbase + p1 * row_stride, kb);
    load_raw_row<DPL>(vbase + p1 * row_stride, vb);
  }
  // One position: scores of the G heads, online-softmax update of their sums.
  auto position = [&](const float (&kv)[DPL], const float (&vv)[DPL]) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float s = 0.0f;
#pragma unroll
      for (int i = 0; i < DPL; ++i) s = fmaf(qr[g][i], kv[i], s);
      s = warp_sum(s);
      const float mn = fmaxf(m[g], s);
      const float corr = __expf(m[g] - mn);  // 0 when m was -inf
      const float e = __expf(s - mn);
      l[g] = l[g] * corr + e;
#pragma unroll
      for (int i = 0; i < DPL; ++i) acc[g][i] = fmaf(acc[g][i], corr, e * vv[i]);
      m[g] = mn;
    }
  };
  for (int64_t p = p0; p < hi; p += 2 * kWarps) {
    {
      float kv[DPL], vv[DPL];
      unpack_row<DPL>(ka, kv);
      unpack_row<DPL>(va, vv);
      if (p + 2 * kWarps < hi) {
        load_raw_row<DPL>(kbase + (p + 2 * kWarps) * row_stride, ka);
        load_raw_row<DPL>(vbase + (p + 2 * kWarps) * row_stride, va);
      }
      position(kv, vv);
    }
    if (p + kWarps < hi) {
      float kv[DPL], vv[DPL];
      unpack_row<DPL>(kb, kv);
      unpack_row<DPL>(vb, vv);
      if (p + 3 * kWarps < hi) {
        load_raw_row<DPL>(kbase + (p + 3 * kWarps) * row_stride, kb);
        load_raw_row<DPL>(vbase + (p + 3 * kWarps) * row_stride, vb);
      }
      position(kv, vv);
    }
  }
  // Merge the warps: block max, then the rescaled sums added warp after warp (one barrier each). Version 3 added
  // them with shared-memory float atomics from all 8 warps at once: 64 per thread on the same G x D addresses, with
  // 8-way bank conflicts from the lane * DPL layout (float atomics on shared memory are compare-and-swap loops).
  if (lane == 0) {
#pragma unroll
    for (int g = 0; g < G; ++g) wm[warp][g] = m[g];
  }
  __syncthreads();
  float f[G];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, wm[w][g]);
    f[g] = m[g] == -INFINITY ? 0.0f : __expf(m[g] - M);
    if (warp == 0 && lane == 0) {
      float* ml = part_ml + ((int64_t(t) * sh.Hq + hb + g) * nsplit + sp) * 2;
      ml[0] = M;
    }
  }
  for (int w = 0; w < kWarps; ++w) {
    if (warp == w) {
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float* dst = &sacc[g][lane * DPL];
#pragma unroll
        for (int i = 0; i < DPL; i += 4) {
          float4 a = make_float4(acc[g][i] * f[g], acc[g][i + 1] * f[g], acc[g][i + 2] * f[g], acc[g][i + 3] * f[g]);
          if (w > 0) {
            const float4 o = *reinterpret_cast<const float4*>(dst + i);
            a.x += o.x;
            a.y += o.y;
            a.z += o.z;
            a.w += o.w;
          }
          *reinterpret_cast<float4*>(dst + i) = a;
        }
        if (lane == 0) sl[g] = (w > 0 ? sl[g] : 0.0f) + l[g] * f[g];
      }
    }
    __syncthreads();
  }
  for (int i = threadIdx.x; i < G * D; i += kThreads) {
    const int g = i / D, d = i % D;
    part_acc[((int64_t(t) * sh.Hq + hb + g) * nsplit + sp) * D + d] = sacc[g][d];
  }
  if (threadIdx.x < G) part_ml[((int64_t(t) * sh.Hq + hb + threadIdx.x) * nsplit + sp) * 2 + 1] = sl[threadIdx.x];
}

// One block per (head, row). The splits' (max, sum) pairs are read once, in parallel, into shared memory and turned
// into per-split factors exp(m_s - M) / den; each thread then sums its dims over the splits with independent
// loads (v1 walked the splits one dependent load after another: ~0.5 us per split per head, 30 us at 64 splits).
constexpr int kMaxSplits = 1024;

__global__ void __launch_bounds__(kThreads) attn_combine_kernel(AttnShape sh, int nsplit,
                                                                const float* part_ml,
                                                                const float* part_acc,
                                                                const float* qg, float* __restrict__ o) {
  pdl_wait();
  pdl_trigger();
  __shared__ float fac[kMaxSplits];
  __shared__ float red[32];
  const int h = blockIdx.x, t = blockIdx.y, D = sh.D;
  const float* ml = part_ml + (int64_t(t) * sh.Hq + h) * nsplit * 2;
  float mx = -INFINITY;
  for (int s = threadIdx.x; s < nsplit; s += blockDim.x) mx = fmaxf(mx, ml[2 * s]);
  const float M = block_max(mx, red);
  float den = 0.0f;
  for (int s = threadIdx.x; s < nsplit; s += blockDim.x) {
    const float ms = ml[2 * s];
    const float f = ms == -INFINITY ? 0.0f : __expf(ms - M);
    fac[s] = f;
    den += ml[2 * s + 1] * f;
  }
  const float inv = 1.0f / block_sum(den, red);  // its barriers also publish fac
  const float* acc = part_acc + (int64_t(t) * sh.Hq + h) * nsplit * D;
  const float* gate = qg + (int64_t(t) * sh.Hq + h) * 2 * D + D;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float num[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    int s = 0;
    // 32 independent loads per round (version 3: 4, so the default 64 splits took 16 dependent L2 round trips).
    for (; s + 32 <= nsplit; s += 32) {
      float a[32];
#pragma unroll
      for (int u = 0; u < 32; ++u) a[u] = acc[int64_t(s + u) * D + d];
#pragma unroll
      for (int u = 0; u < 32; ++u) num[u & 3] = fmaf(a[u], fac[s + u], num[u & 3]);
    }
    for (; s + 4 <= nsplit; s += 4) {
#pragma unroll
      for (int u = 0; u < 4; ++u) num[u] = fmaf(acc[int64_t(s + u) * D + d], fac[s + u], num[u]);
    }
    for (; s < nsplit; ++s) num[0] = fmaf(acc[int64_t(s) * D + d], fac[s], num[0]);
    o[(int64_t(t) * sh.Hq + h) * D + d] = ((num[0] + num[1]) + (num[2] + num[3])) * inv * sigmoid(gate[d]);
  }
}

// Combine, version 2 (the default; FERN_CUDA_ATTN_COMBINE=v1 selects the one above). The one above makes three
// dependent trips to memory after the PDL wait: the (max, sum) pairs, then (after two block reductions) the
// partial rows in rounds of 32 splits, then the gate. Here each thread owns 4 dims (one float4) of one group of
// splits (s = group mod NG) and requests its splits' pairs and partial rows together (up to kBatch splits at a
// time: one round trip at <= 64 splits for head dim 256), merges them with its own running max, and the NG groups
// are merged once through shared memory. The gate is requested before the wait: its writer (the q/gate projection)
// is three launches back, finished before this kernel starts (every kernel triggers only after its own wait).
constexpr int kCombineBatch = 16;

template <int D>
__global__ void __launch_bounds__(kThreads) attn_combine2_kernel(AttnShape sh, int nsplit, const float* part_ml,
                                                                 const float* part_acc, const float* qg,
                                                                 float* __restrict__ o) {
  constexpr int VD = D / 4;          // float4 columns of a row
  constexpr int NG = kThreads / VD;  // split groups
  __shared__ float gm[NG], gl[NG];
  __shared__ __align__(16) float gacc[NG][D];
  const int h = blockIdx.x, t = blockIdx.y;
  const int col = threadIdx.x % VD, grp = threadIdx.x / VD;
  const int64_t row = int64_t(t) * sh.Hq + h;
  float4 gate = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (grp == 0) gate = reinterpret_cast<const float4*>(qg + row * 2 * D + D)[col];
  pdl_wait();
  pdl_trigger();
  const float2* ml = reinterpret_cast<const float2*>(part_ml + row * nsplit * 2);
  const float4* acc = reinterpret_cast<const float4*>(part_acc + row * nsplit * D) + col;
  float m = -INFINITY, l = 0.0f;
  float4 num = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int s0 = grp; s0 < nsplit; s0 += NG * kCombineBatch) {
    float2 ms[kCombineBatch];
    float4 a[kCombineBatch];
#pragma unroll
    for (int u = 0; u < kCombineBatch; ++u) {
      const int s = s0 + u * NG;
      ms[u] = s < nsplit ? ml[s] : make_float2(-INFINITY, 0.0f);
      a[u] = s < nsplit ? acc[int64_t(s) * VD] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    float mb = m;
#pragma unroll
    for (int u = 0; u < kCombineBatch; ++u) mb = fmaxf(mb, ms[u].x);
    if (mb == -INFINITY) continue;  // only empty splits so far (max -inf, sum 0, rows 0)
    const float f0 = m == -INFINITY ? 0.0f : __expf(m - mb);
    l *= f0;
    num = make_float4(num.x * f0, num.y * f0, num.z * f0, num.w * f0);
#pragma unroll
    for (int u = 0; u < kCombineBatch; ++u) {
      const float f = ms[u].x == -INFINITY ? 0.0f : __expf(ms[u].x - mb);
      l = fmaf(ms[u].y, f, l);
      num = make_float4(fmaf(a[u].x, f, num.x), fmaf(a[u].y, f, num.y), fmaf(a[u].z, f, num.z),
                        fmaf(a[u].w, f, num.w));
    }
    m = mb;
  }
  if (col == 0) {
    gm[grp] = m;  // the same in every thread of the group
    gl[grp] = l;
  }
  *reinterpret_cast<float4*>(&gacc[grp][col * 4]) = num;
  __syncthreads();
  if (grp != 0) return;
  float M = -INFINITY;
#pragma unroll
  for (int g = 0; g < NG; ++g) M = fmaxf(M, gm[g]);  // finite: split 0 always holds position 0
  float den = 0.0f;
  float4 r = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int g = 0; g < NG; ++g) {
    const float f = gm[g] == -INFINITY ? 0.0f : __expf(gm[g] - M);
    den = fmaf(gl[g], f, den);
    const float4 v = *reinterpret_cast<const float4*>(&gacc[g][col * 4]);
    r = make_float4(fmaf(v.x, f, r.x), fmaf(v.y, f, r.y), fmaf(v.z, f, r.z), fmaf(v.w, f, r.w));
  }
  const float inv = 1.0f / den;
  reinterpret_cast<float4*>(o + row * D)[col] = make_float4(r.x * inv * sigmoid(gate.x), r.y * inv * sigmoid(gate.y),
                                                            r.z * inv * sigmoid(gate.z), r.w * inv * sigmoid(gate.w));
}

// FERN_CUDA_ATTN_COMBINE: unset/empty/v2 -> version 2, v1 -> the first (read at every call, for the benchmark).
bool combine_v1() { return env_choice("FERN_CUDA_ATTN_COMBINE", {"v2", "v1"}, 0) == 1; }

template <int G>
void launch_split(const Ctx& c, const AttnShape& sh, dim3 grid, const int32_t* d_pos, const float* q,
                  const uint16_t* kc, const uint16_t* vc, float* pml, float* pacc) {
  if (sh.D == 256)
    launch(c, "attn_split_kernel", attn_split_kernel<G, 8>, grid, kThreads, 0, sh, d_pos, q, kc, vc, pml, pacc);
  else
    launch(c, "attn_split_kernel", attn_split_kernel<G, 4>, grid, kThreads, 0, sh, d_pos, q, kc, vc, pml, pacc);
}

// Query heads of one KV head split over `groups` blocks. 8 heads per block need 218 registers (one block per SM, 8
// warps); 4 heads fit two blocks per SM, at the price of each K/V row being read by two blocks. Measured on the H200
// (docs/notes/cuda-decode-v4.md, 10 cores, 64 splits): 2 groups 191.8 vs 226.1 us at 4K, 565 vs 571 at 32K, but
// 1,830 vs 1,730 at 128K, where the second read of each row costs more than the occupancy gains. So 2 groups for 8
// heads per KV head below 64K positions of capacity, else 1. FERN_CUDA_ATTN_HG=1/2/4 overrides (read at every
// call, for the benchmark).
int attn_head_groups(int G, int64_t capacity) {
  const int want = static_cast<int>(env_int("FERN_CUDA_ATTN_HG", 1, 8, G == 8 && capacity < 65536 ? 2 : 1));
  return want >= 1 && want <= G && G % want == 0 ? want : 1;
}

}  // namespace

// Tuned for the tensor-core kernel (the default; its pieces are whole 64-key tiles). Measured on the H200
// (docs/notes/cuda-decode-v7-attn.md, 10 cores, us): 1K 83 / 82 / 106 with 16 / 32 / 64 splits, 4K 121 / 107 / 124,
// 32K 437 / 274 / 273, 128K 1,496 / 814 / 728 (and 777 with 128: two waves of one block per SM). So about two
// tiles per piece, at least 16 pieces (or one per tile) and at most 64. The split kernel (FERN_CUDA_ATTN_DECODE=split)
// measured 204 / 186 us at 4K with 32 / 64 splits in the same run: with this rule (34 at 4K) it is ~10% slower
// there than with the previous rule (capacity / 64, at most 64); from 8K of capacity on both rules give 64.
int attn_splits(int64_t capacity) {
  const int64_t tiles = (capacity + 63) / 64;
  const int64_t lo = tiles < 16 ? tiles : 16;
  int64_t s = (tiles + 1) / 2;
  s = s < lo ? lo : s;
  return static_cast<int>(s < 1 ? 1 : (s > 64 ? 64 : s));
}

void attn_prep(const Ctx& c, const AttnShape& sh, const int32_t* d_pos, const float* qg, const float* k,
               const float* v, const float* q_norm, const float* k_norm, float* q_out, uint16_t* k_cache,
               uint16_t* v_cache, int T) {
  if (T <= 0) return;
  FERN_CU_CHECK(sh.rot % 2 == 0 && sh.rot <= sh.D, "attention: rotary dims");
  const bool rows = T > 1 && sh.D % 4 == 0 && sh.D <= 4 * 32 * kPrepVpt && sh.rot % 8 == 0 && sh.rot <= 128 &&
                    aligned16(qg) && aligned16(k) && aligned16(v) && aligned16(q_norm) && aligned16(k_norm) &&
                    aligned16(q_out) &&
                    reinterpret_cast<uintptr_t>(k_cache) % 8 == 0 && reinterpret_cast<uintptr_t>(v_cache) % 8 == 0;
  if (rows) {  // prompt rows (a decode step's single row keeps the block-per-head kernel)
    const int64_t items = int64_t(T) * (sh.Hq + 2 * sh.Hkv);
    launch(c, "attn_prep_rows_kernel", attn_prep_rows_kernel, static_cast<unsigned>((items + kWarps - 1) / kWarps),
           kThreads, 0, sh, T, d_pos, qg, k, v, q_norm, k_norm, q_out, k_cache, v_cache);
    FERN_CUDA_LAUNCH_CHECK("attn_prep_rows_kernel");
    return;
  }
  dim3 grid(sh.Hq + 2 * sh.Hkv, T);
  launch(c, "attn_prep_kernel", attn_prep_kernel, grid, kThreads, size_t(sh.D) * 4, sh, d_pos, qg, k, v, q_norm, k_norm, q_out,
                                                                    k_cache, v_cache);
  FERN_CUDA_LAUNCH_CHECK("attn_prep_kernel");
}

void attn_decode(const Ctx& c, const AttnShape& sh, const int32_t* d_pos, const float* q, const float* qg,
                 const uint16_t* k_cache, const uint16_t* v_cache, float* part_ml, float* part_acc, float* o, int T,
                 int nsplit) {
  if (T <= 0) return;
  const int G = sh.Hq / sh.Hkv;
  if (sh.Hq % sh.Hkv != 0 || (sh.D != 128 && sh.D != 256) || (G != 1 && G != 2 && G != 4 && G != 8))
    raise_error("attention: unsupported head shape (head_dim " + std::to_string(sh.D) + ", " + std::to_string(G) +
                " query heads per KV head; supported: head_dim 128/256, 1/2/4/8 per KV head)");
  FERN_CU_CHECK(nsplit >= 1 && nsplit <= kMaxSplits, "attention: split count");
  const int groups = attn_head_groups(G, sh.capacity);
  dim3 grid(sh.Hkv * groups, nsplit, T);
  switch (G / groups) {
    case 1: launch_split<1>(c, sh, grid, d_pos, q, k_cache, v_cache, part_ml, part_acc); break;
    case 2: launch_split<2>(c, sh, grid, d_pos, q, k_cache, v_cache, part_ml, part_acc); break;
    case 4: launch_split<4>(c, sh, grid, d_pos, q, k_cache, v_cache, part_ml, part_acc); break;
    default: launch_split<8>(c, sh, grid, d_pos, q, k_cache, v_cache, part_ml, part_acc); break;
  }
  FERN_CUDA_LAUNCH_CHECK("attn_split_kernel");
  attn_decode_combine(c, sh, nsplit, part_ml, part_acc, qg, o, T);
}

void attn_decode_combine(const Ctx& c, const AttnShape& sh, int nsplit, const float* part_ml, const float* part_acc,
                         const float* qg, float* o, int T) {
  FERN_CU_CHECK(nsplit >= 1 && nsplit <= kMaxSplits, "attention: split count");
  const dim3 grid(sh.Hq, T);
  if (combine_v1() || (sh.D != 128 && sh.D != 256))
    launch(c, "attn_combine_kernel", attn_combine_kernel, grid, kThreads, 0, sh, nsplit, part_ml, part_acc, qg, o);
  else if (sh.D == 256)
    launch(c, "attn_combine2_kernel", attn_combine2_kernel<256>, grid, kThreads, 0, sh, nsplit, part_ml, part_acc, qg, o);
  else
    launch(c, "attn_combine2_kernel", attn_combine2_kernel<128>, grid, kThreads, 0, sh, nsplit, part_ml, part_acc, qg, o);
  FERN_CUDA_LAUNCH_CHECK("attn_combine_kernel");
}

}  // namespace fern::cuda
