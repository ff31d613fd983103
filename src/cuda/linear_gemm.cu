// Multi-row linear (prefill): y[t] = x[t] W^T for a block of token rows at once on the tensor cores, so that each
// weight tile is read once per 64 token rows instead of once per row (the GEMV in linear.cu re-reads the whole
// matrix for every row). docs/notes/cuda-prefill-v1.md has the measurements.
// Tiling: a block computes 64 token rows x 128 weight rows, walking the input width in tiles of 64. Per tile the
// block stages
//  - x as two bf16 halves, hi = bf16(x) and lo = bf16(x - hi) (x = hi + lo to ~2^-17 relative), so that two MMAs
//    per fragment give nearly fp32 products instead of bf16-rounded ones;
//  - the weight codes q (0..15 or 0..255, exact in bf16) of affine weights, or the bf16 weights themselves, never
//    dequantized to memory: the affine scale and bias are applied per group to the fp32 partial sums,
//    sum_k x_k (s q_k + b) = s * sum_k x_k q_k + b * sum_k x_k, with sum_k x_k taken from the fp32 x;
//  - per 16-wide k segment: the fp32 sums of x and the scale/bias of the group holding the segment.
// mma.sync m16n8k16 (bf16 in, fp32 accumulate); 8 warps as 2 (token rows) x 4 (weight rows), 32 x 32 per warp.
// Rows of shared memory are padded by 8 bf16 (16 bytes) so that the fragment reads (8 rows x 4 words) hit 32
// different banks.
#include <cuda_bf16.h>

#include "cuda/kernels.h"
#include "cuda/launch.cuh"
#include "cuda/cuda_util.cuh"

namespace fern::cuda {
namespace {

constexpr int kBM = 64;    // token rows per block
constexpr int kBN = 128;   // weight rows per block
constexpr int kBK = 64;    // input width per tile
constexpr int kSeg = kBK / 16;
constexpr int kPad = kBK + 8;
constexpr int kGemmThreads = 256;

struct GemmSmem {
  __nv_bfloat16 xh[kBM][kPad];
  __nv_bfloat16 xl[kBM][kPad];
  __nv_bfloat16 w[kBN][kPad];
  float xsum[kBM][kSeg];
  float sc[kBN][kSeg];
  float bi[kBN][kSeg];
};

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo
  return *reinterpret_cast<uint32_t*>(&p);
}

__device__ __forceinline__ uint32_t ld_u32(const __nv_bfloat16* p) { return *reinterpret_cast<const uint32_t*>(p); }

// Writes 16 weight values (one k segment of one row) into shared memory as bf16. Affine: the codes only.
template <int BITS>
__device__ __forceinline__ void stage_w_seg(const QW& W, int64_t row, int k, __nv_bfloat16* dst) {
  uint32_t out[8];
  if constexpr (BITS == 16) {
    const uint4* src = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(W.w) + row * W.in + k);
    const uint4 a = __ldg(src), b = __ldg(src + 1);
    out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w, out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
  } else if constexpr (BITS == 8) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint32_t*>(W.w) + row * (W.in / 4) + k / 4));
    const uint32_t ws[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = pack_bf16(float(ws[i] & 0xff), float((ws[i] >> 8) & 0xff));
      out[2 * i + 1] = pack_bf16(float((ws[i] >> 16) & 0xff), float(ws[i] >> 24));
    }
  } else {
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(static_cast<const uint32_t*>(W.w) + row * (W.in / 8) + k / 8));
    const uint32_t ws[2] = {v.x, v.y};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j)
        out[4 * i + j] = pack_bf16(float((ws[i] >> (8 * j)) & 0xf), float((ws[i] >> (8 * j + 4)) & 0xf));
    }
  }
  uint4* d = reinterpret_cast<uint4*>(dst);
  d[0] = make_uint4(out[0], out[1], out[2], out[3]);
  d[1] = make_uint4(out[4], out[5], out[6], out[7]);
}

template <int BITS>
__global__ void __launch_bounds__(kGemmThreads) gemm_kernel(QW W, const float* __restrict__ x, float* __restrict__ y,
                                                            int T) {
  __shared__ __align__(16) GemmSmem sm;
  const int K = static_cast<int>(W.in);
  const int N = static_cast<int>(W.out);
  const int t0 = blockIdx.x * kBM;
  const int n0 = blockIdx.y * kBN;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = (warp & 1) * 32, wn = (warp >> 1) * 32;
  const int g = lane >> 2, c = lane & 3;
  const int gs = BITS == 16 ? kBK : W.gs;
  const int gpr = BITS == 16 ? 0 : K / W.gs;

  pdl_wait();
  pdl_trigger();

  float acc[2][4][4] = {};
  float part[2][4][4] = {};  // affine: the current group's sum_k x_k q_k
  float xs[2][2] = {};       // affine: the current group's sum_k x_k for this thread's 4 token rows

  // Staging roles: x by (token row, segment), weights by (weight row, two segments).
  const int xr = tid >> 2, xseg = tid & 3;
  const int wr = tid >> 1, wseg = (tid & 1) * 2;
  const bool x_ok = t0 + xr < T;
  const bool w_ok = n0 + wr < N;

  for (int k0 = 0; k0 < K; k0 += kBK) {
    {
      float v[16];
      if (x_ok) {
        const float4* src = reinterpret_cast<const float4*>(x + int64_t(t0 + xr) * K + k0 + xseg * 16);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float4 f = __ldg(src + i);
          v[4 * i] = f.x, v[4 * i + 1] = f.y, v[4 * i + 2] = f.z, v[4 * i + 3] = f.w;
        }
      } else {
#pragma unroll
        for (int i = 0; i < 16; ++i) v[i] = 0.0f;
      }
      uint32_t hi[8], lo[8];
      float s = 0.0f;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const __nv_bfloat16 h0 = __float2bfloat16_rn(v[2 * i]), h1 = __float2bfloat16_rn(v[2 * i + 1]);
        __nv_bfloat162 h(h0, h1);
        hi[i] = *reinterpret_cast<uint32_t*>(&h);
        lo[i] = pack_bf16(v[2 * i] - __bfloat162float(h0), v[2 * i + 1] - __bfloat162float(h1));
        s += v[2 * i] + v[2 * i + 1];
      }
      uint4* dh = reinterpret_cast<uint4*>(&sm.xh[xr][xseg * 16]);
      uint4* dl = reinterpret_cast<uint4*>(&sm.xl[xr][xseg * 16]);
      dh[0] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
      dh[1] = make_uint4(hi[4], hi[5], hi[6], hi[7]);
      dl[0] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
      dl[1] = make_uint4(lo[4], lo[5], lo[6], lo[7]);
      sm.xsum[xr][xseg] = s;
    }
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int seg = wseg + u;
      const int k = k0 + seg * 16;
      if (w_ok) {
        stage_w_seg<BITS>(W, n0 + wr, k, &sm.w[wr][seg * 16]);
        if constexpr (BITS != 16) {
          const int64_t gi = int64_t(n0 + wr) * gpr + k / gs;
          sm.sc[wr][seg] = bf16_at(W.s, gi);
          sm.bi[wr][seg] = bf16_at(W.b, gi);
        }
      } else {
        uint4* d = reinterpret_cast<uint4*>(&sm.w[wr][seg * 16]);
        d[0] = d[1] = make_uint4(0, 0, 0, 0);
        sm.sc[wr][seg] = sm.bi[wr][seg] = 0.0f;
      }
    }
    __syncthreads();

#pragma unroll
    for (int kk = 0; kk < kSeg; ++kk) {
      const int kb = kk * 16 + 2 * c;
      uint32_t ah[2][4], al[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
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
      for (int nt = 0; nt < 4; ++nt) {
        const int n = wn + nt * 8 + g;
        const uint32_t b0 = ld_u32(&sm.w[n][kb]), b1 = ld_u32(&sm.w[n][kb + 8]);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          float (&d)[4] = BITS == 16 ? acc[mt][nt] : part[mt][nt];
          mma_bf16(d, ah[mt], b0, b1);
          mma_bf16(d, al[mt], b0, b1);
        }
      }
      if constexpr (BITS != 16) {
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          xs[mt][0] += sm.xsum[wm + mt * 16 + g][kk];
          xs[mt][1] += sm.xsum[wm + mt * 16 + g + 8][kk];
        }
        if ((k0 + kk * 16 + 16) % gs == 0) {  // end of a group: apply its scale and bias
#pragma unroll
          for (int nt = 0; nt < 4; ++nt) {
            const int n = wn + nt * 8 + 2 * c;
            const float s0 = sm.sc[n][kk], s1 = sm.sc[n + 1][kk];
            const float b0 = sm.bi[n][kk], b1 = sm.bi[n + 1][kk];
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
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
          for (int mt = 0; mt < 2; ++mt) xs[mt][0] = xs[mt][1] = 0.0f;
        }
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int t = t0 + wm + mt * 16 + g + 8 * h;
      if (t >= T) continue;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int n = n0 + wn + nt * 8 + 2 * c;
        float* dst = y + int64_t(t) * N + n;
        if (n < N) dst[0] = acc[mt][nt][2 * h];
        if (n + 1 < N) dst[1] = acc[mt][nt][2 * h + 1];
      }
    }
  }
}

}  // namespace

bool linear_gemm_ok(const QW& w) {
  if (w.experts != 0 || w.in <= 0 || w.in % kBK != 0 || w.out <= 0 || w.out >= (int64_t(1) << 31) ||
      w.in >= (int64_t(1) << 31))
    return false;
  if (w.bits == 16) return true;
  // A group must cover whole 16-wide k segments (the scale is applied per segment's group).
  return (w.bits == 4 || w.bits == 8) && w.gs >= 16 && w.gs % 16 == 0 && w.in % w.gs == 0;
}

bool linear_gemm_wins(const QW& w, int T) {
  if (T < kGemmMinRows || !linear_gemm_ok(w)) return false;
  // Each block walks the whole width alone (no split over K), so a small grid leaves most SMs idle. Measured
  // (docs/notes/cuda-prefill-v1.md): 16 blocks lose to the GEMV (0.3x-0.9x), 64 blocks win (2.7x-3.3x); between
  // them nothing was measured, so the switch is at 64.
  const int64_t blocks = (int64_t(T) + kBM - 1) / kBM * ((w.out + kBN - 1) / kBN);
  return blocks >= 64;
}

void linear_gemm(const Ctx& c, const QW& w, const float* x, float* y, int T) {
  FERN_CU_CHECK(linear_gemm_ok(w), "linear_gemm: unsupported weight shape or format");
  if (T <= 0) return;
  const int64_t nb = (w.out + kBN - 1) / kBN;
  FERN_CU_CHECK(nb <= 65535, "linear_gemm: too many output rows");
  dim3 grid((T + kBM - 1) / kBM, static_cast<unsigned>(nb));
  switch (w.bits) {
    case 4: launch(c, "gemm_kernel", gemm_kernel<4>, grid, kGemmThreads, 0, w, x, y, T); break;
    case 8: launch(c, "gemm_kernel", gemm_kernel<8>, grid, kGemmThreads, 0, w, x, y, T); break;
    default: launch(c, "gemm_kernel", gemm_kernel<16>, grid, kGemmThreads, 0, w, x, y, T); break;
  }
}

}  // namespace fern::cuda
