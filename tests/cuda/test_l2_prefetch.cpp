// The ranges a kernel requests into L2 for its successor (cuda/l2_prefetch.h): host logic only (no GPU needed);
// the kernels' side (the same output bits with the hint) is CudaMoe.FusedDecodeL2PrefetchSameBits.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda/l2_prefetch.h"

namespace fern::cuda {
namespace {

// Addresses only (never dereferenced): offsets from a 256-byte aligned base.
const char* at(size_t off) { return reinterpret_cast<const char*>(uintptr_t(1) << 40) + off; }

TEST(L2Prefetch, MergesNearPiecesAndTrimsToSixteenBytes) {
  // Three pieces of one region (codes, then scales 100 bytes later, then biases 4,096 bytes after the scales: both
  // gaps within kL2PrefetchGap) and one piece far away, given out of order.
  const L2Piece pieces[] = {{at(1 << 20), 5000}, {at(0), 1000}, {at(1100), 2000}, {at(3100 + 4096), 333}};
  const L2Prefetch pf = l2_prefetch_ranges(pieces, 1);
  ASSERT_EQ(pf.n, 2);
  EXPECT_EQ(pf.mode, 1);
  EXPECT_EQ(pf.p[0], at(0));
  EXPECT_EQ(pf.bytes[0], (3100u + 4096u + 333u) / 16u * 16u);  // the end rounded down to 16 bytes
  EXPECT_EQ(pf.p[1], at(1 << 20));
  EXPECT_EQ(pf.bytes[1], 4992u);
  for (int r = 0; r < pf.n; ++r) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(pf.p[r]) % 16, 0u);
    EXPECT_EQ(pf.bytes[r] % 16, 0u);
  }
}

TEST(L2Prefetch, UnalignedStartGapTooLargeAndEmptyPieces) {
  const L2Piece pieces[] = {{at(5), 100}, {at(105 + kL2PrefetchGap + 1), 64}, {nullptr, 100}, {at(9000), 0},
                            {at(20003), 10}};  // the last holds no whole 16-byte unit
  const L2Prefetch pf = l2_prefetch_ranges(pieces, 2);
  ASSERT_EQ(pf.n, 2);
  EXPECT_EQ(pf.mode, 2);
  EXPECT_EQ(pf.p[0], at(16));  // start rounded up inside the piece
  EXPECT_EQ(pf.bytes[0], 80u);  // [16, 96): the whole 16-byte units of [5, 105)
  EXPECT_EQ(pf.p[1], at(105 + kL2PrefetchGap + 1 + 15) - (105 + kL2PrefetchGap + 1 + 15) % 16);
}

TEST(L2Prefetch, CapsRangesAndBytes) {
  std::vector<L2Piece> pieces;
  for (int i = 0; i < 6; ++i) pieces.push_back({at(size_t(i) << 30), 4096});  // six far-apart pieces
  L2Prefetch pf = l2_prefetch_ranges(pieces, 1);
  EXPECT_EQ(pf.n, kL2PrefetchRanges);  // the first four by address
  EXPECT_EQ(pf.p[3], at(size_t(3) << 30));
  const L2Piece big[] = {{at(0), size_t(100) << 20}, {at(size_t(1) << 33), 4096}};
  pf = l2_prefetch_ranges(big, 1);
  ASSERT_EQ(pf.n, 1);  // the cap is spent by the first
  EXPECT_EQ(pf.bytes[0], kL2PrefetchMaxBytes);
}

TEST(L2Prefetch, ModeZeroIsNothing) {
  const L2Piece pieces[] = {{at(0), 4096}};
  const L2Prefetch pf = l2_prefetch_ranges(pieces, 0);
  EXPECT_EQ(pf.n, 0);
  EXPECT_EQ(pf.mode, 0);
}

}  // namespace
}  // namespace fern::cuda
