// The layout of a shared region for a layer's input projections (weight_group.h): host arithmetic only, so it runs
// without a GPU. Matrices of one format follow each other with no gap in each of the three arrays; anything else
// (mixed bits or widths, dense or stacked weights) gets no region.
#include <gtest/gtest.h>

#include <vector>

#include "cuda/weight_group.h"

namespace fern {
namespace {

// A weight's shape and format only (no memory), as the random device model builds them before allocating.
LinearWeight shaped(int64_t out, int64_t in, int bits, int gs = 64) {
  LinearWeight w;
  w.kind = LinearWeight::Kind::Affine;
  w.out = out;
  w.in = in;
  w.bits = bits;
  w.group_size = gs;
  w.w = Tensor(nullptr, DType::U32, {out, in * bits / 32}, Device::Cuda);
  w.scales = Tensor(nullptr, DType::BF16, {out, in / gs}, Device::Cuda);
  w.biases = Tensor(nullptr, DType::BF16, {out, in / gs}, Device::Cuda);
  return w;
}

std::vector<const LinearWeight*> ptrs(const std::vector<LinearWeight>& ws) {
  std::vector<const LinearWeight*> p;
  for (const LinearWeight& w : ws) p.push_back(&w);
  return p;
}

TEST(WeightGroup, GdnProjectionsBackToBack) {
  const std::vector<LinearWeight> ws = {shaped(8192, 2048, 4), shaped(4096, 2048, 4), shaped(32, 2048, 4),
                                        shaped(32, 2048, 4)};
  const cuda::GroupLayout L = cuda::group_layout(ptrs(ws));
  ASSERT_EQ(L.at.size(), 4u);
  const size_t code_row = 1024, sb_row = 64;  // 2,048 4-bit codes; 32 bf16 scales (or biases)
  size_t rows = 0;
  for (size_t i = 0; i < ws.size(); ++i) {
    EXPECT_EQ(L.at[i].w, rows * code_row) << i;
    EXPECT_EQ(L.at[i].s - L.at[0].s, rows * sb_row) << i;
    EXPECT_EQ(L.at[i].b - L.at[0].b, rows * sb_row) << i;
    rows += size_t(ws[i].out);
  }
  EXPECT_EQ(L.at[0].s % 256, 0u);
  EXPECT_GE(L.at[0].s, rows * code_row);
  EXPECT_GE(L.at[0].b, L.at[0].s + rows * sb_row);
  EXPECT_EQ(L.bytes, L.at[0].b + rows * sb_row);

  std::vector<char> region(L.bytes);  // views point into the region, shapes and formats kept
  const std::vector<LinearWeight> v = cuda::group_views(ptrs(ws), L, region.data());
  ASSERT_EQ(v.size(), 4u);
  EXPECT_EQ(v[1].w.data, region.data() + L.at[1].w);
  EXPECT_EQ(v[3].biases.data, region.data() + L.at[3].b);
  EXPECT_EQ(v[2].out, 32);
  EXPECT_EQ(v[2].w.device, Device::Cuda);
}

TEST(WeightGroup, OddSizesRoundedTo16Bytes) {
  // 3 rows of 64 4-bit codes (32 bytes each: 96) and one group per row (6 bytes of scales: rounded up to 16).
  const std::vector<LinearWeight> ws = {shaped(3, 64, 4), shaped(5, 64, 4)};
  const cuda::GroupLayout L = cuda::group_layout(ptrs(ws));
  ASSERT_EQ(L.at.size(), 2u);
  EXPECT_EQ(L.at[1].w, 96u);
  EXPECT_EQ(L.at[1].s - L.at[0].s, 16u);
  EXPECT_EQ(L.at[1].b - L.at[0].b, 16u);
}

TEST(WeightGroup, NoRegionForMixedOrDense) {
  EXPECT_TRUE(cuda::group_layout(ptrs({shaped(64, 2048, 4), shaped(64, 2048, 8)})).at.empty());
  EXPECT_TRUE(cuda::group_layout(ptrs({shaped(64, 2048, 4), shaped(64, 1024, 4)})).at.empty());
  EXPECT_TRUE(cuda::group_layout(ptrs({shaped(64, 2048, 4, 64), shaped(64, 2048, 4, 32)})).at.empty());
  LinearWeight dense;
  dense.kind = LinearWeight::Kind::Dense;
  dense.out = 64;
  dense.in = 2048;
  dense.w = Tensor(nullptr, DType::BF16, {64, 2048}, Device::Cuda);
  EXPECT_TRUE(cuda::group_layout(ptrs({dense, dense})).at.empty());
  LinearWeight stack = shaped(64, 2048, 4);
  stack.experts = 2;
  EXPECT_TRUE(cuda::group_layout(ptrs({stack, shaped(64, 2048, 4)})).at.empty());
  EXPECT_TRUE(cuda::group_layout({}).at.empty());
}

}  // namespace
}  // namespace fern
