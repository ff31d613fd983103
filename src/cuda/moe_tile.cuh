// The tile map of the grouped expert GEMMs (moe_prefill.h: MoeGroups), read by the kernels of moe_prefill.cu and
// moe_prefill_f16.cu, and the block shapes and grids both launch them with.
#pragma once
#include <cstdint>

#include "cuda/cuda_util.cuh"
#include "cuda/gemm_tile.cuh"
#include "cuda/moe_prefill.h"

namespace fern::cuda {

// The tile of this block: group, first row, rows, and the position in expert order of its first row. False when
// the block is past the real tile count.
struct TileInfo {
  int group, row0, rows, base;
};

__device__ __forceinline__ bool tile_info(const MoeGroups& g, int BM, int tile, TileInfo& ti) {
  if (tile >= *g.n_tiles) return false;
  ti.group = g.tiles[2 * tile];
  ti.row0 = g.tiles[2 * tile + 1];
  ti.rows = moe_tile_rows_at(g.counts[ti.group], ti.row0, BM, g.extra);
  ti.base = g.offsets[ti.group] + ti.row0;
  return true;
}
__device__ __forceinline__ bool tile_info(const MoeGroups& g, int BM, TileInfo& ti) {
  return tile_info(g, BM, static_cast<int>(blockIdx.x), ti);
}

// The token of row r of the tile: the shared expert's rows are the tokens themselves, a routed row is a (token,
// slot) pair in expert order.
__device__ __forceinline__ int tile_token(const MoeGroups& gr, const TileInfo& ti, bool sh, int topk, int r) {
  return sh ? ti.row0 + r : gr.order[ti.base + r] / topk;
}

// Row `row` of the tile group's matrix: the shared expert's own (`shared`) or expert ti.group of the stacked
// `routed` one.
template <int BITS>
__device__ __forceinline__ gemm::RowSrc group_row(const QW& routed, const QW& shared, const TileInfo& ti, bool sh,
                                                  int64_t row) {
  return sh ? gemm::row_src<BITS>(shared, 0, row) : gemm::row_src<BITS>(routed, ti.group, row);
}

// Row `col` of the gate (up false) or up matrix of the tile's group (group_row of the gate/up pair).
template <int BITS>
__device__ __forceinline__ gemm::RowSrc gate_up_row(const QW& G, const QW& U, const QW& SG, const QW& SU,
                                                    const TileInfo& ti, bool sh, bool up, int64_t col) {
  if (sh) return up ? gemm::row_src<BITS>(SU, 0, col) : gemm::row_src<BITS>(SG, 0, col);
  return up ? gemm::row_src<BITS>(U, ti.group, col) : gemm::row_src<BITS>(G, ti.group, col);
}

// Where row r of a down tile goes and the factor it is scaled by: a shared-expert row straight into out, times the
// token's sigmoid gate; a routed pair's row into y_pair, times its routing weight (moe_combine adds the pairs in slot
// order later).
__device__ __forceinline__ float* down_dst(const MoeGroups& gr, const TileInfo& ti, bool sh, int r, int64_t N,
                                           float* out, float* y_pair, const float* topk_w, const float* sgate,
                                           float& f) {
  if (sh) {
    f = sgate[ti.row0 + r];
    return out + int64_t(ti.row0 + r) * N;
  }
  const int pair = gr.order[ti.base + r];
  f = topk_w[pair];
  return y_pair + int64_t(pair) * N;
}

// Warp layout per tile height BM (token rows): warps along the token rows, m16 tiles per warp, n8 tiles per warp
// (gemm::Layout; 8 warps cover 128 weight rows).
template <int BM>
struct MoeTileCfg;
template <>
struct MoeTileCfg<64> {
  static constexpr int WM = 2, MT = 2, NT = 4;
};
template <>
struct MoeTileCfg<32> {
  static constexpr int WM = 2, MT = 1, NT = 4;
};
template <>
struct MoeTileCfg<16> {
  static constexpr int WM = 1, MT = 1, NT = 2;
};

// Grid of a grouped GEMM: the upper bound of tiles (blocks past the real count exit at once) x column blocks.
inline dim3 moe_tile_grid(int T, int k, int E, int bm, int64_t cols, int cols_per_block) {
  const int64_t tiles = moe_max_tiles(T, k, E, bm);
  const int64_t nb = (cols + cols_per_block - 1) / cols_per_block;
  FERN_CU_CHECK(tiles < (int64_t(1) << 31) && nb <= 65535, "moe prefill: grid too large");
  return dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(nb));
}
// The same grid with the column blocks in x (varying fastest) and the tiles in y: the blocks resident at one time
// share a few token tiles, whose rows then stay in L2 while every column block reads them (the wgmma kernels).
inline dim3 moe_tile_grid_cols_first(int T, int k, int E, int bm, int64_t cols, int cols_per_block) {
  const dim3 g = moe_tile_grid(T, k, E, bm, cols, cols_per_block);
  FERN_CU_CHECK(g.x <= 65535, "moe prefill: too many tiles");
  return dim3(g.y, g.x);
}

}  // namespace fern::cuda
