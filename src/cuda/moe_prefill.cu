// The MoE block for T > 1 token rows (moe_prefill.h, MODEL.md 2.5) after the router (moe_route):
//  1. group_kernel: one block builds the per-expert grouping of the (token, slot) pairs in shared memory:
//     histogram of rows per expert, exclusive scans to row offsets and tile offsets, the tile map (expert, first
//     row), then the scatter of the pair ids into expert order. No host synchronisation.
//  2. gate_up_kernel: one block per (tile, 64 intermediate columns): gathers the x rows of the tile's pairs and
//     multiplies them by the expert's gate and up rows at once (the block's 128 weight rows are 64 gate rows and the
//     matching 64 up rows, interleaved per warp so that each thread holds gate and up of the same outputs), and
//     writes h = SiLU(gate) * up at the pair's position in expert order. The shared expert is group E.
//  3. down_kernel: one block per (tile, 128 hidden columns): h rows times the expert's down matrix, scaled by the
//     routing weight, written to the pair's own row of y_pair (the shared expert: scaled by sigmoid of its gate,
//     written to out).
//  4. combine_kernel: out[t] += y_pair[t, 0] + ... + y_pair[t, k-1] in slot order: a fixed order, no float atomics.
// The tile loop is gemm_tile.cuh (hi/lo bf16 split of x, exact codes, scale and bias on fp32 partial sums), so the
// products are near fp32 like the dense prefill linear.
#include <algorithm>

#include "core/env.h"
#include "cuda/cuda_util.cuh"
#include "cuda/gemm_tile.cuh"
#include "cuda/launch.cuh"
#include "cuda/moe_prefill.h"
#include "cuda/moe_tile.cuh"
#include "cuda/topk.cuh"

namespace fern::cuda {
namespace {

constexpr int kGroupThreads = 1024;  // one thread per expert in the scans (E <= 1024)
constexpr int kGateUpCols = gemm::kBN / 2;  // intermediate columns per gate/up block
// Blocks per SM asked of the register allocator, by m16 tiles per block: 64-row tiles at 128 registers (2 blocks,
// like linear_gemm; left alone ptxas took 138 and fitted one), 32-row tiles at 85, 16-row tiles at 64. With the
// register prefetch (one more Stage of registers) one block fewer each.
template <int M16, bool PF>
constexpr int kMinBlocks = (M16 >= 4 ? 2 : M16 == 2 ? 3 : 4) - (PF ? 1 : 0);

// Exclusive scan over the 1024 threads of the block; `tot` is 33 ints of shared memory (warp totals, then the
// block total in tot[32]).
__device__ __forceinline__ int block_excl_scan(int v, int* tot, int& total) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
  int inc = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int n = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += n;
  }
  if (lane == 31) tot[wid] = inc;
  __syncthreads();
  if (wid == 0) {
    const int w = tot[lane];
    int wi = w;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int n = __shfl_up_sync(0xffffffffu, wi, o);
      if (lane >= o) wi += n;
    }
    tot[lane] = wi - w;
    if (lane == 31) tot[32] = wi;
  }
  __syncthreads();
  total = tot[32];
  return tot[wid] + inc - v;
}

__global__ void __launch_bounds__(kGroupThreads) group_kernel(const int32_t* __restrict__ ids, int T, int k, int E,
                                                              int bm, MoeGroups g) {
  extern __shared__ int group_smem[];
  int* cnt = group_smem;
  int* fill = cnt + E;
  int* off = fill + E;
  __shared__ int tot_rows[33], tot_tiles[33];
  pdl_wait();
  pdl_trigger();
  const int tid = threadIdx.x;
  const int P = T * k;
  for (int e = tid; e < E; e += kGroupThreads) cnt[e] = fill[e] = 0;
  __syncthreads();
  // Integer shared-memory atomics: the counts do not depend on the order of the additions.
  for (int p = tid; p < P; p += kGroupThreads) atomicAdd(&cnt[min(max(ids[p], 0), E - 1)], 1);
  __syncthreads();
  const int c = tid < E ? cnt[tid] : 0;
  const int nt = moe_group_tiles(c, bm, g.extra);
  int rows_total = 0, tiles_total = 0;
  const int o = block_excl_scan(c, tot_rows, rows_total);
  const int to = block_excl_scan(nt, tot_tiles, tiles_total);
  if (tid < E) {
    off[tid] = o;
    g.counts[tid] = c;
    g.offsets[tid] = o;
    for (int j = 0; j < nt; ++j) {
      g.tiles[2 * (to + j)] = tid;
      g.tiles[2 * (to + j) + 1] = j * bm;
    }
  }
  const int shared_tiles = moe_group_tiles(T, bm, g.extra);
  for (int j = tid; j < shared_tiles; j += kGroupThreads) {
    g.tiles[2 * (tiles_total + j)] = E;
    g.tiles[2 * (tiles_total + j) + 1] = j * bm;
  }
  if (tid == 0) {
    g.counts[E] = T;
    g.offsets[E] = 0;
    *g.n_tiles = tiles_total + shared_tiles;
  }
  __syncthreads();
  for (int p = tid; p < P; p += kGroupThreads) {
    const int e = min(max(ids[p], 0), E - 1);
    g.order[off[e] + atomicAdd(&fill[e], 1)] = p;
  }
}

// Router logits on the tensor cores: logits [T, E] = x R^T with the 16-row tile layout (16 rows x 128 experts per
// block: T = 512 and 256 experts make 64 blocks, where the 64-row dense kernel would have 16).
template <int BITS>
__global__ void __launch_bounds__(gemm::kThreads, 4) router_kernel(QW R, const float* __restrict__ x,
                                                                   float* __restrict__ logits, int T) {
  using L = gemm::Layout<1, 1, 2>;
  __shared__ __align__(16) gemm::Smem<L::kBM> sm;
  pdl_wait();
  pdl_trigger();
  const int K = static_cast<int>(R.in), N = static_cast<int>(R.out);
  const int t0 = blockIdx.x * L::kBM, n0 = blockIdx.y * gemm::kBN;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int xr = tid >> 2, wr = tid >> 1;
  const float* xrow = xr < L::kBM && t0 + xr < T ? x + int64_t(t0 + xr) * K : nullptr;
  const gemm::RowSrc wsrc = n0 + wr < N ? gemm::row_src<BITS>(R, 0, n0 + wr) : gemm::RowSrc{};
  float acc[1][2][4] = {};
  gemm::mainloop<BITS, 1, 1, 2>(sm, K, BITS == 16 ? gemm::kBK : R.gs, xrow, wsrc, acc);
  const int g = lane >> 2, c = lane & 3;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int t = t0 + g + 8 * h;
    if (t >= T) continue;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const int n = n0 + L::col0(warp) + nt * 8 + 2 * c;
      if (n < N) logits[int64_t(t) * N + n] = acc[0][nt][2 * h];
      if (n + 1 < N) logits[int64_t(t) * N + n + 1] = acc[0][nt][2 * h + 1];
    }
  }
}

// Softmax, top-k, renormalisation and sigmoid of the shared gate: one warp per token (topk.cuh, the same code as
// the decode router's tail).
constexpr int kTopkWarps = 4;

// Codes k .. k + 7 of a 4- or 8-bit weight row (the MLX packing: code j of a 32-bit word in its bits BITS j ..).
template <int BITS>
__device__ __forceinline__ void unpack8(const void* row, int k, uint32_t (&q)[8]) {
  if constexpr (BITS == 4) {
    const uint32_t w = static_cast<const uint32_t*>(row)[k / 8];
#pragma unroll
    for (int j = 0; j < 8; ++j) q[j] = (w >> (4 * j)) & 0xf;
  } else {
    const uint32_t* w = static_cast<const uint32_t*>(row) + k / 4;
#pragma unroll
    for (int j = 0; j < 8; ++j) q[j] = (w[j / 4] >> (8 * (j % 4))) & 0xff;
  }
}

// The shared-expert gate's logit for one row of x, by one warp: the gate's one weight row (4- or 8-bit, groups a
// multiple of 8, K a multiple of 8) against x's row, lane l taking the 8-wide chunks l, l + 32, ...; each weight
// dequantized as s q + b (unpack8) times x in fp32, summed per lane, then across the warp.
template <int BITS>
__device__ __forceinline__ float gate_row_dot(const QW& g, const float* x, int K, int lane) {
  const gemm::RowSrc src = gemm::row_src<BITS>(g, 0, 0);
  float acc = 0.0f;
  for (int k = 8 * lane; k < K; k += 256) {
    const float4 a = *reinterpret_cast<const float4*>(x + k), c = *reinterpret_cast<const float4*>(x + k + 4);
    const float xv[8] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
    const float s = bf16_at(src.s, k / g.gs), b = bf16_at(src.b, k / g.gs);
    uint32_t q[8];
    unpack8<BITS>(src.w, k, q);
#pragma unroll
    for (int j = 0; j < 8; ++j) acc = fmaf(s * float(q[j]) + b, xv[j], acc);
  }
  return warp_sum(acc);
}

// One warp per token row: the top-k of its router logits and the shared-expert gate. SG_BITS 4 or 8: the gate's
// logit computed here from x (gate_row_dot) and stored to sg_logit first; 0: sg_logit given (linear_gemv).
template <int SG_BITS>
__global__ void __launch_bounds__(32 * kTopkWarps)
    topk_rows_kernel(const float* __restrict__ logits, float* sg_logit, int E, int k, int T,
                     int32_t* __restrict__ ids, float* __restrict__ wts, float* __restrict__ sgate, QW sg,
                     const float* x) {
  pdl_wait();
  pdl_trigger();
  const int t = blockIdx.x * kTopkWarps + (threadIdx.x >> 5);
  if (t >= T) return;
  if constexpr (SG_BITS != 0) {
    const int K = static_cast<int>(sg.in);
    const float v = gate_row_dot<SG_BITS>(sg, x + int64_t(t) * K, K, threadIdx.x & 31);
    if ((threadIdx.x & 31) == 0) sg_logit[t] = v;  // topk_warp's lane 0 reads it back
  }
  topk_warp(logits + int64_t(t) * E, sg_logit + t, E, k, ids + int64_t(t) * k, wts + int64_t(t) * k, sgate + t);
}


template <int BITS, int WM, int MT, int NT, bool PF>
__global__ void __launch_bounds__(gemm::kThreads, kMinBlocks<MT * WM, PF>)
    gate_up_kernel(QW G, QW U, QW SG, QW SU, const float* __restrict__ x, MoeGroups gr, int E, int topk,
                   float* __restrict__ h_routed, float* __restrict__ h_shared) {
  using L = gemm::Layout<WM, MT, NT>;
  constexpr int BM = L::kBM;
  constexpr int kHalf = L::kWarpCols / 2;  // a warp's gate rows, then as many up rows
  __shared__ __align__(16) gemm::Smem<BM> sm;
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

  const int xr = tid >> 2;
  const float* xrow = nullptr;
  if (xr < ti.rows) {
    const int tok = tile_token(gr, ti, sh, topk, xr);
    xrow = x + int64_t(tok) * K;
  }
  const int wr = tid >> 1;
  const int q = wr % L::kWarpCols;
  const bool up = q >= kHalf;
  const int col = j0 + (wr / L::kWarpCols) * kHalf + q % kHalf;
  gemm::RowSrc wsrc;
  if (col < width) wsrc = gate_up_row<BITS>(G, U, SG, SU, ti, sh, up, col);

  float acc[MT][NT][4] = {};
  gemm::mainloop<BITS, WM, MT, NT, PF>(sm, K, BITS == 16 ? gemm::kBK : G.gs, xrow, wsrc, acc);

  const int g = lane >> 2, c = lane & 3;
  const int wm = L::row0(warp);
  const int cb = j0 + (warp / WM) * kHalf;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = wm + mt * 16 + g + 8 * h;
      if (r >= ti.rows) continue;
      float* dst = sh ? h_shared + int64_t(ti.row0 + r) * width : h_routed + int64_t(ti.base + r) * width;
#pragma unroll
      for (int nt = 0; nt < NT / 2; ++nt) {
        const int n = cb + nt * 8 + 2 * c;
        const float* ag = acc[mt][nt];
        const float* au = acc[mt][nt + NT / 2];
        if (n < width) dst[n] = silu(ag[2 * h]) * au[2 * h];
        if (n + 1 < width) dst[n + 1] = silu(ag[2 * h + 1]) * au[2 * h + 1];
      }
    }
  }
}

template <int BITS, int WM, int MT, int NT, bool PF>
__global__ void __launch_bounds__(gemm::kThreads, kMinBlocks<MT * WM, PF>)
    down_kernel(QW D, QW SD, const float* __restrict__ h_routed, const float* __restrict__ h_shared, MoeGroups gr,
                const float* __restrict__ topk_w, const float* __restrict__ sgate, int E, float* __restrict__ y_pair,
                float* __restrict__ out) {
  using L = gemm::Layout<WM, MT, NT>;
  constexpr int BM = L::kBM;
  __shared__ __align__(16) gemm::Smem<BM> sm;
  pdl_wait();
  pdl_trigger();
  TileInfo ti;
  if (!tile_info(gr, BM, ti)) return;
  const bool sh = ti.group == E;
  const int K = static_cast<int>(sh ? SD.in : D.in);
  const int N = static_cast<int>(D.out);
  const int n0 = blockIdx.y * gemm::kBN;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  const int xr = tid >> 2;
  const float* xrow = nullptr;
  if (xr < ti.rows) xrow = sh ? h_shared + int64_t(ti.row0 + xr) * K : h_routed + int64_t(ti.base + xr) * K;
  const int wr = tid >> 1;
  gemm::RowSrc wsrc;
  if (n0 + wr < N) wsrc = group_row<BITS>(D, SD, ti, sh, n0 + wr);

  float acc[MT][NT][4] = {};
  gemm::mainloop<BITS, WM, MT, NT, PF>(sm, K, BITS == 16 ? gemm::kBK : D.gs, xrow, wsrc, acc);

  const int g = lane >> 2, c = lane & 3;
  const int wm = L::row0(warp), wn = L::col0(warp);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = wm + mt * 16 + g + 8 * h;
      if (r >= ti.rows) continue;
      float f;
      float* dst = down_dst(gr, ti, sh, r, N, out, y_pair, topk_w, sgate, f);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int n = n0 + wn + nt * 8 + 2 * c;
        if (n < N) dst[n] = f * acc[mt][nt][2 * h];
        if (n + 1 < N) dst[n + 1] = f * acc[mt][nt][2 * h + 1];
      }
    }
  }
}

// resid (or nullptr): resid += out as well, the residual add after the block (moe_residual), the add kernel's sum.
__global__ void combine_kernel(const float* __restrict__ y_pair, float* __restrict__ out, int T, int k, int64_t H,
                               float* __restrict__ resid) {
  pdl_wait();
  pdl_trigger();
  const int64_t n = int64_t(T) * H;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / H, col = i - t * H;
    float acc = out[i];
    const float* y = y_pair + t * k * H + col;
    for (int s = 0; s < k; ++s) acc += y[s * H];
    out[i] = acc;
    if (resid != nullptr) resid[i] = resid[i] + acc;
  }
}

template <int BITS>
__global__ void dequant_kernel(QW W, uint16_t* __restrict__ dst, int64_t n8) {
  const int64_t per_row = W.in / 8;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n8; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / per_row;
    const int k = static_cast<int>((i - row * per_row) * 8);
    const int64_t e = row / W.out;
    const gemm::RowSrc src = gemm::row_src<BITS>(W, e, row - e * W.out);
    const float s = bf16_at(src.s, k / W.gs), b = bf16_at(src.b, k / W.gs);
    uint32_t q[8];
    unpack8<BITS>(src.w, k, q);
    uint32_t o[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) o[j] = gemm::pack_bf16(s * float(q[2 * j]) + b, s * float(q[2 * j + 1]) + b);
    *reinterpret_cast<uint4*>(dst + row * W.in + k) = make_uint4(o[0], o[1], o[2], o[3]);
  }
}

template <int BITS, int BM>
void gate_up_launch(const Ctx& c, const QW& gate, const QW& up, const QW& sgate, const QW& sup, const float* x,
                    const MoeGroups& g, int T, int k, int E, bool pf, float* h_routed, float* h_shared) {
  using C = MoeTileCfg<BM>;
  const dim3 grid = moe_tile_grid(T, k, E, BM, std::max(gate.out, sgate.out), kGateUpCols);
  if (pf)
    launch(c, "moe gate_up_kernel", gate_up_kernel<BITS, C::WM, C::MT, C::NT, true>, grid, gemm::kThreads, 0, gate,
           up, sgate, sup, x, g, E, k, h_routed, h_shared);
  else
    launch(c, "moe gate_up_kernel", gate_up_kernel<BITS, C::WM, C::MT, C::NT, false>, grid, gemm::kThreads, 0, gate,
           up, sgate, sup, x, g, E, k, h_routed, h_shared);
}

template <int BITS, int BM>
void down_launch(const Ctx& c, const QW& down, const QW& sdown, const float* h_routed, const float* h_shared,
                 const MoeGroups& g, const float* topk_w, const float* sgate, int T, int k, int E, bool pf,
                 float* y_pair, float* out) {
  using C = MoeTileCfg<BM>;
  const dim3 grid = moe_tile_grid(T, k, E, BM, down.out, gemm::kBN);
  if (pf)
    launch(c, "moe down_kernel", down_kernel<BITS, C::WM, C::MT, C::NT, true>, grid, gemm::kThreads, 0, down, sdown,
           h_routed, h_shared, g, topk_w, sgate, E, y_pair, out);
  else
    launch(c, "moe down_kernel", down_kernel<BITS, C::WM, C::MT, C::NT, false>, grid, gemm::kThreads, 0, down,
           sdown, h_routed, h_shared, g, topk_w, sgate, E, y_pair, out);
}

template <int BITS>
void gate_up_bits(const Ctx& c, const QW& gate, const QW& up, const QW& sgate, const QW& sup, const float* x,
                  const MoeGroups& g, int T, int k, int E, int bm, bool pf, float* h_routed, float* h_shared) {
  switch (bm) {
    case 16: gate_up_launch<BITS, 16>(c, gate, up, sgate, sup, x, g, T, k, E, pf, h_routed, h_shared); break;
    case 32: gate_up_launch<BITS, 32>(c, gate, up, sgate, sup, x, g, T, k, E, pf, h_routed, h_shared); break;
    default: gate_up_launch<BITS, 64>(c, gate, up, sgate, sup, x, g, T, k, E, pf, h_routed, h_shared); break;
  }
}

template <int BITS>
void down_bits(const Ctx& c, const QW& down, const QW& sdown, const float* h_routed, const float* h_shared,
               const MoeGroups& g, const float* topk_w, const float* sgate, int T, int k, int E, int bm, bool pf,
               float* y_pair, float* out) {
  auto run = [&](auto f) { f(c, down, sdown, h_routed, h_shared, g, topk_w, sgate, T, k, E, pf, y_pair, out); };
  switch (bm) {
    case 16: run(down_launch<BITS, 16>); break;
    case 32: run(down_launch<BITS, 32>); break;
    default: run(down_launch<BITS, 64>); break;
  }
}

bool width_ok(int64_t n) { return n > 0 && n % 16 == 0 && n < (int64_t(1) << 30); }

}  // namespace

bool moe_route_topk_ok(int64_t E, int k) { return k >= 1 && k <= 32 && E >= k && E <= 1024; }

void moe_route_topk(const Ctx& c, const QW& shared_gate, const float* x, const MoeScratch& s, int E, int T, int k) {
  if (T <= 0) return;
  // The shared-expert gate is one weight row. FERN_MOE_SGATE=topk (the default where the format allows: 4/8-bit,
  // groups and width multiples of 8): its logit by the top-k kernel's warp per token, which reads x's row once more
  // (docs/notes/cuda-prefill-v30-sgate.md); gemv: the GEMV (one block per token) as its own launch, which was
  // measured faster than a 128-row tile of the tensor-core loop with one real row (+0.6% whole prefill at 32K, +0.3%
  // at 128K). Read at every call.
  const bool in_topk = env_choice("FERN_MOE_SGATE", {"topk", "gemv"}, 0) == 0 && shared_gate.experts == 0 &&
                       shared_gate.out == 1 && (shared_gate.bits == 4 || shared_gate.bits == 8) &&
                       shared_gate.gs >= 8 && shared_gate.gs % 8 == 0 && shared_gate.in % 8 == 0 &&
                       shared_gate.in % shared_gate.gs == 0;
  const unsigned blocks = static_cast<unsigned>((T + kTopkWarps - 1) / kTopkWarps);
  auto run = [&](auto kernel) {
    launch(c, "moe topk_rows_kernel", kernel, blocks, 32 * kTopkWarps, 0, s.router_logits, s.sgate_logit, E, k, T,
           s.topk_ids, s.topk_w, s.sgate, shared_gate, x);
  };
  if (!in_topk) {
    linear_gemv(c, shared_gate, x, s.sgate_logit, T);
    run(topk_rows_kernel<0>);
  } else if (shared_gate.bits == 4) {
    run(topk_rows_kernel<4>);
  } else {
    run(topk_rows_kernel<8>);
  }
}

bool moe_route_gemm(const Ctx& c, const QW& router, const QW& shared_gate, const float* x, const MoeScratch& s,
                    int T, int k) {
  if (T <= 0 || router.experts != 0 || !moe_route_topk_ok(router.out, k) || !width_ok(router.in) ||
      (router.bits != 16 && (router.gs < 16 || router.gs % 16 != 0)))
    return false;
  const int E = static_cast<int>(router.out);
  const dim3 grid((T + 15) / 16, (E + gemm::kBN - 1) / gemm::kBN);
  auto run = [&](auto kernel) {
    launch(c, "moe router_kernel", kernel, grid, gemm::kThreads, 0, router, x, s.router_logits, T);
  };
  switch (router.bits) {
    case 4: run(router_kernel<4>); break;
    case 8: run(router_kernel<8>); break;
    default: run(router_kernel<16>); break;
  }
  moe_route_topk(c, shared_gate, x, s, E, T, k);
  return true;
}

bool moe_tile_rows_ok(int bm) { return bm == 16 || bm == 32 || bm == 64; }

int64_t moe_max_tiles(int T, int k, int E, int bm) {
  const int64_t P = int64_t(T) * k;
  return (P + bm - 1) / bm + std::min<int64_t>(E, P) + (int64_t(T) + bm - 1) / bm;
}

bool moe_grouped_ok(const QW& gate, const QW& up, const QW& down, const QW& sgate, const QW& sup, const QW& sdown) {
  const QW* all[] = {&gate, &up, &down, &sgate, &sup, &sdown};
  for (const QW* w : all) {
    if (w->bits != gate.bits || !width_ok(w->in) || w->out <= 0 || w->out >= (int64_t(1) << 30)) return false;
    if (w->bits != 16 && (w->bits != 4 && w->bits != 8)) return false;
    if (w->bits != 16 && (w->gs < 16 || w->gs % 16 != 0 || w->in % w->gs != 0)) return false;
    if (w->bits != 16 && w->gs != gate.gs) return false;  // the kernels take one group size for the whole block
  }
  const int64_t H = gate.in, I = gate.out, Is = sgate.out;
  return gate.experts >= 1 && gate.experts <= 1024 && up.experts == gate.experts && down.experts == gate.experts &&
         sgate.experts == 0 && sup.experts == 0 && sdown.experts == 0 && up.in == H && sgate.in == H &&
         sup.in == H && up.out == I && sup.out == Is && down.in == I && sdown.in == Is && down.out == H &&
         sdown.out == H && width_ok(H);
}

void moe_group(const Ctx& c, const int32_t* topk_ids, int T, int k, int E, int bm, const MoeGroups& g) {
  FERN_CU_CHECK(E >= 1 && E <= kGroupThreads && moe_tile_rows_wg_ok(bm, true) && int64_t(T) * k < (int64_t(1) << 30),
                "moe_group: shape out of range");
  launch(c, "moe group_kernel", group_kernel, 1, kGroupThreads, size_t(3) * E * sizeof(int), topk_ids, T, k, E, bm,
         g);
}

void moe_grouped_gate_up(const Ctx& c, const QW& gate, const QW& up, const QW& sgate, const QW& sup, const float* x,
                         const MoeGroups& g, int T, int k, int E, int bm, bool prefetch, float* h_routed,
                         float* h_shared) {
  FERN_CU_CHECK(moe_tile_rows_ok(bm), "moe gate/up: tile rows");
  switch (gate.bits) {
    case 4: gate_up_bits<4>(c, gate, up, sgate, sup, x, g, T, k, E, bm, prefetch, h_routed, h_shared); break;
    case 8: gate_up_bits<8>(c, gate, up, sgate, sup, x, g, T, k, E, bm, prefetch, h_routed, h_shared); break;
    default: gate_up_bits<16>(c, gate, up, sgate, sup, x, g, T, k, E, bm, prefetch, h_routed, h_shared); break;
  }
}

void moe_grouped_down(const Ctx& c, const QW& down, const QW& sdown, const float* h_routed, const float* h_shared,
                      const MoeGroups& g, const float* topk_w, const float* sgate, int T, int k, int E, int bm,
                      bool prefetch, float* y_pair, float* out) {
  FERN_CU_CHECK(moe_tile_rows_ok(bm), "moe down: tile rows");
  auto run = [&](auto f) {
    f(c, down, sdown, h_routed, h_shared, g, topk_w, sgate, T, k, E, bm, prefetch, y_pair, out);
  };
  switch (down.bits) {
    case 4: run(down_bits<4>); break;
    case 8: run(down_bits<8>); break;
    default: run(down_bits<16>); break;
  }
}

void moe_combine(const Ctx& c, const float* y_pair, float* out, int T, int k, int64_t H, float* resid) {
  const int64_t n = int64_t(T) * H;
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, int64_t(c.sms) * 16);
  launch(c, "moe combine_kernel", combine_kernel, static_cast<unsigned>(std::max<int64_t>(blocks, 1)), 256, 0, y_pair,
         out, T, k, H, resid);
}

void moe_dequant_bf16(const Ctx& c, const QW& w, uint16_t* dst) {
  FERN_CU_CHECK((w.bits == 4 || w.bits == 8) && w.in % 8 == 0 && w.gs % 8 == 0, "moe dequant: format");
  const int64_t n8 = std::max<int64_t>(w.experts, 1) * w.out * (w.in / 8);
  const int64_t blocks = std::min<int64_t>((n8 + 255) / 256, int64_t(c.sms) * 32);
  if (w.bits == 4)
    launch(c, "moe dequant_kernel", dequant_kernel<4>, static_cast<unsigned>(blocks), 256, 0, w, dst, n8);
  else
    launch(c, "moe dequant_kernel", dequant_kernel<8>, static_cast<unsigned>(blocks), 256, 0, w, dst, n8);
}

}  // namespace fern::cuda
