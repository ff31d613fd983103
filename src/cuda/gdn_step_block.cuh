// The Gated DeltaNet step of one token row by one block (MODEL.md 2.4 steps 3-8): the body of gdn.cu's step kernel,
// shared with the fused step + out_proj launch (gdn_out.cu). gdn.cu's header comment says how it works. Grid
// (Hv value heads, Dv/32 column blocks) of kGdnThreads threads; calls pdl_wait() and pdl_trigger() itself.
#pragma once
#include "cuda/cuda_util.cuh"
#include "cuda/kernels.h"

namespace fern::cuda {
namespace gdn_detail {

constexpr int kThreads = 256;  // kGdnThreads
constexpr int kCols = 32;
constexpr int kSlices = kThreads / kCols;
constexpr int kMaxDk = 128;
constexpr int kMaxRows = kMaxDk / kSlices;
constexpr int kMaxKS = 8;    // conv taps supported (the model's kernel is 4; the tests also use 2 and 7)
constexpr int kConvPer = 2;  // conv channels per thread: 2 * Dk + kCols <= 2 * kThreads

__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

}  // namespace gdn_detail

constexpr int kGdnThreads = gdn_detail::kThreads;

// The shapes the step supports (gdn.cu gdn_step_ok).
__host__ __device__ constexpr bool gdn_block_shape_ok(const GdnShape& sh) {
  using namespace gdn_detail;
  return sh.Dk % kSlices == 0 && sh.Dk > 0 && sh.Dk <= kMaxDk && sh.Dv % kCols == 0 && sh.Dv > 0 &&
         sh.Dv <= kThreads && sh.Hk > 0 && sh.Hv % sh.Hk == 0 && sh.kernel >= 2 && sh.kernel <= kMaxKS &&
         sh.conv_dim == 2 * sh.Hk * sh.Dk + sh.Hv * sh.Dv;
}

// MAXKS: conv taps held in registers (4 for the model; 8 for longer kernels). Inputs written by an earlier kernel
// are plain pointers (gdn.cu says why never const __restrict__).
template <int MAXKS>
__device__ __forceinline__ void gdn_step_block(const GdnShape& sh, const float* mixed, const float* bgate,
                                               const float* agate, const float* __restrict__ conv_w,
                                               const float* __restrict__ A_log, const float* __restrict__ dt_bias,
                                               float* conv_state, float* state, float* y, int* counters,
                                               int early_state) {
  using namespace gdn_detail;
  // The recurrent and conv states of this layer were last written by this layer's kernel of the previous token.
  // When that is at least two launches back (early_state: the first row of a call), they are complete before this
  // kernel starts: every kernel calls pdl_trigger() only after its own pdl_wait(), so when kernel N starts, kernel
  // N-2 has finished. Everything that does not come from the previous kernel is requested before the PDL wait: the
  // conv taps, A_log and dt_bias (weights), and with early_state the recurrent and conv state; after the wait, the
  // inputs (mixed, b, a) are requested together in one round (version 3 waited for the conv loads, then the gates
  // after two block reductions: dependent round trips more).
  const int jj = threadIdx.x % kCols, sl = threadIdx.x / kCols;
  const int j = blockIdx.y * kCols + jj;
  const int R = sh.Dk / kSlices;
  float* S = state + int64_t(blockIdx.x) * sh.Dk * sh.Dv;
  const int h = blockIdx.x, cb = blockIdx.y;
  const int Dk = sh.Dk, Dv = sh.Dv, KS = sh.kernel, C = sh.conv_dim;
  const int kh = h / (sh.Hv / sh.Hk);
  const int key_dim = sh.Hk * Dk;
  const int tid = threadIdx.x;
  const int nconv = 2 * Dk + kCols;  // q and k channels of the key head, v channels of this block's columns
  auto channel = [&](int idx) {
    if (idx < Dk) return kh * Dk + idx;
    if (idx < 2 * Dk) return key_dim + kh * Dk + (idx - Dk);
    return 2 * key_dim + h * Dv + cb * kCols + (idx - 2 * Dk);
  };
  float s[kMaxRows];
  auto load_state = [&] {
#pragma unroll
    for (int ii = 0; ii < kMaxRows; ++ii)
      if (ii < R) s[ii] = S[int64_t(sl * R + ii) * sh.Dv + j];
  };
  float cw[kConvPer][MAXKS], cs[kConvPer][MAXKS - 1];
  auto load_conv_state = [&] {
#pragma unroll
    for (int q = 0; q < kConvPer; ++q) {
      const int idx = tid + q * kThreads;
#pragma unroll
      for (int r = 0; r < MAXKS - 1; ++r)
        cs[q][r] = idx < nconv && r < KS - 1 ? conv_state[int64_t(r) * C + channel(idx)] : 0.0f;
    }
  };
#pragma unroll
  for (int q = 0; q < kConvPer; ++q) {
    const int idx = tid + q * kThreads;
#pragma unroll
    for (int r = 0; r < MAXKS; ++r) cw[q][r] = idx < nconv && r < KS ? __ldg(conv_w + int64_t(channel(idx)) * KS + r) : 0.0f;
  }
  const float a_log = __ldg(A_log + h), dtb = __ldg(dt_bias + h);
  if (early_state) {
    load_state();
    load_conv_state();
  }
  pdl_wait();
  pdl_trigger();
  if (!early_state) {
    load_state();
    load_conv_state();
  }
  float mx[kConvPer];
#pragma unroll
  for (int q = 0; q < kConvPer; ++q) {
    const int idx = tid + q * kThreads;
    mx[q] = idx < nconv ? mixed[channel(idx)] : 0.0f;
  }
  const float bg = bgate[h], ag = agate[h];
  __shared__ float qs[kMaxDk], ks[kMaxDk], vs[kCols];
  __shared__ float part[kSlices][kCols];
  __shared__ float red[32];
  __shared__ bool last_k;

  // Causal conv + SiLU of the channels this block needs (the newest input has the last tap).
#pragma unroll
  for (int q = 0; q < kConvPer; ++q) {
    const int idx = tid + q * kThreads;
    if (idx < nconv) {
      // Version 3's order: the newest input first, then the carried inputs oldest first (register arrays indexed by
      // compile-time constants only).
      float acc = 0.0f;
#pragma unroll
      for (int r = 0; r < MAXKS; ++r)
        if (r == KS - 1) acc = cw[q][r] * mx[q];
#pragma unroll
      for (int r = 0; r < MAXKS - 1; ++r)
        if (r < KS - 1) acc = fmaf(cw[q][r], cs[q][r], acc);
      const float v = silu(acc);
      if (idx < Dk) qs[idx] = v;
      else if (idx < 2 * Dk) ks[idx - Dk] = v;
      else vs[idx - 2 * Dk] = v;
    }
  }
  // The shifted conv state of channel idx: rows 1.. of the old state, then the new input (registers only).
  auto shift_conv = [&](int q) {
    const int64_t ch = channel(tid + q * kThreads);
#pragma unroll
    for (int r = 0; r < MAXKS - 1; ++r) {
      if (r + 1 < KS - 1) conv_state[int64_t(r) * C + ch] = cs[q][r + 1];
      else if (r == KS - 2) conv_state[int64_t(r) * C + ch] = mx[q];
    }
  };
  // This block's v channels: no other block reads them, and this thread has read its own before writing.
#pragma unroll
  for (int q = 0; q < kConvPer; ++q) {
    const int idx = tid + q * kThreads;
    if (idx >= 2 * Dk && idx < nconv) shift_conv(q);
  }
  __syncthreads();  // every thread's conv inputs consumed (their values are in shared memory)
  // The count's old value is first used at the end of the kernel (last_k), so its L2 round trip overlaps the delta
  // rule instead of stalling thread 0, and with it the block, at the next barrier.
  int arrived = 0;
  if (tid == 0) {
    // No global store of this block precedes the fence: it orders the block's conv-state reads before the count.
    __threadfence();
    arrived = atomicAdd(&counters[kh], 1);
  }
  // l2 norms (eps inside the square root of the sum), q also scaled by Dk^-1/2.
  const float q2 = block_sum(tid < Dk ? qs[tid] * qs[tid] : 0.0f, red);
  const float k2 = block_sum(tid < Dk ? ks[tid] * ks[tid] : 0.0f, red);
  const float qscale = rsqrtf(q2 + 1e-6f) * rsqrtf(float(Dk));
  const float kscale = rsqrtf(k2 + 1e-6f);
  const float beta = 1.0f / (1.0f + expf(-bg));
  const float g = -expf(a_log) * softplus(ag + dtb);
  const float decay = expf(g);

  float m = 0.0f;
#pragma unroll
  for (int ii = 0; ii < kMaxRows; ++ii) {
    if (ii < R) {
      const int i = sl * R + ii;
      s[ii] *= decay;
      m = fmaf(s[ii], ks[i] * kscale, m);
    }
  }
  part[sl][jj] = m;
  __syncthreads();
  float mj = 0.0f;
#pragma unroll
  for (int p = 0; p < kSlices; ++p) mj += part[p][jj];
  const float u = beta * (vs[jj] - mj);
  float o = 0.0f;
#pragma unroll
  for (int ii = 0; ii < kMaxRows; ++ii) {
    if (ii < R) {
      const int i = sl * R + ii;
      s[ii] = fmaf(ks[i] * kscale, u, s[ii]);
      S[int64_t(i) * Dv + j] = s[ii];
      o = fmaf(s[ii], qs[i] * qscale, o);
    }
  }
  __syncthreads();  // everyone has read part[] for m
  part[sl][jj] = o;
  if (tid == 0) last_k = arrived == int(gridDim.y) * (sh.Hv / sh.Hk) - 1;
  __syncthreads();
  if (sl == 0) {
    float oj = 0.0f;
#pragma unroll
    for (int p = 0; p < kSlices; ++p) oj += part[p][jj];
    y[int64_t(h) * Dv + j] = oj;  // raw delta-rule output (step 8); the gated norm is the consumer's
  }
  if (last_k) {
    // Every block of the key head has read the q/k channels' conv state: shift them (stores only).
#pragma unroll
    for (int q = 0; q < kConvPer; ++q)
      if (tid + q * kThreads < 2 * Dk) shift_conv(q);
    if (tid == 0) counters[kh] = 0;
  }
}

}  // namespace fern::cuda
