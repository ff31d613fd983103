// The tensor-core tile loop shared by the dense prefill linear (linear_gemm.cu) and the grouped expert GEMMs
// (moe_prefill.cu): one block of 256 threads computes BM token rows x 128 weight rows of x W^T, walking the input
// width in tiles of 64. Per tile the block stages into shared memory
//  - x as two bf16 halves, hi = bf16(x) and lo = bf16(x - hi) (x = hi + lo to ~2^-17 relative), so that two MMAs
//    per fragment give nearly fp32 products instead of bf16-rounded ones;
//  - the weight codes q (0..15 or 0..255, exact in bf16) of affine weights, or the bf16 weights themselves, never
//    dequantized to memory: the affine scale and bias are applied per group to the fp32 partial sums,
//    sum_k x_k (s q_k + b) = s * sum_k x_k q_k + b * sum_k x_k, with sum_k x_k taken from the fp32 x;
//  - per 16-wide k segment: the fp32 sums of x and the scale/bias of the group holding the segment.
// mma.sync m16n8k16 (bf16 in, fp32 accumulate). The 8 warps form WM (token rows) x 8/WM (weight rows); a warp
// covers MT m16 tiles x NT n8 tiles, so BM = 16 * WM * MT and 8/WM * NT * 8 = 128. Rows of shared memory are padded
// by 8 bf16 (16 bytes) so that the fragment reads (8 rows x 4 words) hit 32 different banks.
// The caller decides which x row and which weight row each thread stages (a plain row block for the dense linear,
// gathered token rows and an expert's matrix for the grouped GEMM), so the loop itself knows nothing of either.
// The width K must be a multiple of 16 (segments past K are staged as zeros); affine groups a multiple of 16.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/cuda_util.cuh"
#include "cuda/kernels.h"
#include "cuda/ptx.cuh"

namespace fern::cuda::gemm {

constexpr int kBN = 128;  // weight rows per block
constexpr int kBK = 64;   // input width per tile
constexpr int kSeg = kBK / 16;
constexpr int kPad = kBK + 8;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

template <int BM>
struct Smem {
  __nv_bfloat16 xh[BM][kPad];
  __nv_bfloat16 xl[BM][kPad];
  __nv_bfloat16 w[kBN][kPad];
  float xsum[BM][kSeg];
  float sc[kBN][kSeg];
  float bi[kBN][kSeg];
};

// Warp layout of one configuration.
template <int WM, int MT, int NT>
struct Layout {
  static_assert(kWarps % WM == 0 && (kWarps / WM) * NT * 8 == kBN, "warps must cover the 128 weight rows");
  static constexpr int kBM = 16 * WM * MT;
  static constexpr int kWarpCols = NT * 8;
  __device__ static int row0(int warp) { return (warp % WM) * MT * 16; }  // first token row of the warp
  __device__ static int col0(int warp) { return (warp / WM) * kWarpCols; }  // first weight row of the warp
};

// The weight row a thread stages: its values (bf16) or codes (U32 words), and for affine weights its scales and
// biases. w == nullptr: a padding row (staged as zeros).
struct RowSrc {
  const void* w = nullptr;
  const uint16_t* s = nullptr;
  const uint16_t* b = nullptr;
};

// Row `row` of expert `e` of W (e = 0 for a plain matrix).
template <int BITS>
__device__ __forceinline__ RowSrc row_src(const QW& W, int64_t e, int64_t row) {
  RowSrc r;
  if constexpr (BITS == 16) {
    r.w = static_cast<const uint16_t*>(W.w) + e * W.w_expert + row * W.in;
  } else {
    const int64_t gpr = W.in >> (31 - __clz(W.gs));  // W.in / W.gs: the group size is a power of two (make_qw)
    r.w = static_cast<const uint32_t*>(W.w) + e * W.w_expert + row * (W.in * BITS / 32);
    r.s = W.s + e * W.sb_expert + row * gpr;
    r.b = W.b + e * W.sb_expert + row * gpr;
  }
  return r;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo
  return *reinterpret_cast<uint32_t*>(&p);
}

__device__ __forceinline__ uint32_t ld_u32(const __nv_bfloat16* p) { return *reinterpret_cast<const uint32_t*>(p); }

// Raw words of one 16-value k segment of a weight row: 8 (bf16), 4 (8-bit codes) or 2 (4-bit codes).
template <int BITS>
constexpr int kSegWords = BITS == 16 ? 8 : BITS == 8 ? 4 : 2;

template <int BITS>
__device__ __forceinline__ void load_w_seg(const void* row, int k, uint32_t (&w)[kSegWords<BITS>]) {
  if constexpr (BITS == 16) {
    const uint4* src = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(row) + k);
    const uint4 a = __ldg(src), b = __ldg(src + 1);
    w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
  } else if constexpr (BITS == 8) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint32_t*>(row) + k / 4));
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
  } else {
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(static_cast<const uint32_t*>(row) + k / 8));
    w[0] = v.x, w[1] = v.y;
  }
}

// Writes the 16 values of a loaded segment into shared memory as bf16. Affine: the codes (exact in bf16).
template <int BITS>
__device__ __forceinline__ void store_w_seg(const uint32_t (&w)[kSegWords<BITS>], __nv_bfloat16* dst) {
  uint32_t out[8];
  if constexpr (BITS == 16) {
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = w[i];
  } else if constexpr (BITS == 8) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = pack_bf16(float(w[i] & 0xff), float((w[i] >> 8) & 0xff));
      out[2 * i + 1] = pack_bf16(float((w[i] >> 16) & 0xff), float(w[i] >> 24));
    }
  } else {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j)
        out[4 * i + j] = pack_bf16(float((w[i] >> (8 * j)) & 0xf), float((w[i] >> (8 * j + 4)) & 0xf));
    }
  }
  uint4* d = reinterpret_cast<uint4*>(dst);
  d[0] = make_uint4(out[0], out[1], out[2], out[3]);
  d[1] = make_uint4(out[4], out[5], out[6], out[7]);
}

// What one thread stages for one k tile, held in registers between the global loads and the shared-memory stores
// (so that with PREFETCH the loads of tile i + 1 are in flight while tile i's MMAs run).
template <int BITS>
struct Stage {
  float x[16];                       // x values of the thread's row and segment (zeros for padding)
  uint32_t w[2][kSegWords<BITS>];    // raw weight words of the thread's two segments
  float sc[2], bi[2];                // their group's scale and bias (affine)
};

// acc[mt][nt][i] += x[row] . W[col] over the whole width K for the block's tile, where (Layout) row =
// row0(warp) + mt * 16 + lane / 4 + 8 * (i / 2) and col = col0(warp) + nt * 8 + 2 * (lane % 4) + i % 2.
// Staging roles: thread tid stages x row tid / 4 (16 values at segment tid % 4; threads past 4 * BM stage none)
// from `xrow` (nullptr: a padding row), and weight row tid / 2 (segments 2 (tid % 2) and 2 (tid % 2) + 1) from
// `wsrc`. gs: the affine group size (ignored for BITS == 16). PREFETCH: the global loads of the next k tile are
// issued before the current tile's MMAs (register double buffering; costs the registers of one Stage). Ends with a
// barrier, so the caller may reuse `sm`.
template <int BITS, int WM, int MT, int NT, bool PREFETCH = false>
__device__ __forceinline__ void mainloop(Smem<16 * WM * MT>& sm, int K, int gs, const float* __restrict__ xrow,
                                         const RowSrc& wsrc, float (&acc)[MT][NT][4]) {
  using L = Layout<WM, MT, NT>;
  constexpr int BM = L::kBM;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = L::row0(warp), wn = L::col0(warp);
  const int g = lane >> 2, c = lane & 3;

  float part[MT][NT][4] = {};  // affine: the current group's sum_k x_k q_k
  float xs[MT][2] = {};        // affine: the current group's sum_k x_k for this thread's token rows

  const int xr = tid >> 2, xseg = tid & 3;
  const bool x_role = xr < BM;
  const int wr = tid >> 1, wseg = (tid & 1) * 2;

  auto load_x = [&](int k0, Stage<BITS>& st) {
    if (x_role) {
      if (xrow != nullptr && k0 + xseg * 16 < K) {
        const float4* src = reinterpret_cast<const float4*>(xrow + k0 + xseg * 16);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float4 f = __ldg(src + i);
          st.x[4 * i] = f.x, st.x[4 * i + 1] = f.y, st.x[4 * i + 2] = f.z, st.x[4 * i + 3] = f.w;
        }
      } else {
#pragma unroll
        for (int i = 0; i < 16; ++i) st.x[i] = 0.0f;
      }
    }
  };
  auto load_w = [&](int k0, Stage<BITS>& st) {
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int k = k0 + (wseg + u) * 16;
      if (wsrc.w != nullptr && k < K) {
        load_w_seg<BITS>(wsrc.w, k, st.w[u]);
        if constexpr (BITS != 16) {
          st.sc[u] = bf16_at(wsrc.s, k / gs);
          st.bi[u] = bf16_at(wsrc.b, k / gs);
        }
      } else {
#pragma unroll
        for (int i = 0; i < kSegWords<BITS>; ++i) st.w[u][i] = 0;
        st.sc[u] = st.bi[u] = 0.0f;
      }
    }
  };
  auto store_x = [&](const Stage<BITS>& st) {
    if (x_role) {
      uint32_t hi[8], lo[8];
      float s = 0.0f;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float v0 = st.x[2 * i], v1 = st.x[2 * i + 1];
        const __nv_bfloat16 h0 = __float2bfloat16_rn(v0), h1 = __float2bfloat16_rn(v1);
        __nv_bfloat162 h(h0, h1);
        hi[i] = *reinterpret_cast<uint32_t*>(&h);
        lo[i] = pack_bf16(v0 - __bfloat162float(h0), v1 - __bfloat162float(h1));
        s += v0 + v1;
      }
      uint4* dh = reinterpret_cast<uint4*>(&sm.xh[xr][xseg * 16]);
      uint4* dl = reinterpret_cast<uint4*>(&sm.xl[xr][xseg * 16]);
      dh[0] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
      dh[1] = make_uint4(hi[4], hi[5], hi[6], hi[7]);
      dl[0] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
      dl[1] = make_uint4(lo[4], lo[5], lo[6], lo[7]);
      sm.xsum[xr][xseg] = s;
    }
  };
  auto store_w = [&](const Stage<BITS>& st) {
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int seg = wseg + u;
      store_w_seg<BITS>(st.w[u], &sm.w[wr][seg * 16]);
      if constexpr (BITS != 16) {
        sm.sc[wr][seg] = st.sc[u];
        sm.bi[wr][seg] = st.bi[u];
      }
    }
  };

  Stage<BITS> st;
  if constexpr (PREFETCH) {
    load_x(0, st);
    load_w(0, st);
  }
  for (int k0 = 0; k0 < K; k0 += kBK) {
    if constexpr (PREFETCH) {
      store_x(st);
      store_w(st);
      __syncthreads();
      if (k0 + kBK < K) {  // in flight during this tile's MMAs
        load_x(k0 + kBK, st);
        load_w(k0 + kBK, st);
      }
    } else {  // x converted and stored before the weights are loaded: fewer live registers
      load_x(k0, st);
      store_x(st);
      load_w(k0, st);
      store_w(st);
      __syncthreads();
    }

#pragma unroll
    for (int kk = 0; kk < kSeg; ++kk) {
      const int kb = kk * 16 + 2 * c;
      uint32_t ah[MT][4], al[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int r = wm + mt * 16 + g;
        ah[mt][0] = ld_u32(&sm.xh[r][kb]);
        ah[mt][1] = ld_u32(&sm.xh[r + 8][kb]);
        ah[mt][2] = ld_u32(&sm.xh[r][kb + 8]);
        ah[mt][3] = ld_u32(&sm.xh[r + 8][kb + 8]);
        al[mt][0] = ld_u32(&sm.xl[r][kb]);
        al[mt][1] = ld_u32(&sm.xl[r + 8][kb]);
        al[mt][2] = ld_u32(&sm.xl[r][kb + 8]);
        al[mt][3] = ld_u32(&sm.xl[r + 8][kb + 8]);
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int n = wn + nt * 8 + g;
        const uint32_t b0 = ld_u32(&sm.w[n][kb]), b1 = ld_u32(&sm.w[n][kb + 8]);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          float(&d)[4] = BITS == 16 ? acc[mt][nt] : part[mt][nt];
          ptx::mma16816<false>(d, ah[mt], b0, b1);
          ptx::mma16816<false>(d, al[mt], b0, b1);
        }
      }
      if constexpr (BITS != 16) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          xs[mt][0] += sm.xsum[wm + mt * 16 + g][kk];
          xs[mt][1] += sm.xsum[wm + mt * 16 + g + 8][kk];
        }
        if ((k0 + kk * 16 + 16) % gs == 0) {  // end of a group: apply its scale and bias
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            const int n = wn + nt * 8 + 2 * c;
            const float s0 = sm.sc[n][kk], s1 = sm.sc[n + 1][kk];
            const float b0 = sm.bi[n][kk], b1 = sm.bi[n + 1][kk];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
              float* a = acc[mt][nt];
              float* p = part[mt][nt];
              a[0] += s0 * p[0] + b0 * xs[mt][0];
              a[1] += s1 * p[1] + b1 * xs[mt][0];
              a[2] += s0 * p[2] + b0 * xs[mt][1];
              a[3] += s1 * p[3] + b1 * xs[mt][1];
              p[0] = p[1] = p[2] = p[3] = 0.0f;
            }
          }
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) xs[mt][0] = xs[mt][1] = 0.0f;
        }
      }
    }
    __syncthreads();
  }
}

}  // namespace fern::cuda::gemm
