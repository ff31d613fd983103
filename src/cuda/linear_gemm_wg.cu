// Dense prefill linear on the wgmma tile loop (gemm_tile_wg.cuh, or its warp-specialized form gemm_tile_ws.cuh):
// y[t] = x[t] W^T for 4/8-bit affine weights, a block computing 128 weight rows x NTOK token rows (NTOK = 128 where
// that still gives two waves of blocks, else 64). One launch may take up to kWgMats matrices of one input (a layer's
// projections: WgMats), each starting on a weight block of its own, so small ones (the GDN b and a projections, 32
// rows) ride along with the large ones instead of taking a launch and a conversion of x each. The accumulator holds
// the transposed tile (weight rows x tokens), so each thread writes single floats: for a fixed token the 8 lanes of
// a quad column write 8 consecutive outputs (32-byte segments).
#include <cuda_bf16.h>

#include "cuda/cuda_util.cuh"
#include "cuda/gemm_loop_wg.cuh"
#include "cuda/gemm_wg.h"
#include "cuda/launch.cuh"

namespace fern::cuda {
namespace {

using wgtile::kBW;

// Matrices of one width and format in one launch: matrix m owns weight blocks first[m] .. first[m + 1] - 1; the
// entries past the last matrix hold the total, first[kWgMats] (so no count is needed).
constexpr int kWgMats = 4;
struct WgMats {
  QW w[kWgMats];
  float* y[kWgMats];
  int first[kWgMats + 1];
};
// The matrix of weight block b (b < first[kWgMats]).
__device__ __forceinline__ int mat_of(const WgMats& M, int b) {
  int m = 0;
#pragma unroll
  for (int i = 1; i < kWgMats; ++i) m += b >= M.first[i] ? 1 : 0;
  return m;
}

// Block (x, y) computes weight blocks x * ncb .. x * ncb + ncb - 1 of token tile y, one after the other through one
// ring (wgloop::run_items; ncb = 1 for the loops other than the exact-code one): see launch_wg.
template <int BITS, int NTOK, int S, int P>
__global__ void __launch_bounds__(wgloop::kThreads<P>, 1)
    gemm_wg_kernel(const __grid_constant__ WgMats M, X16 x, int T, int ncb) {
  extern __shared__ unsigned char gemm_wg_smem[];
  const int K = static_cast<int>(M.w[0].in);
  const int NB = M.first[kWgMats];  // weight blocks of all the matrices
  // Weight blocks vary fastest: the blocks resident at one time share a few token tiles (whose bf16 hi/lo rows
  // stay in L2) and walk the whole weight, which stays in L2 as well; token tiles fastest made every wave touch all
  // of x (32 MB at 4,096 rows of width 2,048), which L2 does not hold next to the weights.
  const int b0 = blockIdx.x * ncb;  // first weight block of this block
  const int n_items = min(ncb, NB - b0);
  const int t0 = blockIdx.y * NTOK;
  const int tid = threadIdx.x;

  pdl_wait();
  pdl_trigger();
  if (n_items <= 0) return;

  auto src_at = [&](int item, int r) {  // weight-tile row r of item `item`
    const int b = b0 + item, m = mat_of(M, b);
    const int row = (b - M.first[m]) * kBW + r;
    return row < M.w[m].out ? gemm::row_src<BITS>(M.w[m], 0, row) : gemm::RowSrc{};
  };
  // acc[4 j + i]: weight row 64 wg + 16 warp + lane / 4 + 8 (i / 2), token 8 j + 2 (lane % 4) + i % 2.
  const int lane = tid & 31;
  // The token rows' addresses are the same for every item; opaque() keeps the compiler from holding them in registers
  // across the main loop.
  auto epilogue = [&](int item, const float (&acc)[NTOK / 2]) {
    const int b = b0 + item, mi = mat_of(M, b);
    const int N = static_cast<int>(M.w[mi].out);
    float* __restrict__ y = M.y[mi];
    const int m = (b - M.first[mi]) * kBW + 64 * (tid >> 7) + 16 * ((tid >> 5) & 3) + (lane >> 2);
    const int tr = opaque(t0);
#pragma unroll
    for (int j = 0; j < NTOK / 8; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int t = tr + 8 * j + 2 * (lane & 3) + (i & 1);
        const int n = m + 8 * (i >> 1);
        if (t < T && n < N) y[int64_t(t) * N + n] = acc[4 * j + i];
      }
    }
  };
  wgloop::run_items<BITS, NTOK, S, P>(gemm_wg_smem, K, M.w[0].gs, x,
                                      [&](int r) { return t0 + r < T ? t0 + r : -1; }, n_items, src_at, epilogue);
}

template <int BITS, int NTOK, int S, int P>
void launch_wg(const Ctx& c, const WgMats& w, const X16& x, int T) {
  constexpr size_t smem = wgloop::kSmemBytes<BITS, NTOK, S, P>;
  auto kernel = gemm_wg_kernel<BITS, NTOK, S, P>;
  allow_dynamic_smem<gemm_wg_kernel<BITS, NTOK, S, P>>(smem);
  // Weight blocks per block (exact-code loop only): up to 4, measured on the H200 at 4K and 32K tokens (docs/notes/
  // cuda-prefill-v8-items.md); FERN_GEMM_SEQ=N forces N.
  const int64_t wblocks = w.first[kWgMats], ttiles = (T + NTOK - 1) / NTOK;
  const int ncb = wgloop::is_q4(P) ? items_per_block("FERN_GEMM_SEQ", wblocks * ttiles, 4, c.sms) : 1;
  const dim3 grid(static_cast<unsigned>((wblocks + ncb - 1) / ncb), static_cast<unsigned>(ttiles));
  launch(c,
         wgloop::is_q4(P) ? "gemm_wg_kernel (exact codes)"
         : P == wgloop::kWs ? "gemm_wg_kernel (warp-specialized)"
                            : "gemm_wg_kernel",
         kernel, grid, wgloop::kThreads<P>, smem, w, x, T, ncb);
}

template <int BITS>
void wg_bits(const Ctx& c, const WgMats& w, const X16& x, int T) {
  // 128-token tiles halve the weight dequantization per token; below two waves of them, 64-token tiles keep the
  // SMs busy.
  const int64_t wblocks = w.first[kWgMats];
  const int64_t tall = (int64_t(T) + 127) / 128 * wblocks;
  if constexpr (BITS == 4) {
    if (x.q4) {  // the exact-code loop (to_xbf_q4 rows), one 384-thread block per SM
      wgloop::with_q4_loop(x, [&](auto p) {
        if (tall >= 2 * c.sms)
          launch_wg<4, 128, wgloop::kQ4Stages<128>, p()>(c, w, x, T);
        else
          launch_wg<4, 64, wgloop::kQ4Stages<64>, p()>(c, w, x, T);
      });
      return;
    }
  }
  if (gemm_wg_pipe() == WgPipe::Ws) {
    // One 512-thread block per SM; the deepest ring that fits (3 stages of 64 KB, 4 of 48 KB).
    if (tall >= 2 * c.sms)
      launch_wg<BITS, 128, 3, wgloop::kWs>(c, w, x, T);
    else
      launch_wg<BITS, 64, 4, wgloop::kWs>(c, w, x, T);
    return;
  }
  // The 64-token tiles in two stages (half the shared memory: two blocks per SM) once their grid exceeds the SMs:
  // measured on the H200 (docs/notes/cuda-prefill-v4-wg.md) out_proj 2048x4096 at 2,048 rows 0.465 -> 0.410 ms
  // (512 blocks), the 512x2048 expert-size matrix 0.076 -> 0.081 ms (128 blocks: one per SM anyway, and the
  // shallower pipeline costs).
  const int64_t short_blocks = (int64_t(T) + 63) / 64 * wblocks;
  const int st = gemm_wg_stages();
  if (tall >= 2 * c.sms)
    launch_wg<BITS, 128, 3, wgloop::kSync>(c, w, x, T);
  else if (st == 2 || (st == 0 && short_blocks > c.sms))
    launch_wg<BITS, 64, 2, wgloop::kSync>(c, w, x, T);
  else
    launch_wg<BITS, 64, 4, wgloop::kSync>(c, w, x, T);
}

}  // namespace

bool linear_gemm_wg_ok(const QW& w) {
  return w.experts == 0 && (w.bits == 4 || w.bits == 8) && w.in > 0 && w.in % wgtile::kBK == 0 && w.gs >= 16 &&
         w.gs % 16 == 0 && w.in % w.gs == 0 && w.out > 0 && w.out < (int64_t(1) << 31) && w.in < (int64_t(1) << 30);
}

void linear_gemm_wg_multi(const Ctx& c, const QW* ws, float* const* ys, int n, const X16& x, int T) {
  FERN_CU_CHECK(n >= 1 && n <= kWgMats, "linear_gemm_wg: 1 to 4 matrices");
  FERN_CU_CHECK((int64_t(T) + 63) / 64 <= 65535, "linear_gemm_wg: too many rows");
  WgMats M{};
  int64_t blocks = 0;
  for (int i = 0; i < n; ++i) {
    FERN_CU_CHECK(linear_gemm_wg_ok(ws[i]), "linear_gemm_wg: unsupported weight shape or format");
    FERN_CU_CHECK(!x.q4 || gemm_q4_ok(ws[i]), "linear_gemm_wg: exact-code rows for weights that loop does not take");
    FERN_CU_CHECK(ws[i].bits == ws[0].bits && ws[i].in == ws[0].in && ws[i].gs == ws[0].gs,
                  "linear_gemm_wg: matrices of one launch share bits, width and group size");
    M.w[i] = ws[i];
    M.y[i] = ys[i];
    M.first[i] = static_cast<int>(blocks);
    blocks += (ws[i].out + kBW - 1) / kBW;
  }
  FERN_CU_CHECK(blocks < (int64_t(1) << 24), "linear_gemm_wg: too many output rows");
  for (int i = n; i <= kWgMats; ++i) M.first[i] = static_cast<int>(blocks);
  if (T <= 0) return;
  if (ws[0].bits == 4)
    wg_bits<4>(c, M, x, T);
  else
    wg_bits<8>(c, M, x, T);
}

}  // namespace fern::cuda
