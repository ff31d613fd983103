// The grouped expert GEMMs of the MoE prefill (moe_prefill.h) on the fast tile loop (gemm_tile_f16.cuh): the same
// tile map, work split and epilogues as gate_up_kernel / down_kernel of moe_prefill.cu, but the input rows are the
// fp16 rows of gemm_f16.h (x once per chunk, h once per chunk after gate/up), gathered by cp.async, and the 4/8-bit
// expert weights are dequantized to fp16 in registers. The epilogues multiply by the rows' power-of-two scales.
#include <cuda_fp16.h>

#include <algorithm>

#include "cuda/cuda_util.cuh"
#include "cuda/gemm_f16.h"
#include "cuda/gemm_tile_f16.cuh"
#include "cuda/launch.cuh"
#include "cuda/moe_prefill.h"
#include "cuda/moe_tile.cuh"

namespace fern::cuda {
namespace {

constexpr int kGateUpCols = gemm::kBN / 2;  // intermediate columns per gate/up block
// Blocks per SM asked of the register allocator by m16 tiles per block (as in moe_prefill.cu).
template <int M16>
constexpr int kMinBlocks = M16 >= 4 ? 2 : M16 == 2 ? 3 : 4;
template <int BITS, bool P>
constexpr int kStages = BITS == 4 && !P ? 4 : 3;  // precise stages are larger (lo rows, sums, fp32 scales)

template <int BITS, int WM, int MT, int NT, bool P>
__global__ void __launch_bounds__(gemm::kThreads, kMinBlocks<MT * WM>)
    gate_up16_kernel(QW G, QW U, QW SG, QW SU, X16 x, MoeGroups gr, int E, int topk, float* __restrict__ h_routed,
                     float* __restrict__ h_shared) {
  using L = gemm::Layout<WM, MT, NT>;
  constexpr int BM = L::kBM;
  constexpr int S = kStages<BITS, P>;
  constexpr int kHalf = L::kWarpCols / 2;  // a warp's gate rows, then as many up rows
  extern __shared__ __align__(16) unsigned char gu16_smem[];
  auto& sm = *reinterpret_cast<gemm16::Smem<BM, BITS, S, P>*>(gu16_smem);
  pdl_wait();
  pdl_trigger();
  TileInfo ti;
  if (!tile_info(gr, BM, ti)) return;
  const bool sh = ti.group == E;
  const int width = static_cast<int>(sh ? SG.out : G.out);
  const int j0 = blockIdx.y * kGateUpCols;
  if (j0 >= width) return;
  const int K = static_cast<int>(G.in);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  auto token = [&](int r) { return tile_token(gr, ti, sh, topk, r); };

  const int wr = tid >> 1;
  const int q = wr % L::kWarpCols;
  const bool up = q >= kHalf;
  const int col = j0 + (wr / L::kWarpCols) * kHalf + q % kHalf;
  gemm::RowSrc wsrc;
  if (col < width) {
    if (sh)
      wsrc = up ? gemm::row_src<BITS>(SU, 0, col) : gemm::row_src<BITS>(SG, 0, col);
    else
      wsrc = up ? gemm::row_src<BITS>(U, ti.group, col) : gemm::row_src<BITS>(G, ti.group, col);
  }

  float acc[MT][NT][4] = {};
  gemm16::mainloop<BITS, WM, MT, NT, S, P>(
      sm, K, G.gs, reinterpret_cast<const __half*>(x.x), [&](int r) { return r < ti.rows ? token(r) : -1; }, wsrc,
      acc, reinterpret_cast<const __half*>(x.lo), x.sums, static_cast<int>(x.ks));

  const int g = lane >> 2, c = lane & 3;
  const int wm = L::row0(warp);
  const int cb = j0 + (warp / WM) * kHalf;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = wm + mt * 16 + g + 8 * h;
      if (r >= ti.rows) continue;
      const float f = x.scale[token(r)];
      float* dst = sh ? h_shared + int64_t(ti.row0 + r) * width : h_routed + int64_t(ti.base + r) * width;
#pragma unroll
      for (int nt = 0; nt < NT / 2; ++nt) {
        const int n = cb + nt * 8 + 2 * c;
        const float* ag = acc[mt][nt];
        const float* au = acc[mt][nt + NT / 2];
        if (n < width) dst[n] = silu(f * ag[2 * h]) * (f * au[2 * h]);
        if (n + 1 < width) dst[n + 1] = silu(f * ag[2 * h + 1]) * (f * au[2 * h + 1]);
      }
    }
  }
}

template <int BITS, int WM, int MT, int NT, bool P>
__global__ void __launch_bounds__(gemm::kThreads, kMinBlocks<MT * WM>)
    down16_kernel(QW D, QW SD, X16 hr, X16 hs, MoeGroups gr, const float* __restrict__ topk_w,
                  const float* __restrict__ sgate, int E, float* __restrict__ y_pair, float* __restrict__ out) {
  using L = gemm::Layout<WM, MT, NT>;
  constexpr int BM = L::kBM;
  constexpr int S = kStages<BITS, P>;
  extern __shared__ __align__(16) unsigned char dn16_smem[];
  auto& sm = *reinterpret_cast<gemm16::Smem<BM, BITS, S, P>*>(dn16_smem);
  pdl_wait();
  pdl_trigger();
  TileInfo ti;
  if (!tile_info(gr, BM, ti)) return;
  const bool sh = ti.group == E;
  const int K = static_cast<int>(sh ? SD.in : D.in);
  const int N = static_cast<int>(D.out);
  const int n0 = blockIdx.y * gemm::kBN;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // Rows of h: the shared expert's by token, the routed ones by position in expert order.
  const int hrow0 = sh ? ti.row0 : ti.base;
  const __half* hx = reinterpret_cast<const __half*>(sh ? hs.x : hr.x);
  const __half* hlo = reinterpret_cast<const __half*>(sh ? hs.lo : hr.lo);
  const float* hsums = sh ? hs.sums : hr.sums;
  const int hks = static_cast<int>(sh ? hs.ks : hr.ks);
  const float* hscale = sh ? hs.scale : hr.scale;

  const int wr = tid >> 1;
  gemm::RowSrc wsrc;
  if (n0 + wr < N) wsrc = group_row<BITS>(D, SD, ti, sh, n0 + wr);

  float acc[MT][NT][4] = {};
  gemm16::mainloop<BITS, WM, MT, NT, S, P>(
      sm, K, D.gs, hx, [&](int r) { return r < ti.rows ? hrow0 + r : -1; }, wsrc, acc, hlo, hsums, hks);

  const int g = lane >> 2, c = lane & 3;
  const int wm = L::row0(warp), wn = L::col0(warp);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int r = wm + mt * 16 + g + 8 * hh;
      if (r >= ti.rows) continue;
      float w;
      float* dst = down_dst(gr, ti, sh, r, N, out, y_pair, topk_w, sgate, w);
      const float f = hscale[hrow0 + r] * w;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int n = n0 + wn + nt * 8 + 2 * c;
        if (n < N) dst[n] = f * acc[mt][nt][2 * hh];
        if (n + 1 < N) dst[n + 1] = f * acc[mt][nt][2 * hh + 1];
      }
    }
  }
}

template <int BITS, int BM, bool P>
void gate_up16(const Ctx& c, const QW& gate, const QW& up, const QW& sgate, const QW& sup, const X16& x,
               const MoeGroups& g, int T, int k, int E, float* h_routed, float* h_shared) {
  using C = MoeTileCfg<BM>;
  constexpr size_t smem = gemm16::kSmemBytes<BM, BITS, kStages<BITS, P>, P>;
  auto kernel = gate_up16_kernel<BITS, C::WM, C::MT, C::NT, P>;
  allow_dynamic_smem<gate_up16_kernel<BITS, C::WM, C::MT, C::NT, P>>(smem);
  launch(c, "moe gate_up16_kernel", kernel, moe_tile_grid(T, k, E, BM, std::max(gate.out, sgate.out), kGateUpCols),
         gemm::kThreads, smem, gate, up, sgate, sup, x, g, E, k, h_routed, h_shared);
}

template <int BITS, int BM, bool P>
void down16(const Ctx& c, const QW& down, const QW& sdown, const X16& hr, const X16& hs, const MoeGroups& g,
            const float* topk_w, const float* sgate, int T, int k, int E, float* y_pair, float* out) {
  using C = MoeTileCfg<BM>;
  constexpr size_t smem = gemm16::kSmemBytes<BM, BITS, kStages<BITS, P>, P>;
  auto kernel = down16_kernel<BITS, C::WM, C::MT, C::NT, P>;
  allow_dynamic_smem<down16_kernel<BITS, C::WM, C::MT, C::NT, P>>(smem);
  launch(c, "moe down16_kernel", kernel, moe_tile_grid(T, k, E, BM, down.out, gemm::kBN), gemm::kThreads, smem, down,
         sdown, hr, hs, g, topk_w, sgate, E, y_pair, out);
}

template <int BITS, bool P>
void gate_up16_bits(const Ctx& c, const QW& gate, const QW& up, const QW& sgate, const QW& sup, const X16& x,
                    const MoeGroups& g, int T, int k, int E, int bm, float* h_routed, float* h_shared) {
  switch (bm) {
    case 16: gate_up16<BITS, 16, P>(c, gate, up, sgate, sup, x, g, T, k, E, h_routed, h_shared); break;
    case 32: gate_up16<BITS, 32, P>(c, gate, up, sgate, sup, x, g, T, k, E, h_routed, h_shared); break;
    default: gate_up16<BITS, 64, P>(c, gate, up, sgate, sup, x, g, T, k, E, h_routed, h_shared); break;
  }
}

template <int BITS, bool P>
void down16_bits(const Ctx& c, const QW& down, const QW& sdown, const X16& hr, const X16& hs, const MoeGroups& g,
                 const float* topk_w, const float* sgate, int T, int k, int E, int bm, float* y_pair, float* out) {
  switch (bm) {
    case 16: down16<BITS, 16, P>(c, down, sdown, hr, hs, g, topk_w, sgate, T, k, E, y_pair, out); break;
    case 32: down16<BITS, 32, P>(c, down, sdown, hr, hs, g, topk_w, sgate, T, k, E, y_pair, out); break;
    default: down16<BITS, 64, P>(c, down, sdown, hr, hs, g, topk_w, sgate, T, k, E, y_pair, out); break;
  }
}

}  // namespace

void moe_grouped_gate_up_f16(const Ctx& c, const QW& gate, const QW& up, const QW& sgate, const QW& sup,
                             const X16& x, const MoeGroups& g, int T, int k, int E, int bm, float* h_routed,
                             float* h_shared) {
  FERN_CU_CHECK(moe_tile_rows_ok(bm) && gemm_f16_format_ok(gate), "moe gate/up f16: tile rows or format");
  const bool p = x.lo != nullptr;
  auto run = [&](auto f) { f(c, gate, up, sgate, sup, x, g, T, k, E, bm, h_routed, h_shared); };
  if (gate.bits == 4)
    p ? run(gate_up16_bits<4, true>) : run(gate_up16_bits<4, false>);
  else
    p ? run(gate_up16_bits<8, true>) : run(gate_up16_bits<8, false>);
}

void moe_grouped_down_f16(const Ctx& c, const QW& down, const QW& sdown, const X16& h_routed, const X16& h_shared,
                          const MoeGroups& g, const float* topk_w, const float* sgate, int T, int k, int E, int bm,
                          float* y_pair, float* out) {
  FERN_CU_CHECK(moe_tile_rows_ok(bm) && gemm_f16_format_ok(down), "moe down f16: tile rows or format");
  FERN_CU_CHECK((h_routed.lo != nullptr) == (h_shared.lo != nullptr), "moe down f16: mixed precise and fast rows");
  const bool p = h_routed.lo != nullptr;
  auto run = [&](auto f) { f(c, down, sdown, h_routed, h_shared, g, topk_w, sgate, T, k, E, bm, y_pair, out); };
  if (down.bits == 4)
    p ? run(down16_bits<4, true>) : run(down16_bits<4, false>);
  else
    p ? run(down16_bits<8, true>) : run(down16_bits<8, false>);
}

}  // namespace fern::cuda
