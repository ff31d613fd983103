// Gated DeltaNet step for one token row (MODEL.md 2.4 steps 3-8), fused into one launch; the gated RMSNorm of
// step 9 is left to the consumer (the out_proj GEMV stages it, linear.cu linear_gated_norm) or to
// gdn_gated_norm_kernel below (gdn_step).
// Grid (Hv value heads, Dv/32 column blocks); 256 threads = 32 state columns x 8 slices of the key dimension.
// Each block recomputes the causal conv + SiLU for the q/k channels of its key head and the v channels of its
// columns (cheap: 2*Dk + 32 channels), the l2 norms and the gates, then runs the delta rule on its 32 columns of
// the fp32 state, which stay in registers between the decay, the read-out m = S^T k, the rank-1 update and the
// read-out o = S^T q (each state element is read once and written once: the state is 60 MiB per token and
// dominates this kernel's time).
// The conv state is shifted from registers, without reloading anything: each block's v channels are read by that
// block alone, so it writes them itself; the q/k channels of a key head are read by all its blocks, so the last
// of them to have consumed its conv inputs writes them ("last block" counter per key head). That counter's fence
// and atomic come right after the conv, before any state store, so the fence waits for no store and the kernel's
// tail is stores only (version 7 kept a per-value-head counter after the state stores, with the fence waiting
// for them, and the head's last block re-read, normalised and rewrote its 128 outputs: a chain of L2 round trips
// at the end of every block that the next kernel waited for).
// Inputs written by an earlier kernel are plain `const T*`, never `const T* __restrict__`: under PDL that kernel
// may still be running while this one is resident, and const + restrict would allow the non-coherent load path
// and its scheduling ahead of griddepcontrol.wait (qdot.cuh stage_x, docs/notes/cuda-decode-v6.md). Weights
// and the position counter (written only by advance_kernel, the last launch of a step) may stay restrict.
#include "core/env.h"
#include "cuda/fast_div.h"
#include "cuda/kernels.h"
#include "cuda/launch.cuh"
#include "cuda/cuda_util.cuh"

namespace fern::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kCols = 32;
constexpr int kSlices = kThreads / kCols;
constexpr int kMaxDk = 128;
constexpr int kMaxRows = kMaxDk / kSlices;
constexpr int kMaxKS = 8;    // conv taps supported (the model's kernel is 4; the tests also use 2 and 7)
constexpr int kConvPer = 2;  // conv channels per thread: 2 * Dk + kCols <= 2 * kThreads
constexpr int kLeanDv = 128;  // the real model's value head width (gdn_kernel's LEAN form)

__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// MAXKS: conv taps held in registers (4 for the model: the variant measured on the H200; 8 for longer kernels).
// LEAN: the real model's shape fixed at compile time (Dk = Dv = 128, MAXKS taps, the state requested before the PDL
// wait: gdn_lean), so that the bound checks and the second copy of the state loads are not compiled (28,672 ->
// 15,744 bytes of code; a decode launch pays for its code, docs/notes/cuda-decode-v27-poll-lean.md).
template <int MAXKS, bool LEAN>
__global__ void __launch_bounds__(kThreads, 1) gdn_kernel(GdnShape sh, const float* mixed, const float* bgate,
                                                       const float* agate,
                                                       const float* __restrict__ conv_w,
                                                       const float* __restrict__ A_log,
                                                       const float* __restrict__ dt_bias, float* conv_state,
                                                       float* state, float* y, int* counters, int early_state,
                                                       FastDiv per_kh) {
  // The recurrent and conv states of this layer were last written by this layer's kernel of the previous token.
  // When that is at least two launches back (early_state: the first row of a call), they are complete before this
  // kernel starts: every kernel calls pdl_trigger() only after its own pdl_wait(), so when kernel N starts, kernel
  // N-2 has finished. Everything that does not come from the previous kernel is requested before the PDL wait: the
  // conv taps, A_log and dt_bias (weights), and with early_state the recurrent and conv state; after the wait, the
  // inputs (mixed, b, a) are requested together in one round (version 3 waited for the conv loads, then the gates
  // after two block reductions: dependent round trips more).
  const int jj = threadIdx.x % kCols, sl = threadIdx.x / kCols;
  const int j = blockIdx.y * kCols + jj;
  const int Dk = LEAN ? kMaxDk : sh.Dk, Dv = LEAN ? kLeanDv : sh.Dv, KS = LEAN ? MAXKS : sh.kernel;
  const int C = sh.conv_dim;
  const bool early = LEAN || early_state;
  const int R = Dk / kSlices;
  float* S = state + int64_t(blockIdx.x) * Dk * Dv;
  const int h = blockIdx.x, cb = blockIdx.y;
  // The key head of value head h: h / (Hv / Hk) by FastDiv, since the conv taps' loads ahead of the PDL wait depend
  // on it (two runtime divisions, ~40 instructions, before them otherwise: docs/notes/cuda-decode-v23-probes.md).
  const int kh = per_kh.div(h);
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
  pdl_wait();
  pdl_trigger();
  if (!early) {
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
  // Dk^-1/2 correctly rounded (double, as the CPU reference): the same value whether Dk is a runtime value or the
  // lean kernel's constant, which the compiler folds exactly; rsqrtf's hardware approximation at run time differed
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
  if (tid == 0) last_k = arrived == int(gridDim.y) * int(per_kh.d) - 1;
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

// Step 9 on its own: y = rmsnorm(y) * norm_w * silu(z) per value head, in place; one warp per (row, value head).
constexpr int kNormWarps = 8;
constexpr int kMaxDvPerLane = kThreads / 32;  // Dv <= 256

__global__ void __launch_bounds__(kNormWarps * 32) gdn_gated_norm_kernel(GdnShape sh, int64_t heads, const float* z,
                                                                         const float* __restrict__ norm_w,
                                                                         float* y) {
  pdl_wait();
  pdl_trigger();
  const int64_t hd = int64_t(blockIdx.x) * kNormWarps + threadIdx.x / 32;
  if (hd >= heads) return;  // whole warps
  const int lane = threadIdx.x & 31, Dv = sh.Dv;
  float* yr = y + hd * Dv;
  float o[kMaxDvPerLane];
  gated_norm_head(yr, z + hd * Dv, norm_w, Dv, sh.eps, lane, o);
#pragma unroll
  for (int m = 0; m < kMaxDvPerLane; ++m) {
    const int c = lane + 32 * m;
    if (c < Dv) yr[c] = o[m];
  }
}

}  // namespace

bool gdn_step_ok(const GdnShape& sh) {
  return sh.Dk % kSlices == 0 && sh.Dk > 0 && sh.Dk <= kMaxDk && sh.Dv % kCols == 0 && sh.Dv > 0 &&
         sh.Dv <= kThreads && sh.Hk > 0 && sh.Hv % sh.Hk == 0 && sh.kernel >= 2 && sh.kernel <= kMaxKS &&
         sh.conv_dim == 2 * sh.Hk * sh.Dk + sh.Hv * sh.Dv;
}

// The lean kernel where the shape is the real model's and the state may be requested before the PDL wait
// (FERN_CUDA_GDN_LEAN=1, the default; 0 keeps the generic kernel, for comparisons). Read at every call. Measured on
// the H200 (docs/notes/cuda-decode-v28-lean-regs.md): 4.61 -> 3.78 us per launch, 640.1 -> 652.2 tok/s at 4K,
// 459.7 -> 466.8 at 128K.
bool gdn_lean(const GdnShape& sh, bool early) {
  return early && sh.Dk == kMaxDk && sh.Dv == kLeanDv && sh.kernel == 4 &&
         env_choice("FERN_CUDA_GDN_LEAN", {"0", "1"}, 1) == 1;
}

void gdn_step_raw(const Ctx& c, const GdnShape& sh, int t, const float* mixed, const float* b, const float* a,
                  const float* conv_w, const float* A_log, const float* dt_bias, float* conv_state, float* state,
                  float* y, bool early_state) {
  FERN_CU_CHECK(gdn_step_ok(sh), "gdn: unsupported head shape");
  const int64_t vd = int64_t(sh.Hv) * sh.Dv;
  dim3 grid(sh.Hv, sh.Dv / kCols);
  const bool early = early_state && t == 0;
  launch(c, "gdn_kernel",
         gdn_lean(sh, early) ? gdn_kernel<4, true> : sh.kernel <= 4 ? gdn_kernel<4, false> : gdn_kernel<kMaxKS, false>,
         grid, kThreads, 0, sh,
         mixed + int64_t(t) * sh.conv_dim, b + int64_t(t) * sh.Hv, a + int64_t(t) * sh.Hv, conv_w, A_log, dt_bias,
         conv_state, state, y + t * vd, c.counters, early ? 1 : 0, FastDiv(sh.Hv / sh.Hk));
  FERN_CUDA_LAUNCH_CHECK("gdn_kernel");
}

void gdn_gated_norm(const Ctx& c, const GdnShape& sh, int T, const float* z, const float* norm_w, float* y) {
  FERN_CU_CHECK(sh.Dv > 0 && sh.Dv <= 32 * kMaxDvPerLane && sh.Hv > 0, "gdn_gated_norm: unsupported head width");
  if (T <= 0) return;
  const int64_t heads = int64_t(T) * sh.Hv;
  launch(c, "gdn_gated_norm_kernel", gdn_gated_norm_kernel, dim3(unsigned((heads + kNormWarps - 1) / kNormWarps)),
         kNormWarps * 32, 0, sh, heads, z, norm_w, y);
  FERN_CUDA_LAUNCH_CHECK("gdn_gated_norm_kernel");
}

void gdn_step(const Ctx& c, const GdnShape& sh, int t, const float* mixed, const float* z, const float* b,
              const float* a, const float* conv_w, const float* A_log, const float* dt_bias, const float* norm_w,
              float* conv_state, float* state, float* y, bool early_state) {
  gdn_step_raw(c, sh, t, mixed, b, a, conv_w, A_log, dt_bias, conv_state, state, y, early_state);
  const int64_t vd = int64_t(sh.Hv) * sh.Dv;
  gdn_gated_norm(c, sh, 1, z + t * vd, norm_w, y + t * vd);
}

}  // namespace fern::cuda
