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
#include "cuda/kernels.h"
#include "cuda/launch.cuh"
#include "cuda/cuda_util.cuh"
#include "cuda/gdn_step_block.cuh"

namespace fern::cuda {
namespace {

constexpr int kThreads = kGdnThreads;
constexpr int kMaxKS = gdn_detail::kMaxKS;

// MAXKS: conv taps held in registers (4 for the model: the variant measured on the H200; 8 for longer kernels).
template <int MAXKS>
__global__ void __launch_bounds__(kGdnThreads, 1) gdn_kernel(GdnShape sh, const float* mixed, const float* bgate,
                                                          const float* agate, const float* __restrict__ conv_w,
                                                          const float* __restrict__ A_log,
                                                          const float* __restrict__ dt_bias, float* conv_state,
                                                          float* state, float* y, int* counters, int early_state) {
  gdn_step_block<MAXKS>(sh, mixed, bgate, agate, conv_w, A_log, dt_bias, conv_state, state, y, counters, early_state);
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
  const float* zr = z + hd * Dv;
  float o[kMaxDvPerLane], zv[kMaxDvPerLane];
  float ss = 0.0f;
#pragma unroll
  for (int m = 0; m < kMaxDvPerLane; ++m) {
    const int c = lane + 32 * m;
    o[m] = c < Dv ? yr[c] : 0.0f;
    zv[m] = c < Dv ? zr[c] : 0.0f;
    ss = fmaf(o[m], o[m], ss);
  }
  const float inv = rsqrtf(warp_sum(ss) / float(Dv) + sh.eps);
#pragma unroll
  for (int m = 0; m < kMaxDvPerLane; ++m) {
    const int c = lane + 32 * m;
    if (c < Dv) yr[c] = o[m] * inv * __ldg(norm_w + c) * silu(zv[m]);
  }
}

}  // namespace

bool gdn_step_ok(const GdnShape& sh) { return gdn_block_shape_ok(sh); }

void gdn_step_raw(const Ctx& c, const GdnShape& sh, int t, const float* mixed, const float* b, const float* a,
                  const float* conv_w, const float* A_log, const float* dt_bias, float* conv_state, float* state,
                  float* y, bool early_state) {
  FERN_CU_CHECK(gdn_step_ok(sh), "gdn: unsupported head shape");
  const int64_t vd = int64_t(sh.Hv) * sh.Dv;
  dim3 grid(sh.Hv, sh.Dv / gdn_detail::kCols);
  launch(c, "gdn_kernel", sh.kernel <= 4 ? gdn_kernel<4> : gdn_kernel<kMaxKS>, grid, kThreads, 0, sh,
         mixed + int64_t(t) * sh.conv_dim, b + int64_t(t) * sh.Hv, a + int64_t(t) * sh.Hv, conv_w, A_log, dt_bias,
         conv_state, state, y + t * vd, c.counters, early_state && t == 0 ? 1 : 0);
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
