// What the two prefill attention kernels share (attn_prefill.cu: mma.sync; attn_prefill_wg.cu: wgmma): the key
// range and row limits of a block, the mask and online softmax of one key tile on the score registers, the epilogue,
// and the operand packing (fp32 pairs to one register of two 16-bit values, bf16 cache rows to fp16). Both hold
// scores and outputs in the mma.sync accumulator layout (that of wgmma m64nN per warp): this thread's rows r0 and
// r0 + 8, slot q of an 8-column block at row r0 + 8 (q / 2), column 8 n + 2 (lane % 4) + q % 2.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/attn_prefill.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_util.cuh"
#include "cuda/kernels.h"
#include "cuda/ptx.cuh"

namespace fern::cuda {

// Two floats as one register of 16-bit operands (.x, the low half, = lo). fp16: one cvt with .satfinite (finite
// values past the range become +-65504, NaN stays NaN; sm_80+), cheaper than clamping each value first.
template <bool F16>
__device__ __forceinline__ uint32_t pack16(float lo, float hi) {
  if constexpr (F16) {
    uint32_t r;
    asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));  // first source -> upper half
    return r;
  } else {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

// Eight bf16 values (one 16-byte chunk) to fp16: the bf16 -> fp32 step is exact, then pack16 rounds.
__device__ __forceinline__ uint4 bf16x8_to_f16(uint4 v) {
  uint32_t* w = reinterpret_cast<uint32_t*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) w[i] = pack16<true>(__uint_as_float(w[i] << 16), __uint_as_float(w[i] & 0xffff0000u));
  return v;
}

// The grid of both kernels: query tiles of kAttnPrefillRows rows (128 / G tokens) x KV heads x splits, after checking
// the split count and its partials' scratch.
inline dim3 attn_prefill_grid(const AttnShape& sh, int T, int nsplit, const float* part_ml, const float* part_acc) {
  FERN_CU_CHECK(nsplit >= 1 && nsplit <= kAttnPrefillMaxSplits, "attention prefill: split count");
  FERN_CU_CHECK(nsplit == 1 || (part_ml != nullptr && part_acc != nullptr), "attention prefill: partials scratch");
  const int TQ = kAttnPrefillRows / (sh.Hq / sh.Hkv);
  return dim3((T + TQ - 1) / TQ, sh.Hkv, nsplit);
}

// The scale of the scores into the exp2 domain of the softmax: 1 / sqrt(D) times log2(e).
template <int D>
__device__ __forceinline__ float score_scale_log2() {
  return rsqrtf(float(D)) * 1.4426950408889634f;
}

// The block's share of the work: query tile (token rows t0 .. t0 + TQ - 1 of KV head kvh; the latest tiles first,
// they have the most key tiles), its key tiles [j_begin, j_end) in split `split` of nsplit, and this thread's rows.
struct AttnTile {
  int TQ, t0, kvh, split, nsplit, P0;
  int kv_len;  // keys the tile's last row sees
  int j_begin, j_end;
  int r0;      // this thread's accumulator rows r0 and r0 + 8 (warp w holds rows 16 w .. 16 w + 15)
  int lim[2];  // last key each of them may see; padding rows (t >= T) clamp to the last written row
};

template <int BM, int BN>
__device__ __forceinline__ AttnTile attn_tile(const int32_t* d_pos, int T, int G) {
  AttnTile a;
  a.TQ = BM / G;
  a.t0 = (static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x)) * a.TQ;
  a.kvh = blockIdx.y;
  a.split = blockIdx.z;
  a.nsplit = gridDim.z;
  a.P0 = d_pos[0];
  const int t_last = min(a.t0 + a.TQ, T) - 1;
  a.kv_len = a.P0 + t_last + 1;
  // KV tiles per split from the device-side length, so that no key can fall between splits whatever nsplit is.
  const int tiles_all = (a.P0 + T + BN - 1) / BN;
  const int per_split = (tiles_all + a.nsplit - 1) / a.nsplit;
  a.j_begin = a.split * per_split;
  a.j_end = min((a.kv_len + BN - 1) / BN, a.j_begin + per_split);
  a.r0 = (threadIdx.x >> 5) * 16 + ((threadIdx.x & 31) >> 2);
#pragma unroll
  for (int i = 0; i < 2; ++i) a.lim[i] = a.P0 + min(a.t0 + (a.r0 + 8 * i) / G, T - 1);
  return a;
}

// 16-byte chunk ch (dims 8 ch .. 8 ch + 7) of query-tile row r, rounded to 16-bit operands (F16: fp16, saturating;
// else bf16); zero for padding rows.
template <bool F16, int D>
__device__ __forceinline__ uint4 q_chunk(const float* q, const AttnShape& sh, const AttnTile& tl, int T, int G, int r,
                                         int ch) {
  const int t = tl.t0 + r / G;
  if (r >= tl.TQ * G || t >= T) return make_uint4(0, 0, 0, 0);
  const float4* src = reinterpret_cast<const float4*>(q + (int64_t(t) * sh.Hq + tl.kvh * G + r % G) * D + ch * 8);
  const float4 a = src[0], b = src[1];
  return make_uint4(pack16<F16>(a.x, a.y), pack16<F16>(a.z, a.w), pack16<F16>(b.x, b.y), pack16<F16>(b.z, b.w));
}

// The two-buffer key pipeline: issues key tile j + 1's copies into buffer buf ^ 1 (released by the barrier that ended
// tile j - 1) through load(j + 1, buf ^ 1), then waits for this thread's copies of tile j.
template <class Load>
__device__ __forceinline__ void next_key_tile(const AttnTile& tl, int j, int buf, Load load) {
  if (j + 1 < tl.j_end) {
    load(j + 1, buf ^ 1);
    ptx::cp_commit();
    ptx::cp_wait<1>();
  } else {
    ptx::cp_wait<0>();
  }
}

// Mask (only where the tile reaches past the first row's last key) and online softmax in the exp2 domain of key tile
// k0 .. k0 + BN - 1, in place on the scores: s(n, q) is the score of 8-key block n, slot q; they become the
// unnormalised weights. m_r, l_r: the rows' running max and sum; rescale(i, corr) multiplies row i's output
// accumulators by corr, called only when some row of the warp moved its max.
template <int BN, class S, class Rescale>
__device__ __forceinline__ void softmax_tile(S s, const AttnTile& tl, int k0, float sl2, float (&m_r)[2],
                                             float (&l_r)[2], Rescale rescale) {
  const int lane = threadIdx.x & 31;
  const bool need_mask = k0 + BN - 1 > tl.P0 + tl.t0;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float mx = -INFINITY;
#pragma unroll
    for (int n = 0; n < BN / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float v = s(n, 2 * i + e) * sl2;
        if (need_mask && k0 + n * 8 + (lane & 3) * 2 + e > tl.lim[i]) v = -INFINITY;
        s(n, 2 * i + e) = v;
        mx = fmaxf(mx, v);
      }
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float mnew = fmaxf(m_r[i], mx);
    const float mref = mnew == -INFINITY ? 0.0f : mnew;  // a row with nothing visible yet stays at zero
    const float corr = ptx::fast_exp2(m_r[i] - mref);
    m_r[i] = mnew;
    float sum = 0.0f;
#pragma unroll
    for (int n = 0; n < BN / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float p = ptx::fast_exp2(s(n, 2 * i + e) - mref);
        s(n, 2 * i + e) = p;
        sum += p;
      }
    }
    l_r[i] = l_r[i] * corr + sum;
    // Once the running maxima have settled (most tiles of a long cache) no row of the warp changes: skip the
    // 2 x D/8 multiplies per row (estimated at a quarter of the tile's MMA issue time at D = 256; not measured).
    if (__any_sync(0xffffffffu, corr != 1.0f)) rescale(i, corr);
  }
}

// Epilogue: row sums over the quad of lanes that share a row, then the gated output (o [T, Hq * D]) or this split's
// partials (part_acc, part_ml). acc(n, q): the output accumulator of 8-dim block n, slot q.
template <int D, class Acc>
__device__ __forceinline__ void attn_epilogue(const AttnShape& sh, const AttnTile& tl, int T, int G,
                                              const float (&m_r)[2], const float (&l_r)[2], Acc acc,
                                              const float* qg, float* part_ml, float* part_acc, float* o) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float l = l_r[i];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int r = tl.r0 + 8 * i;
    const int t = tl.t0 + r / G, h = tl.kvh * G + r % G;
    if (r >= tl.TQ * G || t >= T) continue;
    const int64_t row = int64_t(t) * sh.Hq + h;
    if (tl.nsplit == 1) {
      const float inv = 1.0f / l;  // l >= 1: every row sees key 0 and its own maximum contributes exp2(0)
      const float* gate = qg + row * 2 * D + D;
      float* orow = o + row * D;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        const int d = n * 8 + (lane & 3) * 2;
        const float2 g = *reinterpret_cast<const float2*>(gate + d);
        *reinterpret_cast<float2*>(orow + d) =
            make_float2(acc(n, 2 * i) * inv * sigmoid(g.x), acc(n, 2 * i + 1) * inv * sigmoid(g.y));
      }
    } else {
      float* pa = part_acc + (row * tl.nsplit + tl.split) * D;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        const int d = n * 8 + (lane & 3) * 2;
        *reinterpret_cast<float2*>(pa + d) = make_float2(acc(n, 2 * i), acc(n, 2 * i + 1));
      }
      if ((lane & 3) == 0)
        *reinterpret_cast<float2*>(part_ml + (row * tl.nsplit + tl.split) * 2) = make_float2(m_r[i], l);
    }
  }
}

}  // namespace fern::cuda
