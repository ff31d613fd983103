// The Hopper prefill tile loop a kernel instantiates (gemm_wg.h, FERN_GEMM_WG_PIPE): the synchronous hi/lo loop
// (gemm_tile_wg.cuh, 256 threads), its warp-specialized form (gemm_tile_ws.cuh, 512 threads) or the exact-code loop
// for 4-bit codes (gemm_tile_q4.cuh, 384 threads). All three leave the results in threads 0..255 in the same
// accumulator layout, so one epilogue serves them; they differ in which threads stage which weight row.
#pragma once
#include <algorithm>
#include <type_traits>

#include "cuda/gemm_f16.h"
#include "cuda/gemm_tile_q4.cuh"
#include "cuda/gemm_tile_wg.cuh"
#include "cuda/gemm_tile_ws.cuh"

namespace fern::cuda::wgloop {

// kQ4H: the exact-code loop on fp16 rows of x (FERN_GEMM_WG_PIPE=q4h; X16::lo == nullptr), one MMA per step; kQ4B:
// the exact-code loop with the bias term on the tensor cores (FERN_GEMM_WG_PIPE=q4b; X16::bsum set).
enum : int { kSync = 0, kWs = 1, kQ4 = 2, kQ4H = 3, kQ4B = 4 };
constexpr bool is_q4(int P) { return P == kQ4 || P == kQ4H || P == kQ4B; }

// Calls f(std::integral_constant<int, P>{}) with the exact-code loop kind that rows x (x.q4) take: kQ4H for fp16
// rows, kQ4B for rows with the sums' pieces, else kQ4.
template <class F>
void with_q4_loop(const X16& x, F&& f) {
  if (x.q4h())
    f(std::integral_constant<int, kQ4H>{});
  else if (x.q4b())
    f(std::integral_constant<int, kQ4B>{});
  else
    f(std::integral_constant<int, kQ4>{});
}

template <int P>
constexpr int kThreads = P == kSync ? wgtile::kThreads : P == kWs ? wstile::kThreads : q4tile::kThreads;
template <int BITS, int NTOK, int S, int P>
constexpr size_t kSmemBytes = P == kSync ? wgtile::kSmemBytes<NTOK, BITS, S>
                              : P == kWs ? wstile::kSmemBytes<NTOK, S>
                                         : q4tile::kSmemBytes<NTOK, S>;

// The weight-tile row thread `tid` stages (the caller computes that row's RowSrc).
template <int P>
__device__ __forceinline__ int weight_row(int tid) {
  return is_q4(P) ? q4tile::weight_row(tid) : (tid & 255) >> 1;
}

// Runs the loop on the block's dynamic shared memory `raw` over the rows of x (the loop's layout: x.q4 for kQ4 and
// kQ4H), for n_items weight tiles of one token tile: the exact-code loop takes them one after the other through one
// ring (q4tile::mainloop_items), the other loops take one item per block (their callers launch them so).
// epilogue(item, acc) runs on the threads holding results, once per item; src_at(item, r): the gemm::RowSrc of
// weight-tile row r in that item (w == nullptr: padding), from which the loop takes the row this thread stages
// (weight_row) and, for kQ4B, the bias arrays of the rows its MMA warps hold.
template <int BITS, int NTOK, int S, int P, class RowOf, class SrcAt, class Epilogue>
__device__ __forceinline__ void run_items(unsigned char* raw, int K, int gs, const X16& x, RowOf row_of, int n_items,
                                          SrcAt src_at, Epilogue epilogue) {
  const int wr = weight_row<P>(threadIdx.x);
  auto wsrc_of = [&](int item) { return src_at(item, wr); };
  if constexpr (is_q4(P)) {
    auto bias_of = [&](int item, int r) { return src_at(item, r).b; };
    static_assert(BITS == 4, "the exact-code loop takes 4-bit codes");
    constexpr int F = P == kQ4H ? q4tile::kHalf : P == kQ4B ? q4tile::kBias : q4tile::kHiLo;
    q4tile::mainloop_items<NTOK, S, F>(q4tile::smem_of<NTOK, S>(raw), K, gs, x.x, x.lo, x.sums, x.bsum,
                                       static_cast<int>(x.bk), row_of, n_items, wsrc_of, bias_of, epilogue);
  } else {
    (void)n_items;
    float acc[NTOK / 2];
    if constexpr (P == kWs) {
      if (wstile::mainloop<BITS, NTOK, S>(wstile::smem_of<NTOK, S>(raw), K, gs, x.x, x.lo, row_of, wsrc_of(0), acc))
        epilogue(0, acc);
    } else {
      wgtile::mainloop<BITS, NTOK, S>(wgtile::smem_of<NTOK, BITS, S>(raw), K, gs, x.x, x.lo, row_of, wsrc_of(0), acc);
      epilogue(0, acc);
    }
  }
}

// Ring depth of the exact-code loop: the deepest (at most 8) that fits one block per SM in 227 KB of shared memory.
template <int NTOK>
constexpr int kQ4Stages = std::min<int>(8, (227 * 1024 - 2048) / int(sizeof(q4tile::Smem<NTOK, 1>)));
static_assert(kQ4Stages<64> == 8 && kQ4Stages<96> == 7 && kQ4Stages<128> == 5, "ring depths as documented");

}  // namespace fern::cuda::wgloop
