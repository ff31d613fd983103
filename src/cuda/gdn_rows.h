// Which rows each block of the GDN form of the input projections' kernel takes (linear.cu, gdn_proj_step;
// docs/notes/cuda-decode-v39-gdn-fused.md), and where it counts in: host and device code, so that a test on the host
// checks the assignment the kernel uses (tests/cuda/test_cuda_gdn_rows.cpp).
//
// The table is the concatenation qkv | z | b | a of a GDN layer's input projections (weight_group.h). A key head kh's
// group of blocks takes its q rows, its k rows, then the v rows of its two value heads; the pool takes the b and a
// rows first (row group j < 2 Hk: b or a of value heads 2 (j mod Hk), 2 (j mod Hk) + 1, i.e. of key head j mod Hk),
// then the z rows. Within a region, warp gw takes row groups (pairs of rows) gw, gw + warps, ... as every decode
// GEMV does, so pool warp j < 2 Hk takes b or a of key head j mod Hk first: those rows sit in the pool's first blocks.
// Grid order: those pool blocks, the groups' step blocks (kGdnDuty per key head), the groups' other blocks, the rest of
// the pool, so that the rows the steps wait for are in the blocks that start first (blocks become resident in about
// their index order while the previous launch's leave), and the step blocks, first of all blocks on their SMs, tend
// to have an SM each (where an out_proj block can then become resident beside one: linear.cu gdn_proj_kernel).
#pragma once

#include <cuda_runtime.h>  // __host__ __device__ in host-only translation units too

#include <climits>

namespace fern::cuda {

// The real model's head shape, the only one the form takes: Dk = Dv = 128, two value heads per key head. A group's
// q, k and v rows, and its blocks that run the step (two value heads x four blocks of 32 state columns; a group has
// kGdnDuty or 2 kGdnDuty blocks).
constexpr int kGdnDk = 128, kGdnDv = 128, kGdnVPerK = 2;
constexpr int kGdnGroupRows = 2 * kGdnDk + kGdnVPerK * kGdnDv;
constexpr int kGdnColBlocks = kGdnDv / 32;
constexpr int kGdnDuty = kGdnVPerK * kGdnColBlocks;

struct GdnRows {
  int kh;          // the block's key head group, -1 in the pool
  int blk;         // the block's index in its region (a group's: [0, 1 << group_shift))
  int n;           // the region's virtual rows
  int t1, t2;      // group: the first virtual k row and v row; pool: the first z row and INT_MAX
  int o0, o1, o2;  // table row - virtual row: below t1, below t2, from t2
  int gw, warps;   // the warp's index among its region's warps, and their number
  __host__ __device__ int row(int v) const { return v + (v < t1 ? o0 : v < t2 ? o1 : o2); }
};

// The pool's blocks that hold b and a rows (first in the grid), for W warps per block.
__host__ __device__ inline int gdn_ba_blocks(int Hk, int W) { return (2 * Hk + W - 1) / W; }

// Block `b` of a grid of `grid` blocks (W warps each), warp `warp`: Hk key heads, groups of 1 << shift blocks
// (shift 3 or 4: kGdnDuty or 2 kGdnDuty).
__host__ __device__ inline GdnRows gdn_rows(int Hk, int conv_dim, int shift, int b, int grid, int warp, int W) {
  const int Hv = kGdnVPerK * Hk, key_dim = Hk * kGdnDk, gblocks = Hk << shift, nba = gdn_ba_blocks(Hk, W);
  const int nduty = Hk * kGdnDuty;
  GdnRows r;
  if (b >= nba && b < nba + gblocks) {
    // A group has kGdnDuty blocks (shift 3: all step blocks) or 2 kGdnDuty (shift 4: kGdnDuty more after them), so
    // both parts split by the constant kGdnDuty (shifts, not divisions, ahead of the first loads).
    const int o = b - nba, p = o < nduty ? o : o - nduty;
    r.kh = p / kGdnDuty;
    r.blk = (o < nduty ? 0 : kGdnDuty) + p % kGdnDuty;
    r.n = kGdnGroupRows;
    r.t1 = kGdnDk;
    r.t2 = 2 * kGdnDk;
    r.o0 = r.kh * kGdnDk;                                         // q: row kh Dk + v
    r.o1 = key_dim + r.kh * kGdnDk - kGdnDk;                      // k: row key_dim + kh Dk + (v - Dk)
    r.o2 = 2 * key_dim + r.kh * kGdnVPerK * kGdnDv - 2 * kGdnDk;  // v: row 2 key_dim + kh 2 Dv + (v - 2 Dk)
    r.warps = W << shift;
  } else {
    const int vd = Hv * kGdnDv;
    r.kh = -1;
    r.blk = b < nba ? b : b - gblocks;
    r.n = 2 * Hv + vd;
    r.t1 = 2 * Hv;
    r.t2 = INT_MAX;
    r.o0 = conv_dim + vd;             // b, a: row conv_dim + value_dim + v
    r.o1 = r.o2 = conv_dim - 2 * Hv;  // z: row conv_dim + (v - 2 Hv)
    r.warps = (grid - gblocks) * W;
  }
  r.gw = r.blk * W + warp;
  return r;
}

// The key head whose b or a rows pool warp `w` takes first, or -1 (its first row group is a z pair).
__host__ __device__ inline int gdn_ba_head(int w, int Hk) { return w < Hk ? w : w < 2 * Hk ? w - Hk : -1; }

// The arrivals a step block waits for at its key head's counter: the group's blocks and the two pool warps (one or
// two blocks) with the head's b and a rows.
__host__ __device__ inline int gdn_need(int shift) { return (1 << shift) + 2; }

}  // namespace fern::cuda
