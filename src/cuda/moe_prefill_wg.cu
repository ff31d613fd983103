// The grouped expert GEMMs of the MoE prefill (moe_prefill.h) on the wgmma tile loop (gemm_tile_wg.cuh, sm_90a; by
// default its warp-specialized form, gemm_tile_ws.cuh):
// the tile map, work split and epilogues of moe_prefill_f16.cu, with the token tile (16, 32 or 64 rows of one
// expert's group: the adaptive tile height) as the wgmma N side and 128 weight rows per block as the A side. The
// inputs are bf16 hi/lo rows (gemm_wg.h: x once per chunk, h once per chunk after gate/up).
// Gate/up block: 64 intermediate columns. Warp slice s (16 weight rows: 4 per warpgroup) holds the gate rows of
// columns 8 s .. 8 s + 7 in its first 8 rows and the up rows of the same columns in its last 8, so that a thread's
// accumulator pairs (rows lane / 4 and lane / 4 + 8) are the gate and up values of one column: SiLU(g) u in place.
// Inputs written by earlier kernels (topk_w, sgate, the rows) are plain pointers, not const __restrict__: read-only
// non-coherent loads may be hoisted above the PDL wait (docs/notes/cuda-decode-v6.md).
#include <cuda_bf16.h>

#include <algorithm>
#include <type_traits>

#include "core/env.h"
#include "cuda/cuda_util.cuh"
#include "cuda/gemm_loop_wg.cuh"
#include "cuda/gemm_wg.h"
#include "cuda/launch.cuh"
#include "cuda/moe_prefill.h"
#include "cuda/moe_tile.cuh"

namespace fern::cuda {
namespace {

using wgtile::kBW;
constexpr int kGateUpCols = kBW / 2;  // intermediate columns per gate/up block

// Runs run(integral_constant<int, W>) with the token width W of the loop for a tile of `rows` rows: NTOK, or with
// `narrow` (FERN_MOE_NARROW=1, the default; 0 = the tile's full width: docs/notes/cuda-prefill-v18-narrow.md) and the
// exact-code loop at 96/128-row tiles, 32 or 64 where the tile's rows fit. A tile costs its full width in MMAs,
// promotions and x copies whatever it holds; with 128-row tiles at ~128-256 rows per expert (4K-32K prompts) about
// half the experts' last tiles hold a few rows. The branch is block-uniform and outside the loop (an MMA width
// chosen inside the K loop made ptxas serialize every wgmma of the kernel, C7520).
//
// A tile holding more than NTOK rows (a group's last tile in a map built with MoeGroups::extra, which the backend
// asks for only on the q4b loop at 128-row tiles) runs as one pass of NTOK + kMoeTailRows tokens: the codes' stream,
// the barriers and the unpacking are paid once for all its rows (docs/notes/cuda-prefill-v26-tail.md).
template <int NTOK, int P>
constexpr bool kTakesTail = P == wgloop::kQ4B && NTOK == 128;
template <int NTOK, int P>
constexpr int kMaxTileRows = kTakesTail<NTOK, P> ? NTOK + kMoeTailRows : NTOK;
template <int NTOK, int P, class Run>
__device__ __forceinline__ void by_width(bool narrow, int rows, Run run) {
  if constexpr (kTakesTail<NTOK, P>) {
    if (rows > NTOK) return run(std::integral_constant<int, NTOK + kMoeTailRows>{});
  }
  if constexpr (wgloop::is_q4(P) && NTOK > 64) {
    if (narrow && rows <= 32) return run(std::integral_constant<int, 32>{});
    if (narrow && rows <= 64) return run(std::integral_constant<int, 64>{});
  }
  run(std::integral_constant<int, NTOK>{});
}
// The ring depth of the loop at width W inside a kernel built for NTOK tokens and S stages (the narrower loops'
// deepest ring; it fits the kernel's shared memory: static_assert at the launch).
template <int W, int NTOK, int S>
constexpr int kStagesAt = W == NTOK ? S : wgloop::kQ4Stages<W>;

// Block (x, tile) computes column blocks x * ncb .. x * ncb + ncb - 1 of its token tile, one after the other
// through one ring (wgloop::run_items; ncb = 1 for the loops other than the exact-code one).
template <int BITS, int NTOK, int S, int P>
__global__ void __launch_bounds__(wgloop::kThreads<P>, 1)
    gate_up_wg_kernel(QW G, QW U, QW SG, QW SU, X16 x, MoeGroups gr, int E, int topk, int ncb, int narrow,
                      float* __restrict__ h_routed, float* __restrict__ h_shared) {
  extern __shared__ unsigned char gu_wg_smem[];
  pdl_wait();
  pdl_trigger();
  TileInfo ti;
  if (!tile_info(gr, NTOK, static_cast<int>(blockIdx.y), ti)) return;
  const bool sh = ti.group == E;
  const int width = static_cast<int>(sh ? SG.out : G.out);
  const int cb0 = blockIdx.x * ncb;  // first column block of this block
  const int n_items = min(ncb, (width + kGateUpCols - 1) / kGateUpCols - cb0);
  if (n_items <= 0) return;
  const int K = static_cast<int>(G.in);
  const int tid = threadIdx.x, lane = tid & 31;
  auto token = [&](int r) { return tile_token(gr, ti, sh, topk, r); };

  auto src_at = [&](int item, int r) {  // weight-tile row r of item `item`: slice r / 16, gate for r % 16 < 8
    const int col = (cb0 + item) * kGateUpCols + 8 * (r >> 4) + (r & 7);
    return col < width ? gate_up_row<BITS>(G, U, SG, SU, ti, sh, (r & 15) >= 8, col) : gemm::RowSrc{};
  };
  // acc[4 j + i]: weight-tile row 16 (tid / 32) + lane / 4 + 8 (i / 2) (slice tid / 32), token row 8 j + 2 (lane %
  // 4) + i % 2 of the tile; i < 2 gate, i >= 2 up of column j0 + 8 (tid / 32) + lane / 4.
  // The row addresses are the same for every item; opaque() keeps the compiler from holding all of them in
  // registers across the main loop (ptxas spilled then).
  auto epilogue = [&](int item, const auto& acc) {  // acc: float[W / 2] for the loop's width W
    constexpr int W = 2 * int(sizeof(acc) / sizeof(float));
    const int n = (cb0 + item) * kGateUpCols + 8 * (tid >> 5) + (lane >> 2);
    if (n >= width) return;
    const int row0 = opaque(sh ? ti.row0 : ti.base);
    float* const base = sh ? h_shared : h_routed;
#pragma unroll
    for (int j = 0; j < W / 8; ++j) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int r = 8 * j + 2 * (lane & 3) + i;
        if (r >= ti.rows) continue;
        float* dst = base + int64_t(row0 + r) * width;
        dst[n] = silu(acc[4 * j + i]) * acc[4 * j + 2 + i];
      }
    }
  };
  by_width<NTOK, P>(narrow != 0, ti.rows, [&](auto w) {
    wgloop::run_items<BITS, w(), kStagesAt<w(), NTOK, S>, P>(
        gu_wg_smem, K, G.gs, x, [&](int r) { return r < ti.rows ? token(r) : -1; }, n_items, src_at, epilogue);
  });
}

template <int BITS, int NTOK, int S, int P>
__global__ void __launch_bounds__(wgloop::kThreads<P>, 1)
    down_wg_kernel(QW D, QW SD, X16 hr, X16 hs, MoeGroups gr, const float* topk_w, const float* sgate, int E, int ncb,
                   int narrow, float* __restrict__ y_pair, float* __restrict__ out) {
  extern __shared__ unsigned char dn_wg_smem[];
  pdl_wait();
  pdl_trigger();
  TileInfo ti;
  if (!tile_info(gr, NTOK, static_cast<int>(blockIdx.y), ti)) return;
  const bool sh = ti.group == E;
  const int K = static_cast<int>(sh ? SD.in : D.in);
  const int N = static_cast<int>(D.out);
  const int cb0 = blockIdx.x * ncb;  // first column block of this block (see gate_up_wg_kernel)
  const int n_items = min(ncb, (N + kBW - 1) / kBW - cb0);
  if (n_items <= 0) return;
  const int tid = threadIdx.x, lane = tid & 31;
  const int hrow0 = sh ? ti.row0 : ti.base;  // rows of h: the shared expert's by token, routed by expert order
  X16 hx = hr;  // by value: a reference to either parameter would put both in local memory
  if (sh) hx = hs;

  auto src_at = [&](int item, int r) {  // weight-tile row r of item `item`
    const int row = (cb0 + item) * kBW + r;
    return row < N ? group_row<BITS>(D, SD, ti, sh, row) : gemm::RowSrc{};
  };
  // Each token row's destination row and factor (as down_dst: the shared expert's rows go to out at their token,
  // times its sigmoid gate; a routed pair's to y_pair at the pair's index, times its routing weight), looked up once
  // per block into shared memory: the epilogue runs once per item, and these lookups are dependent global loads (ncu
  // on the H200 showed them among the kernel's stalls while each item repeated them). The main loop's first barrier
  // publishes the table.
  __shared__ int dst_row[kMaxTileRows<NTOK, P>];
  __shared__ float dst_f[kMaxTileRows<NTOK, P>];
  if (tid < kMaxTileRows<NTOK, P> && tid < ti.rows) {
    const int row = sh ? ti.row0 + tid : gr.order[ti.base + tid];
    dst_row[tid] = row;
    dst_f[tid] = sh ? sgate[row] : topk_w[row];
  }
  float* const dst_base = sh ? out : y_pair;
  auto epilogue = [&](int item, const auto& acc) {  // acc: float[W / 2] for the loop's width W
    constexpr int W = 2 * int(sizeof(acc) / sizeof(float));
    const int m = (cb0 + item) * kBW + 64 * (tid >> 7) + 16 * ((tid >> 5) & 3) + (lane >> 2);
#pragma unroll
    for (int j = 0; j < W / 8; ++j) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int r = 8 * j + 2 * (lane & 3) + i;
        if (r >= ti.rows) continue;
        const float f = dst_f[r];
        float* dst = dst_base + int64_t(dst_row[r]) * N;
        if (m < N) dst[m] = f * acc[4 * j + i];
        if (m + 8 < N) dst[m + 8] = f * acc[4 * j + 2 + i];
      }
    }
  };
  by_width<NTOK, P>(narrow != 0, ti.rows, [&](auto w) {
    wgloop::run_items<BITS, w(), kStagesAt<w(), NTOK, S>, P>(
        dn_wg_smem, K, D.gs, hx, [&](int r) { return r < ti.rows ? hrow0 + r : -1; }, n_items, src_at, epilogue);
  });
}

// Column blocks per block of the exact-code loop (kernels above; gemm_wg.h items_per_block). A block of this loop has
// an SM to itself (~200 KB of ring), so what it pays before its first MMA and after its last leaves the tensor cores
// idle. Measured on the H200 at 4K and 32K tokens (docs/notes/cuda-prefill-v8-items.md): the down GEMM (K = 512: 8 K
// tiles per output block) best at 8, gate/up at 2. The tile count is on the GPU; the estimate here (one tile per
// active expert, plus the shared expert's) is below it. FERN_MOE_DOWN_SEQ / FERN_MOE_GATE_UP_SEQ force a count.
int seq_cols(const Ctx& c, bool up, int T, int k, int E, int bm, int64_t col_blocks) {
  const int64_t tiles = std::min<int64_t>(E, int64_t(T) * k) + (int64_t(T) + bm - 1) / bm;
  return up ? items_per_block("FERN_MOE_GATE_UP_SEQ", tiles * col_blocks, 2, c.sms)
            : items_per_block("FERN_MOE_DOWN_SEQ", tiles * col_blocks, 8, c.sms);
}

// Measured on the H200 (eighteenth session, fern bench prefill, median of 3): 25,882 vs 25,109 tok/s at 4K, 23,276 vs
// 22,917 at 32K.
bool narrow_tiles() { return env_choice("FERN_MOE_NARROW", {"0", "1"}, 1) == 1; }

// The shared memory a kernel is launched with: its loop's ring, or the 144-token loop's where it takes tails.
template <int BITS, int NTOK, int S, int P>
constexpr size_t kLaunchSmem =
    kTakesTail<NTOK, P> ? std::max(wgloop::kSmemBytes<BITS, NTOK, S, P>,
                                   q4tile::kSmemBytes<NTOK + kMoeTailRows, wgloop::kQ4Stages<NTOK + kMoeTailRows>>)
                        : wgloop::kSmemBytes<BITS, NTOK, S, P>;
// The narrower loops' rings fit the shared memory a kernel is launched with.
template <int NTOK, int S, int P>
constexpr bool kNarrowFits = !wgloop::is_q4(P) || NTOK <= 64 ||
                             (q4tile::kSmemBytes<32, wgloop::kQ4Stages<32>> <= kLaunchSmem<4, NTOK, S, P> &&
                              q4tile::kSmemBytes<64, wgloop::kQ4Stages<64>> <= kLaunchSmem<4, NTOK, S, P>);

template <int BITS, int NTOK, int S, int P>
void gate_up_wg(const Ctx& c, const QW& gate, const QW& up, const QW& sgate, const QW& sup, const X16& x,
                const MoeGroups& g, int T, int k, int E, float* h_routed, float* h_shared) {
  constexpr size_t smem = kLaunchSmem<BITS, NTOK, S, P>;
  auto kernel = gate_up_wg_kernel<BITS, NTOK, S, P>;
  allow_dynamic_smem<gate_up_wg_kernel<BITS, NTOK, S, P>>(smem);
  const int64_t col_blocks = (std::max(gate.out, sgate.out) + kGateUpCols - 1) / kGateUpCols;
  const int ncb = wgloop::is_q4(P) ? seq_cols(c, true, T, k, E, NTOK, col_blocks) : 1;
  const dim3 grid = moe_tile_grid_cols_first(T, k, E, NTOK, std::max(gate.out, sgate.out), int64_t(kGateUpCols) * ncb);
  static_assert(kNarrowFits<NTOK, S, P>);
  launch(c, "moe gate_up_wg_kernel", kernel, grid, wgloop::kThreads<P>, smem, gate, up, sgate, sup, x, g, E, k, ncb,
         narrow_tiles() ? 1 : 0, h_routed, h_shared);
}

template <int BITS, int NTOK, int S, int P>
void down_wg(const Ctx& c, const QW& down, const QW& sdown, const X16& hr, const X16& hs, const MoeGroups& g,
             const float* topk_w, const float* sgate, int T, int k, int E, float* y_pair, float* out) {
  constexpr size_t smem = kLaunchSmem<BITS, NTOK, S, P>;
  auto kernel = down_wg_kernel<BITS, NTOK, S, P>;
  allow_dynamic_smem<down_wg_kernel<BITS, NTOK, S, P>>(smem);
  const int ncb = wgloop::is_q4(P) ? seq_cols(c, false, T, k, E, NTOK, (down.out + kBW - 1) / kBW) : 1;
  const dim3 grid = moe_tile_grid_cols_first(T, k, E, NTOK, down.out, int64_t(kBW) * ncb);
  static_assert(kNarrowFits<NTOK, S, P>);
  launch(c, "moe down_wg_kernel", kernel, grid, wgloop::kThreads<P>, smem, down, sdown, hr, hs, g, topk_w, sgate, E, ncb,
         narrow_tiles() ? 1 : 0, y_pair, out);
}

// Pipeline depth: two stages (half the shared memory: two blocks per SM) from 1,024 rows per chunk, else 4 (3 below
// 64-token tiles); FERN_GEMM_WG_STAGES=2|4 forces one. Measured on the H200 (docs/notes/cuda-prefill-v4-wg.md), the
// MoE block: T = 2,048 2.384 ms (deep) vs 2.016 (two stages); T = 512 1.087 vs 1.127. The switch between them is
// not measured; 1,024 is the midpoint.
inline bool two_stages(int T) {
  const int st = gemm_wg_stages();
  return st == 2 || (st == 0 && T >= 1024);
}

// The loop follows the rows' layout: the exact-code loop for to_xbf_q4 rows (4-bit codes only), else by
// FERN_GEMM_WG_PIPE: warp-specialized (one 512-thread block per SM, the deepest ring that fits: 4 stages of 48 KB at
// 64-token tiles, 5 of 40 / 36 KB below) or synchronous (the default for these kernels where the exact-code loop
// does not apply: measured faster than ws on the MoE block, docs/notes/cuda-prefill-v5-ws.md).
template <int NTOK>
constexpr int kWsStages = NTOK >= 64 ? 4 : 5;

// The exact-code loop at NTOK-token tiles (4-bit codes, to_xbf_q4 rows: hi/lo or fp16, wgloop::with_q4_loop).
template <int NTOK>
void gate_up_q4(const Ctx& c, const QW& gate, const QW& up, const QW& sgate, const QW& sup, const X16& x,
                const MoeGroups& g, int T, int k, int E, float* h_routed, float* h_shared) {
  wgloop::with_q4_loop(x, [&](auto p) {
    gate_up_wg<4, NTOK, wgloop::kQ4Stages<NTOK>, p()>(c, gate, up, sgate, sup, x, g, T, k, E, h_routed, h_shared);
  });
}
template <int NTOK>
void down_q4(const Ctx& c, const QW& down, const QW& sdown, const X16& hr, const X16& hs, const MoeGroups& g,
             const float* topk_w, const float* sgate, int T, int k, int E, float* y_pair, float* out) {
  wgloop::with_q4_loop(hr, [&](auto p) {
    down_wg<4, NTOK, wgloop::kQ4Stages<NTOK>, p()>(c, down, sdown, hr, hs, g, topk_w, sgate, T, k, E, y_pair, out);
  });
}

template <int BITS, int NTOK>
void gate_up_wg_n(const Ctx& c, const QW& gate, const QW& up, const QW& sgate, const QW& sup, const X16& x,
                  const MoeGroups& g, int T, int k, int E, float* h_routed, float* h_shared) {
  if constexpr (BITS == 4) {
    if (x.q4) {
      gate_up_q4<NTOK>(c, gate, up, sgate, sup, x, g, T, k, E, h_routed, h_shared);
      return;
    }
  }
  if (gemm_wg_pipe() == WgPipe::Ws)
    gate_up_wg<BITS, NTOK, kWsStages<NTOK>, wgloop::kWs>(c, gate, up, sgate, sup, x, g, T, k, E, h_routed, h_shared);
  else if (two_stages(T))
    gate_up_wg<BITS, NTOK, 2, wgloop::kSync>(c, gate, up, sgate, sup, x, g, T, k, E, h_routed, h_shared);
  else
    gate_up_wg<BITS, NTOK, NTOK >= 64 ? 4 : 3, wgloop::kSync>(c, gate, up, sgate, sup, x, g, T, k, E, h_routed,
                                                              h_shared);
}

template <int BITS, int NTOK>
void down_wg_n(const Ctx& c, const QW& down, const QW& sdown, const X16& hr, const X16& hs, const MoeGroups& g,
               const float* topk_w, const float* sgate, int T, int k, int E, float* y_pair, float* out) {
  if constexpr (BITS == 4) {
    if (hr.q4) {
      down_q4<NTOK>(c, down, sdown, hr, hs, g, topk_w, sgate, T, k, E, y_pair, out);
      return;
    }
  }
  if (gemm_wg_pipe() == WgPipe::Ws)
    down_wg<BITS, NTOK, kWsStages<NTOK>, wgloop::kWs>(c, down, sdown, hr, hs, g, topk_w, sgate, T, k, E, y_pair, out);
  else if (two_stages(T))
    down_wg<BITS, NTOK, 2, wgloop::kSync>(c, down, sdown, hr, hs, g, topk_w, sgate, T, k, E, y_pair, out);
  else
    down_wg<BITS, NTOK, NTOK >= 64 ? 4 : 3, wgloop::kSync>(c, down, sdown, hr, hs, g, topk_w, sgate, T, k, E, y_pair,
                                                           out);
}

template <int BITS>
void gate_up_wg_bits(const Ctx& c, const QW& gate, const QW& up, const QW& sgate, const QW& sup, const X16& x,
                     const MoeGroups& g, int T, int k, int E, int bm, float* h_routed, float* h_shared) {
  if constexpr (BITS == 4) {
    // tall tiles: the exact-code loop only (moe_tile_rows_wg_ok)
    if (bm == 96) return gate_up_q4<96>(c, gate, up, sgate, sup, x, g, T, k, E, h_routed, h_shared);
    if (bm == 128) return gate_up_q4<128>(c, gate, up, sgate, sup, x, g, T, k, E, h_routed, h_shared);
  }
  switch (bm) {
    case 16: gate_up_wg_n<BITS, 16>(c, gate, up, sgate, sup, x, g, T, k, E, h_routed, h_shared); break;
    case 32: gate_up_wg_n<BITS, 32>(c, gate, up, sgate, sup, x, g, T, k, E, h_routed, h_shared); break;
    default: gate_up_wg_n<BITS, 64>(c, gate, up, sgate, sup, x, g, T, k, E, h_routed, h_shared); break;
  }
}

template <int BITS>
void down_wg_bits(const Ctx& c, const QW& down, const QW& sdown, const X16& hr, const X16& hs, const MoeGroups& g,
                  const float* topk_w, const float* sgate, int T, int k, int E, int bm, float* y_pair, float* out) {
  if constexpr (BITS == 4) {
    if (bm == 96) return down_q4<96>(c, down, sdown, hr, hs, g, topk_w, sgate, T, k, E, y_pair, out);
    if (bm == 128) return down_q4<128>(c, down, sdown, hr, hs, g, topk_w, sgate, T, k, E, y_pair, out);
  }
  switch (bm) {
    case 16: down_wg_n<BITS, 16>(c, down, sdown, hr, hs, g, topk_w, sgate, T, k, E, y_pair, out); break;
    case 32: down_wg_n<BITS, 32>(c, down, sdown, hr, hs, g, topk_w, sgate, T, k, E, y_pair, out); break;
    default: down_wg_n<BITS, 64>(c, down, sdown, hr, hs, g, topk_w, sgate, T, k, E, y_pair, out); break;
  }
}

}  // namespace

// FERN_MOE_TAIL: 1 (the default) or 0. Measured on the H200: docs/notes/cuda-prefill-v26-tail.md.
int moe_tail_rows(int bm, bool q4b_both) {
  const bool on = env_choice("FERN_MOE_TAIL", {"0", "1"}, 1) == 1;
  return bm == 128 && q4b_both && on ? kMoeTailRows : 0;
}

bool moe_tile_rows_wg_ok(int bm, bool q4) { return moe_tile_rows_ok(bm) || (q4 && (bm == 96 || bm == 128)); }

bool moe_grouped_q4_ok(const QW& a, const QW& b, const QW& c, const QW& d) {
  return gemm_q4_ok(a) && gemm_q4_ok(b) && gemm_q4_ok(c) && gemm_q4_ok(d);
}

bool moe_grouped_wg_ok(const QW& gate, const QW& down, const QW& sdown) {
  return (gate.bits == 4 || gate.bits == 8) && gate.in % wgtile::kBK == 0 && down.in % wgtile::kBK == 0 &&
         sdown.in % wgtile::kBK == 0;
}

void moe_grouped_gate_up_wg(const Ctx& c, const QW& gate, const QW& up, const QW& sgate, const QW& sup,
                            const X16& x, const MoeGroups& g, int T, int k, int E, int bm, float* h_routed,
                            float* h_shared) {
  FERN_CU_CHECK(moe_tile_rows_wg_ok(bm, x.q4) && (gate.bits == 4 || gate.bits == 8) && gate.in % wgtile::kBK == 0,
                "moe gate/up wg: tile rows, format or width");
  FERN_CU_CHECK(!x.q4 || moe_grouped_q4_ok(gate, up, sgate, sup), "moe gate/up wg: exact-code rows, other weights");
  FERN_CU_CHECK(g.extra == 0 || (g.extra == kMoeTailRows && bm == 128 && x.q4b() && gate.bits == 4),
                "moe gate/up wg: tiles past 128 rows are taken by the q4b loop at 128-row tiles only");
  if (gate.bits == 4)
    gate_up_wg_bits<4>(c, gate, up, sgate, sup, x, g, T, k, E, bm, h_routed, h_shared);
  else
    gate_up_wg_bits<8>(c, gate, up, sgate, sup, x, g, T, k, E, bm, h_routed, h_shared);
}

void moe_grouped_down_wg(const Ctx& c, const QW& down, const QW& sdown, const X16& h_routed, const X16& h_shared,
                         const MoeGroups& g, const float* topk_w, const float* sgate, int T, int k, int E, int bm,
                         float* y_pair, float* out) {
  FERN_CU_CHECK(moe_tile_rows_wg_ok(bm, h_routed.q4) && (down.bits == 4 || down.bits == 8) && down.in % wgtile::kBK == 0 &&
                    sdown.in % wgtile::kBK == 0,
                "moe down wg: tile rows, format or width");
  FERN_CU_CHECK(h_routed.q4 == h_shared.q4 && h_routed.q4h() == h_shared.q4h() &&
                    (!h_routed.q4 || moe_grouped_q4_ok(down, sdown, down, sdown)),
                "moe down wg: exact-code rows (both hi/lo or both fp16), other weights");
  FERN_CU_CHECK(g.extra == 0 || (g.extra == kMoeTailRows && bm == 128 && h_routed.q4b() && h_shared.q4b() &&
                                 down.bits == 4),
                "moe down wg: tiles past 128 rows are taken by the q4b loop at 128-row tiles only");
  if (down.bits == 4)
    down_wg_bits<4>(c, down, sdown, h_routed, h_shared, g, topk_w, sgate, T, k, E, bm, y_pair, out);
  else
    down_wg_bits<8>(c, down, sdown, h_routed, h_shared, g, topk_w, sgate, T, k, E, bm, y_pair, out);
}

}  // namespace fern::cuda
