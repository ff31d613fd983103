// The MoE block for a chunk of T > 1 token rows on the tensor cores (moe_prefill.cu): the (token, slot) pairs chosen
// by the router are grouped by expert on the GPU, then each expert's gate/up and down matrices are applied to its
// rows with the tile loop of gemm_tile.cuh (4/8-bit codes dequantized inside the loop, never to memory). The shared
// expert is one more group (index E) holding every token row. Plain header (no fmt): shared by .cu and .cpp files.
#pragma once
#include <cstdint>

#include "cuda/gemm_f16.h"
#include "cuda/kernels.h"

namespace fern::cuda {

// The grouping of one chunk, in device memory. Group e < E holds the pairs p = t * k + slot with topk_ids[p] == e,
// at positions [offsets[e], offsets[e] + counts[e]) of `order` (their order inside a group is arbitrary: every row
// of a GEMM is computed independently of the others, so no result depends on it); group E is the shared expert,
// counts[E] = T rows, the token rows themselves. Tile i of the grouped GEMMs (i < *n_tiles) covers rows
// [tiles[2i+1], tiles[2i+1] + BM) of group tiles[2i]; routed tiles come first, in expert order. With extra > 0 the
// last tile of a group also takes up to `extra` rows past BM (moe_group_tiles): a group of BM + 9 rows is one tile
// of BM + 9 rows instead of a full tile and a nearly empty one (docs/notes/cuda-prefill-v26-tail.md); only kernels
// that take such tiles (the exact-code loop at 128-row tiles, moe_tail_rows) are given a map built with it.
struct MoeGroups {
  int32_t* counts = nullptr;   // [E + 1]
  int32_t* offsets = nullptr;  // [E + 1]
  int32_t* order = nullptr;    // [T * k]
  int32_t* tiles = nullptr;    // [2 * moe_max_tiles]
  int32_t* n_tiles = nullptr;  // [1]
  int extra = 0;               // rows past BM that a group's last tile may hold
};

// Rows past 128 that the exact-code loop (FERN_GEMM_WG_PIPE=q4b, the default) takes in a group's last 128-row tile:
// such a tile runs as one 144-token pass (moe_prefill_wg.cu).
constexpr int kMoeTailRows = 16;

// The MoeGroups::extra for a chunk whose tiles have bm rows: kMoeTailRows where both GEMMs run on the q4b loop
// (q4b_both) at 128-row tiles and FERN_MOE_TAIL is 1 (the default; 0 turns it off), else 0.
int moe_tail_rows(int bm, bool q4b_both);

// Tiles of a group of c rows at BM rows per tile, the last one taking up to `extra` rows more: 0 for an empty group,
// else max(1, ceil((c - extra) / BM)). Every tile but the last holds BM rows, so the last holds the rest,
// c - (n - 1) BM <= BM + extra.
__host__ __device__ inline int moe_group_tiles(int c, int bm, int extra) {
  if (c <= 0) return 0;
  const int n = (c - extra + bm - 1) / bm;
  return n < 1 ? 1 : n;
}
// Rows of the tile starting at row0 of a group of c rows (the map's rule above): the rest of the group where it fits
// BM + extra, else BM.
__host__ __device__ inline int moe_tile_rows_at(int c, int row0, int bm, int extra) {
  const int rest = c - row0;
  return rest <= bm + extra ? rest : bm;
}

// Token rows per tile of the grouped GEMMs that the kernels are built for.
constexpr int kMoeTileRows[] = {16, 32, 64};
bool moe_tile_rows_ok(int bm);
// Upper bound of the tiles of a chunk: sum_e ceil(c_e / BM) <= ceil(T k / BM) + min(E, T k), plus the shared
// expert's ceil(T / BM). The GEMM grids are sized from it; blocks past *n_tiles exit at once.
int64_t moe_max_tiles(int T, int k, int E, int bm);

// Whether the grouped path takes these weights: one format (4, 8 or 16 bits) and one group size for all six
// matrices, widths that are multiples of 16, affine groups that are multiples of 16, at most 1024 experts.
bool moe_grouped_ok(const QW& gate, const QW& up, const QW& down, const QW& sgate, const QW& sup, const QW& sdown);

// Router for T rows with the logits on the tensor cores (16-row tiles), the shared-expert gate logit by the GEMV,
// then one warp per token for softmax / top-k / renormalisation / sigmoid (topk.cuh). Fills router_logits,
// sgate_logit, topk_ids, topk_w and sgate of `s`. False (nothing launched) for shapes it does not take.
bool moe_route_gemm(const Ctx& c, const QW& router, const QW& shared_gate, const float* x, const MoeScratch& s,
                    int T, int k);
// Its second half, for router logits already in s.router_logits [T, E] (from any GEMM): the shared-expert gate logit
// by the GEMV, then the top-k rows. moe_route_topk_ok: the shapes it takes (1 <= k <= 32, k <= E <= 1024).
bool moe_route_topk_ok(int64_t E, int k);
void moe_route_topk(const Ctx& c, const QW& shared_gate, const float* x, const MoeScratch& s, int E, int T, int k);

// Groups the pairs of topk_ids [T, k] (one block, shared-memory histogram, scan and scatter; no host sync).
void moe_group(const Ctx& c, const int32_t* topk_ids, int T, int k, int E, int bm, const MoeGroups& g);

// h_routed[pos] = SiLU(x[token] G_e^T) * (x[token] U_e^T) for every routed position pos of group e ([T k, I]);
// h_shared[t] likewise with the shared expert ([T, Is]). prefetch: the tile loop's register prefetch of the next k
// tile (gemm_tile.cuh).
void moe_grouped_gate_up(const Ctx& c, const QW& gate, const QW& up, const QW& sgate, const QW& sup, const float* x,
                         const MoeGroups& g, int T, int k, int E, int bm, bool prefetch, float* h_routed,
                         float* h_shared);
// y_pair[p] = topk_w[p] * (h_routed[pos(p)] D_e^T) for every pair p ([T k, H]); out[t] = sgate[t] * (h_shared[t]
// SD^T) ([T, H]).
void moe_grouped_down(const Ctx& c, const QW& down, const QW& sdown, const float* h_routed, const float* h_shared,
                      const MoeGroups& g, const float* topk_w, const float* sgate, int T, int k, int E, int bm,
                      bool prefetch, float* y_pair, float* out);
// The same two GEMMs on the fast tile loop (moe_prefill_f16.cu, gemm_tile_f16.cuh) for 4/8-bit experts
// (gemm_f16_format_ok): the inputs are fp16 rows (gemm_f16.h; the precise form takes the precise kernels): x [T, H]
// for gate/up; for down the fp16 rows of h_routed [T k, I] and h_shared [T, Is] as written by gate/up.
void moe_grouped_gate_up_f16(const Ctx& c, const QW& gate, const QW& up, const QW& sgate, const QW& sup,
                             const X16& x, const MoeGroups& g, int T, int k, int E, int bm, float* h_routed,
                             float* h_shared);
void moe_grouped_down_f16(const Ctx& c, const QW& down, const QW& sdown, const X16& h_routed, const X16& h_shared,
                          const MoeGroups& g, const float* topk_w, const float* sgate, int T, int k, int E, int bm,
                          float* y_pair, float* out);
// The same two GEMMs on the wgmma tile loop (moe_prefill_wg.cu, gemm_tile_wg.cuh; sm_90a, gemm_wg_supported) for
// 4/8-bit experts whose widths are multiples of 64 (moe_grouped_wg_ok): the inputs are bf16 hi/lo rows (gemm_wg.h:
// to_xbf), x [T, H] for gate/up, h_routed [T k, I] and h_shared [T, Is] for down. Rows converted by to_xbf_q4 (X16::q4)
// run the exact-code loop (gemm_tile_q4.cuh), which takes 4-bit codes with groups a multiple of 64 only
// (moe_grouped_q4_ok on the four matrices of each GEMM: gate, up, shared gate, shared up; down, shared down).
bool moe_grouped_wg_ok(const QW& gate, const QW& down, const QW& sdown);
bool moe_grouped_q4_ok(const QW& a, const QW& b, const QW& c, const QW& d);
// Token rows per tile the wgmma kernels take: those of moe_tile_rows_ok, and 96 and 128 on the exact-code loop (q4
// rows; the backend's adaptive rule takes 128 from 128 rows per expert: docs/notes/cuda-prefill-v15-moe-tile128.md).
bool moe_tile_rows_wg_ok(int bm, bool q4);
void moe_grouped_gate_up_wg(const Ctx& c, const QW& gate, const QW& up, const QW& sgate, const QW& sup,
                            const X16& x, const MoeGroups& g, int T, int k, int E, int bm, float* h_routed,
                            float* h_shared);
void moe_grouped_down_wg(const Ctx& c, const QW& down, const QW& sdown, const X16& h_routed, const X16& h_shared,
                         const MoeGroups& g, const float* topk_w, const float* sgate, int T, int k, int E, int bm,
                         float* y_pair, float* out);
// out[t] += y_pair[t k] + ... + y_pair[t k + k - 1], in slot order (deterministic: no atomics); with resid, then
// resid[t] += out[t] as well (the residual add after the block, in the same pass).
void moe_combine(const Ctx& c, const float* y_pair, float* out, int T, int k, int64_t H, float* resid = nullptr);

// Ablation (FERN_MOE_DEQUANT=separate): dst [experts, out, in] = bf16(s q + b) of an affine weight, the layout of
// a dense bf16 weight, so that the grouped GEMMs can run on it as on bf16 weights.
void moe_dequant_bf16(const Ctx& c, const QW& w, uint16_t* dst);

}  // namespace fern::cuda
