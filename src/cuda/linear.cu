// GEMV y = x W^T for affine 4/8-bit and bf16 weights, one launch for all T rows (decode: T = 1; prefill uses this
// simple path for now, re-reading the weights once per row).
// Work split: `LPR` lanes cooperate on one row, each lane taking every LPR-th 16-byte chunk, two chunks per row
// and RPI = 2 rows at a time, so that 4 independent 16-byte loads are in flight per lane before the first use.
// LPR is chosen so that a row's chunks fill the lanes (K = 2048 4-bit: 64 chunks, LPR = 32; K = 512: 16 chunks,
// LPR = 8, 4 rows per warp). The activation row is staged in shared memory once per block (qdot.cuh).
#include "cuda/kernels.h"
#include "cuda/qdot.cuh"

namespace fern::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kRPI = 2;

template <int BITS, int LPR>
__global__ void __launch_bounds__(kThreads) linear_kernel(QW W, const float* __restrict__ x, float* __restrict__ y) {
  extern __shared__ float4 smem[];
  constexpr int E = ChunkTraits<BITS>::kElems;
  const int t = blockIdx.y;
  const int K = static_cast<int>(W.in);
  const int CPR = K / E;
  float4* xs = smem;
  float* xc = reinterpret_cast<float*>(smem + K / 4);
  stage_x<BITS>(x + int64_t(t) * K, K, xs, xc);

  const int lane = threadIdx.x & 31;
  const int sub = lane % LPR, rslot = lane / LPR;
  constexpr int RPW = (32 / LPR) * kRPI;  // rows per warp iteration
  const int64_t warps = int64_t(gridDim.x) * (kThreads / 32);
  const int64_t gw = int64_t(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  for (int64_t row0 = gw * RPW; row0 < W.out; row0 += warps * RPW) {
    RowPtr rp[kRPI];
    bool ok[kRPI];
#pragma unroll
    for (int r = 0; r < kRPI; ++r) {
      const int64_t row = row0 + r * (32 / LPR) + rslot;
      ok[r] = row < W.out;
      rp[r] = row_ptr<BITS>(W, 0, ok[r] ? row : 0);
    }
    float acc[kRPI] = {};
    for (int c0 = sub; c0 < CPR; c0 += 2 * LPR) {
      uint4 wv[2][kRPI];
      float sc[2][kRPI], bi[2][kRPI];
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int c = c0 + u * LPR;
#pragma unroll
        for (int r = 0; r < kRPI; ++r) {
          if (ok[r] && c < CPR) {
            load_chunk<BITS>(rp[r], c, W.gs, wv[u][r], sc[u][r], bi[u][r]);
          } else {
            wv[u][r] = make_uint4(0, 0, 0, 0);
            sc[u][r] = bi[u][r] = 0.0f;
          }
        }
      }
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int c = c0 + u * LPR;
        if (c < CPR) {
          float d[kRPI];
          chunk_dot<BITS, kRPI>(wv[u], xs, c, d);
#pragma unroll
          for (int r = 0; r < kRPI; ++r) acc[r] += apply_group<BITS>(d[r], sc[u][r], bi[u][r], xc, c);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kRPI; ++r) {
      float v = acc[r];
#pragma unroll
      for (int o = LPR / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (sub == 0 && ok[r]) y[int64_t(t) * W.out + row0 + r * (32 / LPR) + rslot] = v;
    }
  }
}

template <int BITS>
void launch_bits(const Ctx& c, const QW& w, const float* x, float* y, int T) {
  constexpr int E = ChunkTraits<BITS>::kElems;
  const int CPR = static_cast<int>(w.in / E);
  const size_t smem = size_t(w.in) * 4 + size_t(CPR) * 4;
  if (smem > 48 * 1024) raise_error("linear: input width " + std::to_string(w.in) + " too large for the GEMV kernel");
  int lpr = 32;
  while (lpr > 4 && CPR < 2 * lpr) lpr /= 2;
  const int rows_per_block = (kThreads / 32) * (32 / lpr) * kRPI;
  const int64_t need = (w.out + rows_per_block - 1) / rows_per_block;
  const int blocks = static_cast<int>(std::min<int64_t>(need, int64_t(c.sms) * 8));
  dim3 grid(blocks, T);
  switch (lpr) {
    case 32: linear_kernel<BITS, 32><<<grid, kThreads, smem, c.stream>>>(w, x, y); break;
    case 16: linear_kernel<BITS, 16><<<grid, kThreads, smem, c.stream>>>(w, x, y); break;
    case 8: linear_kernel<BITS, 8><<<grid, kThreads, smem, c.stream>>>(w, x, y); break;
    default: linear_kernel<BITS, 4><<<grid, kThreads, smem, c.stream>>>(w, x, y); break;
  }
  FERN_CUDA_LAUNCH_CHECK("linear_kernel");
}

}  // namespace

void linear(const Ctx& c, const QW& w, const float* x, float* y, int T) {
  if (T <= 0) return;
  switch (w.bits) {
    case 4: launch_bits<4>(c, w, x, y, T); break;
    case 8: launch_bits<8>(c, w, x, y, T); break;
    default: launch_bits<16>(c, w, x, y, T); break;
  }
}

}  // namespace fern::cuda
