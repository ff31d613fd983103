// Multi-row linear (prefill): y[t] = x[t] W^T for a block of token rows at once on the tensor cores, so that each
// weight tile is read once per 64 token rows instead of once per row (the GEMV in linear.cu re-reads the whole
// matrix for every row). docs/notes/cuda-prefill-v1.md has the measurements. The tile loop (x split into bf16 hi
// and lo halves, weight codes staged as exact bf16, scale and bias applied per group to fp32 partial sums) is
// gemm_tile.cuh, shared with the grouped expert GEMMs of moe_prefill.cu; here a block computes 64 token rows x 128
// weight rows (8 warps as 2 x 4, 32 x 32 outputs each).
// The fp16 paths (4/8-bit weights, when the context carries a workspace: Ctx::gemm_ws; the backend gives one for
// FERN_GEMM=fp16|fp16x2) convert x once to fp16 rows (gemm_f16.h) and run the pipelined tile loop of
// gemm_tile_f16.cuh: fp16 (weights dequantized to fp16, 128 token rows per block from kTallRows rows up) or, with
// Ctx::gemm_precise, fp16x2 (hi + lo rows, exact codes; 64-row tiles). docs/notes/cuda-prefill-v3-gemm.md.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdlib>

#include "core/env.h"
#include "cuda/kernels.h"
#include "cuda/launch.cuh"
#include "cuda/cuda_util.cuh"
#include "cuda/gemm_f16.h"
#include "cuda/gemm_wg.h"
#include "cuda/gemm_tile.cuh"
#include "cuda/gemm_tile_f16.cuh"

namespace fern::cuda {
namespace {

using Tile = gemm::Layout<2, 2, 4>;  // 64 token rows per block
constexpr int kBM = Tile::kBM;
constexpr int kBN = gemm::kBN;
constexpr int kBK = gemm::kBK;
constexpr int kGemmThreads = gemm::kThreads;

template <int BITS>
__global__ void __launch_bounds__(kGemmThreads) gemm_kernel(QW W, const float* __restrict__ x, float* __restrict__ y,
                                                            int T) {
  __shared__ __align__(16) gemm::Smem<kBM> sm;
  const int K = static_cast<int>(W.in);
  const int N = static_cast<int>(W.out);
  const int t0 = blockIdx.x * kBM;
  const int n0 = blockIdx.y * kBN;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, c = lane & 3;

  pdl_wait();
  pdl_trigger();

  // This thread's staging rows (gemm::mainloop): x row tid / 4, weight row tid / 2.
  const int xr = tid >> 2, wr = tid >> 1;
  const float* xrow = xr < kBM && t0 + xr < T ? x + int64_t(t0 + xr) * K : nullptr;
  const gemm::RowSrc wsrc = n0 + wr < N ? gemm::row_src<BITS>(W, 0, n0 + wr) : gemm::RowSrc{};

  float acc[2][4][4] = {};
  gemm::mainloop<BITS, 2, 2, 4>(sm, K, BITS == 16 ? kBK : W.gs, xrow, wsrc, acc);

  const int wm = Tile::row0(warp), wn = Tile::col0(warp);
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

// The fp16 paths: BM token rows (Layout<WM, MT, NT>) x 128 weight rows per block, S pipeline stages; P the precise
// form (gemm_f16.h).
template <int BITS, int WM, int MT, int NT, int S, bool P>
__global__ void __launch_bounds__(kGemmThreads, 2) gemm16_kernel(QW W, X16 x, float* __restrict__ y, int T) {
  using L = gemm::Layout<WM, MT, NT>;
  constexpr int BM = L::kBM;
  extern __shared__ __align__(16) unsigned char gemm16_smem[];
  auto& sm = *reinterpret_cast<gemm16::Smem<BM, BITS, S, P>*>(gemm16_smem);
  const int K = static_cast<int>(W.in);
  const int N = static_cast<int>(W.out);
  const int t0 = blockIdx.x * BM;
  const int n0 = blockIdx.y * kBN;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, c = lane & 3;

  pdl_wait();
  pdl_trigger();

  const int wr = tid >> 1;
  const gemm::RowSrc wsrc = n0 + wr < N ? gemm::row_src<BITS>(W, 0, n0 + wr) : gemm::RowSrc{};
  float acc[MT][NT][4] = {};
  gemm16::mainloop<BITS, WM, MT, NT, S, P>(
      sm, K, W.gs, reinterpret_cast<const __half*>(x.x), [&](int r) { return t0 + r < T ? t0 + r : -1; }, wsrc, acc,
      reinterpret_cast<const __half*>(x.lo), x.sums, static_cast<int>(x.ks));

  const int wm = L::row0(warp), wn = L::col0(warp);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int t = t0 + wm + mt * 16 + g + 8 * h;
      if (t >= T) continue;
      const float f = x.scale[t];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int n = n0 + wn + nt * 8 + 2 * c;
        float* dst = y + int64_t(t) * N + n;
        if (n + 1 < N && (N & 1) == 0) {  // 8-byte aligned pair
          *reinterpret_cast<float2*>(dst) = make_float2(f * acc[mt][nt][2 * h], f * acc[mt][nt][2 * h + 1]);
        } else {
          if (n < N) dst[0] = f * acc[mt][nt][2 * h];
          if (n + 1 < N) dst[1] = f * acc[mt][nt][2 * h + 1];
        }
      }
    }
  }
}

// From this many token rows the fp16 path uses 128-row tiles (each weight tile staged once per 128 rows); below,
// 64-row tiles keep more blocks for the SMs.
constexpr int kTallRows = 1024;

template <int BITS, int WM, int MT, int NT, int S, bool P = false>
void launch16(const Ctx& c, const QW& w, const X16& x, float* y, int T) {
  constexpr int BM = 16 * WM * MT;
  constexpr size_t smem = gemm16::kSmemBytes<BM, BITS, S, P>;
  auto kernel = gemm16_kernel<BITS, WM, MT, NT, S, P>;
  allow_dynamic_smem<gemm16_kernel<BITS, WM, MT, NT, S, P>>(smem);
  const dim3 grid((T + BM - 1) / BM, static_cast<unsigned>((w.out + kBN - 1) / kBN));
  launch(c, "gemm16_kernel", kernel, grid, kGemmThreads, smem, w, x, y, T);
}

template <int BITS>
void gemm16_bits(const Ctx& c, const QW& w, const X16& x, float* y, int T) {
  if (x.lo != nullptr) {
    // Precise: lo rows, sums and a second set of accumulators: 64-row tiles, 3 stages (2 blocks per SM).
    launch16<BITS, 2, 2, 4, 3, true>(c, w, x, y, T);
    return;
  }
  constexpr int S = BITS == 4 ? 4 : 3;  // 8-bit code rows are twice as long: 3 stages keep 2 blocks per SM
  // FERN_GEMM_TILE=64|128 forces a tile height (for the micro-benchmark's comparison).
  const int forced = env_choice("FERN_GEMM_TILE", {"64", "128"}, -1);
  const int bm = forced >= 0 ? (forced == 0 ? 64 : 128) : T >= kTallRows ? 128 : 64;
  if (bm == 128)
    launch16<BITS, 2, 4, 4, S>(c, w, x, y, T);
  else
    launch16<BITS, 2, 2, 4, S>(c, w, x, y, T);
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

namespace {

// Whether the wgmma loop takes w with this context: the loop, and a workspace for T rows of x in its layout.
bool wg_path(const Ctx& c, const QW& w, int T) {
  return c.gemm_wg && linear_gemm_wg_ok(w) && c.gemm_ws != nullptr && c.gemm_ws_bytes >= xbf_bytes(T, w.in);
}

// Whether the wgmma loop runs w on the exact-code loop's rows (the pipe and the format take it), else on plain bf16
// hi/lo rows.
bool takes_q4_rows(const QW& w) { return gemm_pipe_q4(gemm_wg_pipe()) && gemm_q4_ok(w); }

// T rows of width K in the context's workspace: the exact-code loop's (q4, in the pipe's form) or plain.
X16 workspace_rows(const Ctx& c, int T, int64_t K, bool q4) {
  const WgPipe pipe = gemm_wg_pipe();
  return xbf_carve(c.gemm_ws, T, K, q4, pipe == WgPipe::Q4h, pipe == WgPipe::Q4b);
}

// x converted once into the workspace (the exact-code loop's rows where the pipe and format take it, else bf16
// hi/lo rows), then one launch of the wgmma loop over the n matrices (one width and format).
void wg_convert_and_launch(const Ctx& c, const QW* ws, const float* x, float* const* ys, int n, int T) {
  const bool q4 = takes_q4_rows(ws[0]);
  const X16 xs = workspace_rows(c, T, ws[0].in, q4);
  (q4 ? to_xbf_q4 : to_xbf)(c, x, T, ws[0].in, xs);
  linear_gemm_wg_multi(c, ws, ys, n, xs, T);
}

}  // namespace

void linear_gemm(const Ctx& c, const QW& w, const float* x, float* y, int T) {
  FERN_CU_CHECK(linear_gemm_ok(w), "linear_gemm: unsupported weight shape or format");
  if (T <= 0) return;
  const int64_t nb = (w.out + kBN - 1) / kBN;
  FERN_CU_CHECK(nb <= 65535, "linear_gemm: too many output rows");
  if (wg_path(c, w, T)) {
    wg_convert_and_launch(c, &w, x, &y, 1, T);
    return;
  }
  if (!c.gemm_wg && gemm_f16_format_ok(w) && c.gemm_ws != nullptr &&
      c.gemm_ws_bytes >= x16_bytes(T, w.in, c.gemm_precise)) {
    const X16 xs = x16_carve(c.gemm_ws, T, w.in, c.gemm_precise);
    to_x16(c, x, T, w.in, xs);
    if (w.bits == 4)
      gemm16_bits<4>(c, w, xs, y, T);
    else
      gemm16_bits<8>(c, w, xs, y, T);
    return;
  }
  dim3 grid((T + kBM - 1) / kBM, static_cast<unsigned>(nb));
  switch (w.bits) {
    case 4: launch(c, "gemm_kernel", gemm_kernel<4>, grid, kGemmThreads, 0, w, x, y, T); break;
    case 8: launch(c, "gemm_kernel", gemm_kernel<8>, grid, kGemmThreads, 0, w, x, y, T); break;
    default: launch(c, "gemm_kernel", gemm_kernel<16>, grid, kGemmThreads, 0, w, x, y, T); break;
  }
}

namespace {
// Whether one launch of the wgmma loop takes all n matrices (one width and format, each on that loop).
bool wg_multi_ok(const Ctx& c, const QW* ws, int n, int T) {
  if (n < 1 || T < kGemmMinRows) return false;
  for (int i = 0; i < n; ++i)
    if (!linear_gemm_ok(ws[i]) || !wg_path(c, ws[i], T) || ws[i].bits != ws[0].bits || ws[i].in != ws[0].in ||
        ws[i].gs != ws[0].gs)
      return false;
  return true;
}
}  // namespace

bool linear_gemm_multi(const Ctx& c, const QW* ws, const float* x, float* const* ys, int n, int T) {
  if (!wg_multi_ok(c, ws, n, T)) return false;
  wg_convert_and_launch(c, ws, x, ys, n, T);
  return true;
}

bool linear_gemm_takes_plain_rows(const QW& w, int T) {
  // with_gemm_ws's workspace for the wgmma loop (gemm_mode() is Wg only where that loop runs), linear()'s GEMM, and
  // wg_convert_and_launch's plain rows.
  return gemm_mode() == GemmMode::Wg && linear_gemm_wins(w, T) && gemm_f16_format_ok(w) && linear_gemm_wg_ok(w) &&
         !takes_q4_rows(w);
}

namespace {
// One launch of the wgmma loop over the n matrices on exact-code rows that fill(rows) writes into the workspace (a
// norm's own pass instead of to_xbf_q4); false, nothing launched, where that loop does not take the matrices.
template <class Fill>
bool launch_on_filled_rows(const Ctx& c, const QW* ws, float* const* ys, int n, int T, Fill fill) {
  if (!wg_multi_ok(c, ws, n, T) || !takes_q4_rows(ws[0])) return false;
  const X16 xs = workspace_rows(c, T, ws[0].in, true);
  fill(xs);
  linear_gemm_wg_multi(c, ws, ys, n, xs, T);
  return true;
}
}  // namespace

bool linear_gemm_multi_norm(const Ctx& c, const QW* ws, const float* x, const float* norm_w, float eps,
                            float* const* ys, int n, int T) {
  return n >= 1 && rmsnorm_xbf_q4_ok(ws[0].in) && aligned16(x) && aligned16(norm_w) &&
         launch_on_filled_rows(c, ws, ys, n, T, [&](const X16& xs) {
           rmsnorm_xbf_q4(c, x, nullptr, nullptr, norm_w, eps, nullptr, T, ws[0].in, xs);
         });
}

bool linear_gemm_gated_norm(const Ctx& c, const QW& w, const float* y, const float* z, const float* norm_w, float eps,
                            int Hv, int Dv, float* out, int T) {
  return gated_norm_xbf_q4_ok(Hv, Dv) && w.in == int64_t(Hv) * Dv &&
         launch_on_filled_rows(c, &w, &out, 1, T, [&](const X16& xs) {
           gated_norm_xbf_q4(c, y, z, norm_w, eps, Hv, Dv, T, xs);
         });
}

}  // namespace fern::cuda
