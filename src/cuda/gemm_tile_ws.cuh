// The warp-specialized form of the Hopper prefill tile loop (gemm_tile_wg.cuh has the numerics and the operand
// layout; this loop computes exactly the same products in the same order, so its results are bit-identical).
// Why: the synchronous loop is latency bound per K tile (docs/notes/cuda-prefill-v4-wg.md: ~3,700 cycles per tile
// against 768-1,536 cycles of MMA work), because the same warps dequantize, copy, meet at a block barrier and wait
// for their MMAs to drain every tile. Here the roles are split:
//  - two consumer warpgroups (threads 0..255, as in the synchronous loop: warpgroup g owns weight rows 64 g ..
//    64 g + 63 of the block's 128) only issue the MMAs of tile kt, then wait for tile kt - 1's to finish (one group
//    in flight while the next is issued) and hand its stage back;
//  - two producer warpgroups (threads 256..511, thread p stages weight row (p - 256) / 2, half (p - 256) % 2, the
//    mapping the callers already compute from tid % 256) fill a ring of S stages: cp.async of the x rows, the
//    weight codes loaded one tile ahead into registers and dequantized straight into the stage's swizzled tile.
// Handoffs are mbarriers, one "full" and one "empty" per stage. A producer publishes stage kt one tile late: after
// its cp.async group of tile kt has landed (cp.async.wait_group 1 at tile kt + 1) and a generic-to-async proxy
// fence, so the x copies of one tile stay in flight while it dequantizes the next; this needs S >= 3.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/gemm_tile_wg.cuh"

namespace fern::cuda::wstile {

using wgtile::kBK;
using wgtile::kBW;
using wgtile::kTileRowBytes;
constexpr int kConsumers = 256;
constexpr int kProducers = 256;
constexpr int kThreads = kConsumers + kProducers;

// Shared memory: S stages of x (hi, lo) and dequantized weights (hi, lo), each tile on a 1024-byte boundary (the
// swizzle atom), then the barriers. The codes never pass through shared memory.
template <int NTOK, int S>
struct Smem {
  static_assert(NTOK % 8 == 0, "token tiles of whole 8-row atoms");
  uint8_t xhi[S][NTOK * kTileRowBytes];
  uint8_t xlo[S][NTOK * kTileRowBytes];
  uint8_t whi[S][kBW * kTileRowBytes];
  uint8_t wlo[S][kBW * kTileRowBytes];
  uint64_t full[S];
  uint64_t empty[S];
};
template <int NTOK, int S>
constexpr size_t kSmemBytes = sizeof(Smem<NTOK, S>) + 1024;  // + alignment slack

template <int NTOK, int S>
__device__ __forceinline__ Smem<NTOK, S>& smem_of(unsigned char* raw) {
  return wgmma::smem_at_atom<Smem<NTOK, S>>(raw);
}

// The codes of one thread's half weight row for one K tile (16 or 32 bytes) and the scale/bias of its two 16-wide
// segments.
template <int BITS>
struct HalfTile {
  uint32_t w[BITS];  // 4-bit: 4 words (32 codes); 8-bit: 8 words
  float2 sb[2];
};

// acc (consumer warpgroup's 64 weight rows x NTOK tokens, wgmma layout) += W x^T over the width K, for the consumer
// threads; the producer threads return false (the caller returns: only consumers hold results). Arguments as
// wgtile::mainloop; wsrc is the weight row of thread tid % 256. Must be called by all kThreads threads of the block,
// after the caller's last early return. Does not end with a block barrier: the caller must not reuse the shared
// memory (the epilogues write global memory only).
template <int BITS, int NTOK, int S, class RowOf>
__device__ __forceinline__ bool mainloop(Smem<NTOK, S>& sm, int K, int gs, const uint16_t* __restrict__ xhi,
                                         const uint16_t* __restrict__ xlo, RowOf row_of, const gemm::RowSrc& wsrc,
                                         float (&acc)[NTOK / 2]) {
  static_assert(BITS == 4 || BITS == 8, "affine codes only");
  static_assert(S >= 3, "a stage is published one tile late: at least three stages");
  const int tid = threadIdx.x;
  const int nk = K / kBK;
  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < S; ++s) {
      ptx::mbar_init(&sm.full[s], kProducers);
      ptx::mbar_init(&sm.empty[s], kConsumers);
    }
  }
  __syncthreads();

  if (tid < kConsumers) {
    const int wg = tid >> 7;
#pragma unroll
    for (int i = 0; i < NTOK / 2; ++i) acc[i] = 0.0f;
    for (int kt = 0; kt < nk; ++kt) {
      const int st = kt % S;
      ptx::mbar_wait(&sm.full[st], (kt / S) & 1);
      wgtile::mma_tile<NTOK>(acc, &sm.whi[st][wg * 64 * kTileRowBytes], &sm.wlo[st][wg * 64 * kTileRowBytes],
                             sm.xhi[st], sm.xlo[st]);
      if (kt > 0) {
        wgmma::wait<1>();  // tile kt - 1's MMAs are done reading their stage
        wgmma::fence_operand(acc);
        ptx::mbar_arrive(&sm.empty[(kt - 1) % S]);
      }
    }
    wgmma::wait<0>();
    wgmma::fence_operand(acc);
    return true;
  }

  // Producers.
  constexpr int kXChunks = NTOK * 8;  // 16-byte chunks of one x tile (hi or lo)
  constexpr int kXPer = (kXChunks + kProducers - 1) / kProducers;
  constexpr int kHalfBytes = BITS * kBK / 16;  // code bytes of a half row per tile: 16 or 32
  const int p = tid - kConsumers;
  int xrow[kXPer];  // global rows of this thread's x chunks (-1: padding)
  wgtile::x_rows<NTOK, kProducers>(xrow, row_of, p);
  const int wr = p >> 1, half = p & 1;
  const char* wbase = static_cast<const char*>(wsrc.w);

  auto load = [&](int kt, HalfTile<BITS>& h) {
    if (wbase == nullptr) {  // padding row: zero codes, zero scale and bias give exact zeros
#pragma unroll
      for (int i = 0; i < BITS; ++i) h.w[i] = 0;
      h.sb[0] = h.sb[1] = make_float2(0.0f, 0.0f);
      return;
    }
    const uint4* src = reinterpret_cast<const uint4*>(wbase + (int64_t(kt) * kBK * BITS) / 8 + half * kHalfBytes);
#pragma unroll
    for (int u = 0; u < BITS / 4; ++u) {
      const uint4 v = __ldg(src + u);
      h.w[4 * u] = v.x, h.w[4 * u + 1] = v.y, h.w[4 * u + 2] = v.z, h.w[4 * u + 3] = v.w;
    }
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int k = kt * kBK + 32 * half + 16 * u;
      h.sb[u] = make_float2(bf16_at(wsrc.s, k / gs), bf16_at(wsrc.b, k / gs));
    }
  };
  auto copy_x = [&](int kt, int st) {
    wgtile::copy_x_tile<NTOK, kProducers>(sm.xhi[st], sm.xlo[st], xhi, xlo, xrow, p, K, kt * kBK);
  };
  // This thread's half row of the tile: two 16-wide segments, chunks 4 half .. 4 half + 3 of row wr.
  auto dequant = [&](const HalfTile<BITS>& h, int st) {
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      uint32_t w[BITS / 2];
#pragma unroll
      for (int i = 0; i < BITS / 2; ++i) w[i] = h.w[u * (BITS / 2) + i];
      uint32_t hi[8], lo[8];
      wgtile::dequant16<BITS>(w, h.sb[u], hi, lo);
      const int c0 = 4 * half + 2 * u;
#pragma unroll
      for (int cc = 0; cc < 2; ++cc) {
        const uint32_t d = wgmma::sw128(wr, c0 + cc);
        *reinterpret_cast<uint4*>(&sm.whi[st][d]) = make_uint4(hi[4 * cc], hi[4 * cc + 1], hi[4 * cc + 2], hi[4 * cc + 3]);
        *reinterpret_cast<uint4*>(&sm.wlo[st][d]) = make_uint4(lo[4 * cc], lo[4 * cc + 1], lo[4 * cc + 2], lo[4 * cc + 3]);
      }
    }
  };

  HalfTile<BITS> cur, nxt;
  if (nk > 0) load(0, cur);
  for (int kt = 0; kt < nk; ++kt) {
    const int st = kt % S;
    if (kt + 1 < nk) load(kt + 1, nxt);  // one tile ahead: its latency hides behind this tile's work
    ptx::mbar_wait(&sm.empty[st], ((kt / S) & 1) ^ 1);
    copy_x(kt, st);
    ptx::cp_commit();
    dequant(cur, st);
    if (kt > 0) {
      ptx::cp_wait<1>();  // tile kt - 1's copies have landed
      wgmma::fence_proxy_async();
      ptx::mbar_arrive(&sm.full[(kt - 1) % S]);
    }
    if (kt + 1 < nk) cur = nxt;
  }
  if (nk > 0) {
    ptx::cp_wait<0>();
    wgmma::fence_proxy_async();
    ptx::mbar_arrive(&sm.full[(nk - 1) % S]);
  }
  return false;
}

}  // namespace fern::cuda::wstile
