// GEMV y = x W^T for affine 4/8-bit and bf16 weights, one launch for all T rows (decode: T = 1; prefill uses this
// simple path for now, re-reading the weights once per row).
// Work split: `LPR` lanes cooperate on one row, each lane taking every LPR-th 16-byte chunk, two chunks per row
// and RPI = 2 rows at a time (a "step": 4 independent 16-byte loads per lane). Warps walk their row groups as a
// software pipeline: the next step's loads are issued before this step's arithmetic, the first step's before
// waiting on the previous kernel (PDL).
// LPR is chosen so that a row's chunks fill the lanes (K = 2048 4-bit: 64 chunks, LPR = 32; K = 512: 16 chunks,
// LPR = 8, 4 rows per warp). The activation row is staged in shared memory once per block (qdot.cuh).
#include "cuda/kernels.h"
#include "cuda/launch.cuh"
#include "cuda/qdot.cuh"

namespace fern::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kRPI = 2;

// The chunks one lane handles in one pipeline step: 2 chunks of each of kRPI rows, with their scales/biases.
struct StepBuf {
  uint4 w[2][kRPI];
  float s[2][kRPI], b[2][kRPI];
};

template <int BITS, int LPR>
__global__ void __launch_bounds__(kThreads) linear_kernel(QW W, const float* __restrict__ x, float* __restrict__ y) {
  extern __shared__ float4 smem[];
  constexpr int E = ChunkTraits<BITS>::kElems;
  constexpr int RPW = (32 / LPR) * kRPI;  // rows per row group (one warp, one pass)
  const int t = blockIdx.y;
  const int K = static_cast<int>(W.in);
  const int CPR = K / E;
  const int nc = (CPR + 2 * LPR - 1) / (2 * LPR);  // pipeline steps per row group
  const int lane = threadIdx.x & 31;
  const int sub = lane % LPR, rslot = lane / LPR;
  const int64_t warps = int64_t(gridDim.x) * (kThreads / 32);
  const int64_t gw = int64_t(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  const int64_t ngroups = (W.out + RPW - 1) / RPW;
  // 32-bit step counters: a 64-bit division or modulo in the loop compiles to a subroutine call.
  const int S = static_cast<int>((gw < ngroups ? (ngroups - 1 - gw) / warps + 1 : 0) * nc);

  auto load_step = [&](int step, StepBuf& B) {
    const int64_t g = gw + int64_t(step / nc) * warps;
    const int ci = step % nc;
#pragma unroll
    for (int r = 0; r < kRPI; ++r) {
      const int64_t row = g * RPW + r * (32 / LPR) + rslot;
      const bool ok = row < W.out;
      const RowPtr rp = row_ptr<BITS>(W, 0, ok ? row : 0);
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int c = sub + (ci * 2 + u) * LPR;
        if (ok && c < CPR) {
          load_chunk<BITS>(rp, c, W.gs, B.w[u][r], B.s[u][r], B.b[u][r]);
        } else {
          B.w[u][r] = make_uint4(0, 0, 0, 0);
          B.s[u][r] = B.b[u][r] = 0.0f;
        }
      }
    }
  };

  // Weights do not depend on the previous kernel: the first step's loads are issued before waiting for it.
  StepBuf A, B;
  if (S > 0) load_step(0, A);
  pdl_wait();
  float4* xs = smem;
  float* xc = reinterpret_cast<float*>(smem + K / 4);
  stage_x<BITS>(x + int64_t(t) * K, K, xs, xc);
  pdl_trigger();

  float acc[kRPI] = {};
  // One pipeline step: issue the next step's loads, then consume this step's registers.
  auto step = [&](int s, const StepBuf& cur, StepBuf& nxt) {
    if (s + 1 < S) load_step(s + 1, nxt);
    const int ci = s % nc;
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int c = sub + (ci * 2 + u) * LPR;
      if (c < CPR) {
        float d[kRPI];
        chunk_dot<BITS, kRPI>(cur.w[u], xs, c, d);
#pragma unroll
        for (int r = 0; r < kRPI; ++r) acc[r] += apply_group<BITS>(d[r], cur.s[u][r], cur.b[u][r], xc, c);
      }
    }
    if (ci == nc - 1) {
      const int64_t g = gw + int64_t(s / nc) * warps;
#pragma unroll
      for (int r = 0; r < kRPI; ++r) {
        float v = acc[r];
#pragma unroll
        for (int o = LPR / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        const int64_t row = g * RPW + r * (32 / LPR) + rslot;
        if (sub == 0 && row < W.out) y[int64_t(t) * W.out + row] = v;
        acc[r] = 0.0f;
      }
    }
  };
  for (int s = 0; s < S; s += 2) {
    step(s, A, B);
    if (s + 1 < S) step(s + 1, B, A);
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
  // At most two blocks per SM: every block is resident in the first wave (so the next kernel can launch early
  // under PDL) and each warp walks several row groups, overlapping the next group's loads with this one's math.
  const int blocks = static_cast<int>(std::min<int64_t>(need, int64_t(c.sms) * 2));
  dim3 grid(blocks, T);
  switch (lpr) {
    case 32: launch(c, "linear_kernel", linear_kernel<BITS, 32>, grid, kThreads, smem, w, x, y); break;
    case 16: launch(c, "linear_kernel", linear_kernel<BITS, 16>, grid, kThreads, smem, w, x, y); break;
    case 8: launch(c, "linear_kernel", linear_kernel<BITS, 8>, grid, kThreads, smem, w, x, y); break;
    default: launch(c, "linear_kernel", linear_kernel<BITS, 4>, grid, kThreads, smem, w, x, y); break;
  }
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
