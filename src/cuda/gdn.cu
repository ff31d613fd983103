// Gated DeltaNet step for one token row (MODEL.md 2.4 steps 3-8), fused into one launch; the gated RMSNorm of
// step 9 is left to the consumer (the out_proj GEMV stages it, linear.cu linear_gated_norm) or to
// gdn_gated_norm_kernel below (gdn_step).
// Grid (Hv value heads, Dv/32 column blocks) of 256-thread blocks, each running gdn_step.cuh's step_block on its
// head and columns (that header says how the work is split and why).
// Inputs written by an earlier kernel are plain `const T*`, never `const T* __restrict__`: under PDL that kernel
// may still be running while this one is resident, and const + restrict would allow the non-coherent load path
// and its scheduling ahead of griddepcontrol.wait (qdot.cuh stage_x, docs/notes/cuda-decode-v6.md). Weights
// and the position counter (written only by advance_kernel, the last launch of a step) may stay restrict.
#include "core/env.h"
#include "cuda/fast_div.h"
#include "cuda/gdn_step.cuh"
#include "cuda/kernels.h"
#include "cuda/launch.cuh"
#include "cuda/cuda_util.cuh"

namespace fern::cuda {
namespace {

using gdn::kCols;
using gdn::kLeanDv;
using gdn::kMaxDk;
using gdn::kMaxKS;
using gdn::kSlices;
using gdn::kThreads;

// The step's inputs as the projection kernel before this one left them: read after the PDL wait.
struct PdlInputs {
  const float* mixed;
  const float* bgate;
  const float* agate;
  __device__ __forceinline__ void wait() const {
    pdl_wait();
    pdl_trigger();
  }
  __device__ __forceinline__ float mixed_at(int ch) const { return mixed[ch]; }
  __device__ __forceinline__ void gates(int h, float& bg, float& ag) const {
    bg = bgate[h];
    ag = agate[h];
  }
};

// MAXKS, LEAN: step_block's. The recurrent and conv states of this layer were last written by this layer's kernel
// of the previous token. When that is at least two launches back (early_state: the first row of a call), they are
// complete before this kernel starts: every kernel calls pdl_trigger() only after its own pdl_wait(), so when
// kernel N starts, kernel N-2 has finished. Everything that does not come from the previous kernel is requested
// before the PDL wait: the conv taps, A_log and dt_bias (weights), and with early_state the recurrent and conv
// state; after the wait, the inputs (mixed, b, a) are requested together in one round (version 3 waited for the
// conv loads, then the gates after two block reductions: dependent round trips more).
template <int MAXKS, bool LEAN>
__global__ void __launch_bounds__(kThreads, 1) gdn_kernel(GdnShape sh, const float* mixed, const float* bgate,
                                                       const float* agate,
                                                       const float* __restrict__ conv_w,
                                                       const float* __restrict__ A_log,
                                                       const float* __restrict__ dt_bias, float* conv_state,
                                                       float* state, float* y, int* counters, int early_state,
                                                       FastDiv per_kh) {
  const int h = blockIdx.x;
  // The key head of value head h: h / (Hv / Hk) by FastDiv, since the conv taps' loads ahead of the PDL wait depend
  // on it (two runtime divisions, ~40 instructions, before them otherwise: docs/notes/cuda-decode-v23-probes.md).
  const int kh = per_kh.div(h);
  PdlInputs in{mixed, bgate, agate};
  gdn::step_block<MAXKS, LEAN>(sh, h, blockIdx.y, kh, int(gridDim.y) * int(per_kh.d), in, conv_w, A_log, dt_bias,
                               conv_state, state, y, counters + kh, early_state != 0);
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
