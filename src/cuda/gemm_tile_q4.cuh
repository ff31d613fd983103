// The exact-code Hopper prefill tile loop for 4-bit affine weights (FERN_GEMM_WG_PIPE=q4, the default where the
// format allows: 4-bit codes, groups a multiple of 64). Why: profiling the warp-specialized hi/lo loop
// (gemm_tile_ws.cuh; docs/notes/cuda-prefill-v5-ws.md) showed its MMA warps waiting ~40% of the time for the
// producers, whose dequantization (s q + b in fp32, split into bf16 hi + lo: ~15 ALU/FMA instructions per weight pair)
// saturated the integer pipe and waited on the scale loads. Here the weights enter the MMA as their codes:
//  - a code q is exact in bf16 as the number 128 + q: one LOP3 per pair of codes ((w & 0x000f000f) | 0x43004300 puts
//    codes i and i + 4 of a word into one bf16x2 register), so the producers only unpack and store. The pairs come
//    out in the K order n0 n4 n1 n5 n2 n6 n3 n7 inside each 8-code word; the x rows are written in the same order by
//    to_xbf_q4 (gemm_wg.h), and a dot product does not care about the order of its terms;
//  - two MMAs per K step, (128 + q) x_hi and (128 + q) x_lo, into a per-tile fp32 partial P (64 K = one group, or
//    part of one: groups a multiple of 64);
//  - per tile, the MMA warps promote the partial in fp32: acc += s P + (b - 128 s) xs, where xs is the tile's sum of
//    x (hi + lo) of that token row (to_xbf_q4). Precision: the products are exact, x = hi + lo to ~2^-17, the sums
//    fp32 (the split loop's numerics, gemm_tile.cuh).
// Roles (384 threads, one block per SM): two MMA warpgroups (threads 0..255, warpgroup g owns weight rows 64 g ..
// 64 g + 63, the same accumulator layout and epilogue mapping as the other wgmma loops) and one producer warpgroup
// (threads 256..383: thread 256 + r stages weight row r of the tile, so the caller computes its RowSrc from tid % 128
// for these threads: weight_row()). The producers fill a ring of S stages: cp.async of the x rows and of the row
// sums (their completion arrives on the stage's "full" mbarrier by itself: cp.async.mbarrier.arrive.noinc), the
// codes loaded two tiles ahead into registers, unpacked into the stage's swizzled tile, then a proxy fence and a
// second arrival. The MMA warpgroups wait on "full", issue the tile's 8 MMAs, wait for them, hand the stage back on
// "empty" and promote; the two warpgroups interleave, so one promotes while the other's MMAs run.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/cuda_util.cuh"
#include "cuda/gemm_tile.cuh"
#include "cuda/ptx.cuh"
#include "cuda/gemm_tile_wg.cuh"
#include "cuda/wgmma.cuh"

namespace fern::cuda::q4tile {

constexpr int kBW = 128;  // weight rows per block: two MMA warpgroups of 64
constexpr int kBK = 64;   // K per tile: one 128-byte swizzled row of bf16
constexpr int kRowBytes = 128;
constexpr int kConsumers = 256;
constexpr int kProducers = 128;
constexpr int kThreads = kConsumers + kProducers;

// Shared memory: S stages of the unpacked weight tile, the x hi and lo tiles (each on a 1024-byte boundary, the
// swizzle atom), the rows' (s, b - 128 s) and the token rows' sums; then the barriers.
template <int NTOK, int S>
struct Smem {
  static_assert(NTOK % 8 == 0, "token tiles of whole 8-row atoms");
  uint8_t w[S][kBW * kRowBytes];
  uint8_t xhi[S][NTOK * kRowBytes];
  uint8_t xlo[S][NTOK * kRowBytes];
  float2 sb[S][kBW];
  float xs[S][NTOK];
  uint64_t full[S];
  uint64_t empty[S];
};
template <int NTOK, int S>
constexpr size_t kSmemBytes = sizeof(Smem<NTOK, S>) + 1024;  // + alignment slack

template <int NTOK, int S>
__device__ __forceinline__ Smem<NTOK, S>& smem_of(unsigned char* raw) {
  return wgmma::smem_at_atom<Smem<NTOK, S>>(raw);
}

// The weight-tile row thread `tid` stages (producers only; other threads get a row too, unused).
__device__ __forceinline__ int weight_row(int tid) { return tid & (kProducers - 1); }

// Eight 4-bit codes (one word, code i in bits 4 i .. 4 i + 3) as four bf16x2 words of 128 + q, in the order
// (q0, q4), (q1, q5), (q2, q6), (q3, q7).
__device__ __forceinline__ uint4 unpack8(uint32_t w) {
  constexpr uint32_t kMask = 0x000f000fu, kExp = 0x43004300u;  // bf16 128.0 in both halves
  return make_uint4((w & kMask) | kExp, ((w >> 4) & kMask) | kExp, ((w >> 8) & kMask) | kExp,
                    ((w >> 12) & kMask) | kExp);
}

// One weight row's codes for one tile (32 bytes) and its group's scale and bias, as loaded: the bf16 bits are
// converted only when the tile is unpacked, two tiles later (converting at the load made every producer iteration
// wait for its own loads: the profile's top producer stall).
struct RowTile {
  uint4 lo, hi;  // codes 0..31, 32..63
  uint16_t s, b;
};

// acc (MMA warpgroup's 64 weight rows x NTOK tokens, wgmma layout) = W x^T over the width K, for the MMA threads;
// the producer threads return false (the caller returns: only the MMA threads hold results). xhi/xlo: the permuted
// bf16 rows of to_xbf_q4 (row stride K), xsum: their 64-wide sums (row stride K / 64); row_of(r): the global row of
// token-tile row r (< 0: padding); wsrc: the weight row of weight_row(tid) (w == nullptr: padding); gs: the group
// size, a multiple of 64. Must be called by all kThreads threads after the caller's last early return; does not end
// with a block barrier (the epilogues write global memory only).
template <int NTOK, int S, class RowOf>
__device__ __forceinline__ bool mainloop(Smem<NTOK, S>& sm, int K, int gs, const uint16_t* xhi, const uint16_t* xlo,
                                         const float* xsum, RowOf row_of, const gemm::RowSrc& wsrc,
                                         float (&acc)[NTOK / 2]) {
  static_assert(S >= 2, "a ring of at least two stages");
  const int tid = threadIdx.x;
  const int nk = K / kBK;
  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < S; ++s) {
      ptx::mbar_init(&sm.full[s], 2 * kProducers);  // per producer: its copies landing, its unpacked codes
      ptx::mbar_init(&sm.empty[s], kConsumers);
    }
  }
  __syncthreads();

  if (tid < kConsumers) {
    const int wg = tid >> 7, lane = tid & 31;
    const int r0 = 64 * wg + 16 * ((tid >> 5) & 3) + (lane >> 2);  // this thread's rows r0 and r0 + 8
    float part[NTOK / 2];
#pragma unroll
    for (int i = 0; i < NTOK / 2; ++i) acc[i] = 0.0f;
    for (int kt = 0; kt < nk; ++kt) {
      const int st = kt % S;
      ptx::mbar_wait(&sm.full[st], (kt / S) & 1);
      wgmma::fence_proxy_async();  // the stage's cp.async data, published by the barrier, to the MMA's proxy
      const float2 sb0 = sm.sb[st][r0], sb1 = sm.sb[st][r0 + 8];
#pragma unroll
      for (int i = 0; i < NTOK / 2; ++i) part[i] = 0.0f;
      wgmma::fence_operand(part);
      wgmma::fence();
      const uint8_t* w = &sm.w[st][wg * 64 * kRowBytes];
#pragma unroll
      for (int ks = 0; ks < kBK / 16; ++ks) {
        const uint64_t dw = wgmma::desc_sw128(w + 32 * ks);
        wgmma::mma_bf16<NTOK>(part, dw, wgmma::desc_sw128(&sm.xhi[st][32 * ks]));
        wgmma::mma_bf16<NTOK>(part, dw, wgmma::desc_sw128(&sm.xlo[st][32 * ks]));
      }
      wgmma::commit();
      wgmma::wait<0>();
      wgmma::fence_operand(part);
      // part[4 j + i]: row r0 + 8 (i / 2), token 8 j + 2 (lane % 4) + i % 2.
#pragma unroll
      for (int j = 0; j < NTOK / 8; ++j) {
        const float2 xs = *reinterpret_cast<const float2*>(&sm.xs[st][8 * j + 2 * (lane & 3)]);
        acc[4 * j + 0] = fmaf(sb0.x, part[4 * j + 0], fmaf(sb0.y, xs.x, acc[4 * j + 0]));
        acc[4 * j + 1] = fmaf(sb0.x, part[4 * j + 1], fmaf(sb0.y, xs.y, acc[4 * j + 1]));
        acc[4 * j + 2] = fmaf(sb1.x, part[4 * j + 2], fmaf(sb1.y, xs.x, acc[4 * j + 2]));
        acc[4 * j + 3] = fmaf(sb1.x, part[4 * j + 3], fmaf(sb1.y, xs.y, acc[4 * j + 3]));
      }
      ptx::mbar_arrive(&sm.empty[st]);  // the stage's operands, sums and scales are all read
    }
    return true;
  }

  // Producers: thread p stages weight row p.
  constexpr int kXChunks = NTOK * 8;  // 16-byte chunks of one x tile (hi or lo)
  constexpr int kXPer = kXChunks / kProducers;
  static_assert(kXChunks % kProducers == 0, "whole x chunks per producer");
  const int p = tid - kConsumers;
  int xrow[kXPer];  // global rows of this thread's x chunks (-1: padding)
  wgtile::x_rows<NTOK, kProducers>(xrow, row_of, p);
  const int srow = p < NTOK ? row_of(p) : -1;  // the token row whose sums this thread copies
  const int groups = K / kBK;
  const char* wbase = static_cast<const char*>(wsrc.w);
  const int gsh = 31 - __clz(gs / kBK);  // tiles per group: a power of two (make_qw checks the group size)

  auto load = [&](int kt, RowTile& t) {
    if (wbase == nullptr || kt >= nk) {  // padding row (zero codes, scale and bias: exact zeros) or past the end
      t.lo = t.hi = make_uint4(0, 0, 0, 0);
      t.s = t.b = 0;
      return;
    }
    const uint4* src = reinterpret_cast<const uint4*>(wbase + int64_t(kt) * (kBK / 2));
    t.lo = __ldg(src);
    t.hi = __ldg(src + 1);
    const int g = kt >> gsh;
    t.s = __ldg(wsrc.s + g);
    t.b = __ldg(wsrc.b + g);
  };

  RowTile cur, n1, n2;
  load(0, cur);
  load(1, n1);
  for (int kt = 0; kt < nk; ++kt) {
    const int st = kt % S;
    load(kt + 2, n2);  // two tiles ahead: their latency hides behind this tile's and the next one's work
    ptx::mbar_wait(&sm.empty[st], ((kt / S) & 1) ^ 1);
    wgtile::copy_x_tile<NTOK, kProducers>(sm.xhi[st], sm.xlo[st], xhi, xlo, xrow, p, K, kt * kBK);
    if (p < NTOK)
      ptx::cp_async4(&sm.xs[st][p], srow >= 0 ? xsum + int64_t(srow) * groups + kt : xsum, srow >= 0);
    ptx::cp_async_arrive_noinc(&sm.full[st]);
    const uint32_t words[8] = {cur.lo.x, cur.lo.y, cur.lo.z, cur.lo.w, cur.hi.x, cur.hi.y, cur.hi.z, cur.hi.w};
#pragma unroll
    for (int c = 0; c < 8; ++c) *reinterpret_cast<uint4*>(&sm.w[st][wgmma::sw128(p, c)]) = unpack8(words[c]);
    const float sc = bf16_to_f32(cur.s), bi = bf16_to_f32(cur.b);
    sm.sb[st][p] = make_float2(sc, fmaf(-128.0f, sc, bi));
    wgmma::fence_proxy_async();
    ptx::mbar_arrive(&sm.full[st]);
    cur = n1;
    n1 = n2;
  }
  return false;
}

}  // namespace fern::cuda::q4tile
