// The row assignment of the GDN form of the input projections' kernel (cuda/gdn_rows.h, linear.cu gdn_proj_step),
// checked on the host for the grids the kernel can get: every row of the table qkv | z | b | a taken exactly once,
// a key head's step blocks waiting for exactly the blocks that count in at its counter (a count too high hangs the
// kernel, too low lets a step read rows not yet written), every (value head, column block) stepped once, the b and a
// rows in the grid's first blocks and the step blocks right after them. The walk over row groups is the kernel's: warp gw of a region takes row
// groups gw, gw + warps, ... of two rows each. No GPU needed.
#include <gtest/gtest.h>

#include <set>
#include <utility>
#include <vector>

#include "cuda/gdn_rows.h"

namespace fern {
namespace {

using cuda::GdnRows;

void check(int Hk, int shift, int grid, int W = 8) {
  SCOPED_TRACE(testing::Message() << "Hk " << Hk << " groups of " << (1 << shift) << " grid " << grid);
  const int Hv = cuda::kGdnVPerK * Hk, key_dim = Hk * cuda::kGdnDk, conv_dim = 2 * key_dim + Hv * cuda::kGdnDv;
  const int vd = Hv * cuda::kGdnDv, rows = conv_dim + vd + 2 * Hv, ba0 = conv_dim + vd;
  std::vector<int> taken(size_t(rows), 0), arrivals(size_t(Hk), 0);
  std::set<std::pair<int, int>> stepped;
  int last_ba_block = -1, first_group_block = grid;
  for (int b = 0; b < grid; ++b) {
    std::set<int> ba_heads;  // key heads whose b or a rows this block takes
    GdnRows r0{};
    for (int w = 0; w < W; ++w) {
      const GdnRows r = cuda::gdn_rows(Hk, conv_dim, shift, b, grid, w, W);
      if (w == 0) r0 = r;
      for (int lg = r.gw; 2 * lg < r.n; lg += r.warps) {
        for (int i = 0; i < 2; ++i) {
          const int v = 2 * lg + i;
          if (v >= r.n) continue;
          const int row = r.row(v);
          ASSERT_GE(row, 0);
          ASSERT_LT(row, rows);
          ++taken[size_t(row)];
          if (r.kh >= 0) {  // a group's rows: its own key head's q, k or v
            const bool q = row >= r.kh * cuda::kGdnDk && row < (r.kh + 1) * cuda::kGdnDk;
            const bool k = row >= key_dim + r.kh * cuda::kGdnDk && row < key_dim + (r.kh + 1) * cuda::kGdnDk;
            const int v0 = 2 * key_dim + r.kh * cuda::kGdnVPerK * cuda::kGdnDv;
            EXPECT_TRUE(q || k || (row >= v0 && row < v0 + cuda::kGdnVPerK * cuda::kGdnDv)) << "row " << row;
          } else if (row >= ba0) {
            ba_heads.insert(((row - ba0) % Hv) / cuda::kGdnVPerK);
          }
        }
      }
    }
    // Where the block counts in (the kernel's tail): a group's block at its key head, a pool block once per warp
    // whose first row group is b or a.
    if (r0.kh >= 0) {
      EXPECT_TRUE(ba_heads.empty());
      ++arrivals[size_t(r0.kh)];
      first_group_block = std::min(first_group_block, b);
      if (r0.blk < cuda::kGdnDuty) {
        const int h = r0.kh * cuda::kGdnVPerK + r0.blk / cuda::kGdnColBlocks, cb = r0.blk % cuda::kGdnColBlocks;
        EXPECT_TRUE(stepped.insert({h, cb}).second) << "value head " << h << " column block " << cb << " twice";
      }
    } else {
      std::set<int> counted;
      for (int w = r0.gw; w < r0.gw + W; ++w) {
        const int kh = cuda::gdn_ba_head(w, Hk);
        if (kh < 0) continue;
        ++arrivals[size_t(kh)];
        counted.insert(kh);
      }
      EXPECT_EQ(counted, ba_heads) << "block " << b << " counts in where its b and a rows are not";
      if (!ba_heads.empty()) last_ba_block = b;
    }
  }
  for (int row = 0; row < rows; ++row) ASSERT_EQ(taken[size_t(row)], 1) << "row " << row;
  for (int kh = 0; kh < Hk; ++kh) EXPECT_EQ(arrivals[size_t(kh)], cuda::gdn_need(shift)) << "key head " << kh;
  EXPECT_EQ(stepped.size(), size_t(Hv * cuda::kGdnColBlocks));
  EXPECT_LT(last_ba_block, first_group_block) << "the b and a rows' blocks start first";
  // The step blocks next, one after another (on SMs of their own where blocks go round-robin).
  for (int b = 0; b < grid; ++b) {
    const GdnRows r = cuda::gdn_rows(Hk, conv_dim, shift, b, grid, 0, W);
    const bool step = r.kh >= 0 && r.blk < cuda::kGdnDuty;
    const int first = cuda::gdn_ba_blocks(Hk, W);
    EXPECT_EQ(step, b >= first && b < first + Hk * cuda::kGdnDuty) << "block " << b;
  }
}

// The H200 (132 SMs, three blocks per SM: groups of 16, a pool of 140), a 108-SM GPU, the smallest grids that
// gdn_proj_step_ok accepts for each group size (a pool of 4 Hk blocks), groups of 8, fewer key heads.
TEST(CudaGdnRows, EveryRowOnceAndTheRightArrivals) {
  check(16, 4, 396);
  check(16, 4, 324);
  check(16, 4, 16 * 16 + 4 * 16);
  check(16, 3, 16 * 8 + 4 * 16);
  check(16, 3, 396);
  check(8, 4, 200);
  check(4, 3, 61);
}

}  // namespace
}  // namespace fern
