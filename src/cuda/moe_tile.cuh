// The tile map of the grouped expert GEMMs (moe_prefill.h: MoeGroups), read by the kernels of moe_prefill.cu and
// moe_prefill_f16.cu.
#pragma once
#include "cuda/moe_prefill.h"

namespace fern::cuda {

// The tile of this block: group, first row, rows, and the position in expert order of its first row. False when
// the block is past the real tile count.
struct TileInfo {
  int group, row0, rows, base;
};

__device__ __forceinline__ bool tile_info(const MoeGroups& g, int BM, TileInfo& ti) {
  const int tile = blockIdx.x;
  if (tile >= *g.n_tiles) return false;
  ti.group = g.tiles[2 * tile];
  ti.row0 = g.tiles[2 * tile + 1];
  ti.rows = min(BM, g.counts[ti.group] - ti.row0);
  ti.base = g.offsets[ti.group] + ti.row0;
  return true;
}

}  // namespace fern::cuda
