// The Gated DeltaNet step of one token for one block: value head h, state columns [cb * 32, cb * 32 + 32)
// (MODEL.md 2.4 steps 3-8; the gated norm of step 9 is the consumer's). Shared by the step's own kernel (gdn.cu
// gdn_kernel: its inputs written by the projection kernel before it, ordered by the PDL wait) and by the input
// projections' kernel in its GDN form (linear.cu: the step run by the blocks that computed the head's rows, after
// a handoff among the blocks of one key head, docs/notes/cuda-decode-v39-gdn-fused.md). 256 threads = 32 state
// columns x 8 slices of the key dimension.
// Each block recomputes the causal conv + SiLU for the q/k channels of its key head and the v channels of its
// columns (cheap: 2*Dk + 32 channels), the l2 norms and the gates, then runs the delta rule on its 32 columns of
// the fp32 state, which stay in registers between the decay, the read-out m = S^T k, the rank-1 update and the
// read-out o = S^T q (each state element is read once and written once: the state is 60 MiB per token and
// dominates the step's time).
// The conv state is shifted from registers, without reloading anything: each block's v channels are read by that
// block alone, so it writes them itself; the q/k channels of a key head are read by all its blocks, so the last
// of them to have consumed its conv inputs writes them ("last block" counter per key head). That counter's fence
// and atomic come right after the conv, before any state store, so the fence waits for no store and the block's
// tail is stores only (version 7 kept a per-value-head counter after the state stores, with the fence waiting
// for them, and the head's last block re-read, normalised and rewrote its 128 outputs: a chain of L2 round trips
// at the end of every block that the next kernel waited for).
#pragma once

#include "cuda/cuda_util.cuh"
#include "cuda/kernels.h"

namespace fern::cuda::gdn {

constexpr int kThreads = 256;
constexpr int kCols = 32;
constexpr int kSlices = kThreads / kCols;
constexpr int kMaxDk = 128;
constexpr int kMaxRows = kMaxDk / kSlices;
constexpr int kMaxKS = 8;    // conv taps supported (the model's kernel is 4; the tests also use 2 and 7)
constexpr int kConvPer = 2;  // conv channels per thread: 2 * Dk + kCols <= 2 * kThreads
constexpr int kLeanDv = 128;  // the real model's value head width (the LEAN form)

__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// Where the step's inputs come from, and how the block waits for them (In):
//   in.wait()             after the loads that do not depend on the inputs' writer are requested;
//   in.mixed_at(ch)       channel ch of the projected row (q | k | v, before the conv), after the wait;
//   in.gates(h, bg, ag)   the head's b and a projections, after the wait.
// MAXKS: conv taps held in registers (4 for the model; 8 for longer kernels).
// LEAN: the real model's shape fixed at compile time (Dk = Dv = 128, MAXKS taps, the state requested before the
// wait), so that the bound checks and the second copy of the state loads are not compiled (28,672 -> 15,744 bytes
// of code in gdn_kernel; a decode launch pays for its code, docs/notes/cuda-decode-v27-poll-lean.md).
// early_state (ignored when LEAN): the recurrent and conv states may be requested before the wait (the caller's
// rule: gdn.cu). kh_blocks: the blocks that share key head kh (they all count in at *kh_counter, which the last one
// resets, and *also_reset with it where not null: a counter that every one of them has passed by then).
template <int MAXKS, bool LEAN, typename In>
__device__ __forceinline__ void step_block(const GdnShape& sh, int h, int cb, int kh, int kh_blocks, In& in,
                                           const float* __restrict__ conv_w, const float* __restrict__ A_log,
                                           const float* __restrict__ dt_bias, float* conv_state, float* state,
                                           float* y, int* kh_counter, bool early_state,
                                           int* also_reset = nullptr) {
  const int jj = threadIdx.x % kCols, sl = threadIdx.x / kCols;
  const int j = cb * kCols + jj;
  const int Dk = LEAN ? kMaxDk : sh.Dk, Dv = LEAN ? kLeanDv : sh.Dv, KS = LEAN ? MAXKS : sh.kernel;
  const int C = sh.conv_dim;
  const bool early = LEAN || early_state;
  const int R = Dk / kSlices;
  float* S = state + int64_t(h) * Dk * Dv;
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
      if (ii < R) s[ii] = S[int64_t(sl * R + ii) * Dv + j];
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
  if (early) {
    load_state();
    load_conv_state();
  }
  in.wait();
  if (!early) {
    load_state();
    load_conv_state();
  }
  float mx[kConvPer];
#pragma unroll
  for (int q = 0; q < kConvPer; ++q) {
    const int idx = tid + q * kThreads;
    mx[q] = idx < nconv ? in.mixed_at(channel(idx)) : 0.0f;
  }
  float bg, ag;
  in.gates(h, bg, ag);
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
  // The count's old value is first used at the end of the block's step (last_k), so its L2 round trip overlaps the
  // delta rule instead of stalling thread 0, and with it the block, at the next barrier.
  int arrived = 0;
  if (tid == 0) {
    // No global store of this block's step precedes the fence: it orders the block's conv-state reads before the
    // count.
    __threadfence();
    arrived = atomicAdd(kh_counter, 1);
  }
  // l2 norms (eps inside the square root of the sum), q also scaled by Dk^-1/2.
  const float q2 = block_sum(tid < Dk ? qs[tid] * qs[tid] : 0.0f, red);
  const float k2 = block_sum(tid < Dk ? ks[tid] * ks[tid] : 0.0f, red);
  // Dk^-1/2 correctly rounded (double, as the CPU reference): the same value whether Dk is a runtime value or the
  // lean form's constant, which the compiler folds exactly; rsqrtf's hardware approximation at run time differed
  // from its folded constant in the last bit, and the lean kernel's outputs with it (measured on the H200).
  const float qscale = rsqrtf(q2 + 1e-6f) * static_cast<float>(1.0 / sqrt(double(Dk)));
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
  if (tid == 0) last_k = arrived == kh_blocks - 1;
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
    if (tid == 0) {
      *kh_counter = 0;
      if (also_reset != nullptr) *also_reset = 0;
    }
  }
}

}  // namespace fern::cuda::gdn
