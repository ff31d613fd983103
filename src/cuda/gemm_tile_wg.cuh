// The Hopper tile loop of the prefill GEMMs (FERN_GEMM=wg, gemm_wg.h): warpgroup MMAs (wgmma.cuh) with the weights
// as the 64-row A operand and the token rows as the N side ("swapped": the weight tile, 128 rows, is the wide side,
// the token tile, NTOK = 16..128 rows, the narrow one, so that one kernel serves the dense projections and the
// uneven expert groups). One block of 256 threads = two warpgroups, each owning 64 of the block's 128 weight rows and
// all NTOK token rows. Numerics (no per-group epilogue, no partial sums):
//  - x arrives as bf16 rows hi = bf16(x), lo = bf16(x - hi) (gemm_wg.h: once per op), x = hi + lo to ~2^-17;
//  - each weight tile is dequantized ONCE per block into shared memory, w = s q + b in fp32 (exact: the bf16 scale
//    times a 4/8-bit code has at most 16 significant bits) split the same way into bf16 hi + lo;
//  - three bf16 MMAs per K step, x_hi w_hi + x_lo w_hi + x_hi w_lo, fp32 accumulation: each product to ~2^-16
//    relative (the dropped x_lo w_lo is below 2^-16 of it), the same order as the split loop (gemm_tile.cuh).
// Pipeline per 64-wide K tile kt (one barrier): the MMAs of tile kt are issued, and while they run the block issues
// the cp.async copies of tile kt + S - 1 (x rows and raw codes), waits for tile kt + 1's and dequantizes its codes
// into the other weight buffer; then it waits for its MMAs and meets at the barrier. Each thread dequantizes exactly
// the codes it copied itself (weight row tid / 2, half tid % 2 of the tile), so only the barrier publishes them.
// Measured on the H200 (docs/notes/cuda-prefill-v4-wg.md): 1.9x the split loop on the dense projections, 1.18x on
// the MoE block at 2,048 rows (with S = 2 for its 64-token tiles: two blocks per SM). Per K tile the loop is latency
// bound (a block-wide barrier and a full wgmma drain every tile): a version with the weights as register operands,
// which removed the weight tile's shared-memory traffic, was slower (1.4x dense, 0.74x MoE) and is not kept.
// The caller decides the global row of each token-tile row (a functor, -1 for padding) and the weight row each
// thread stages (gemm::RowSrc, row tid / 2, as the other tile loops). K must be a multiple of 64, the affine group a
// multiple of 16.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/cuda_util.cuh"
#include "cuda/gemm_tile.cuh"
#include "cuda/ptx.cuh"
#include "cuda/wgmma.cuh"

namespace fern::cuda::wgtile {

constexpr int kThreads = 256;
constexpr int kBW = 128;  // weight rows per block: two warpgroups of 64
constexpr int kBK = 64;   // K per tile: one 128-byte swizzled row of bf16
constexpr int kTileRowBytes = 128;
template <int BITS>
constexpr int kCodeBytes = BITS * kBK / 8;  // raw code bytes of one weight row per tile (32 or 64)

// Shared memory: S stages of x (hi, lo) and raw codes, two buffers of dequantized weights (hi, lo). Every tile
// starts on a 1024-byte boundary (the swizzle atom); the dynamic shared memory is aligned by the kernel.
template <int NTOK, int BITS, int S>
struct Smem {
  static_assert(NTOK % 8 == 0, "token tiles of whole 8-row atoms");
  uint8_t xhi[S][NTOK * kTileRowBytes];
  uint8_t xlo[S][NTOK * kTileRowBytes];
  uint8_t whi[2][kBW * kTileRowBytes];
  uint8_t wlo[2][kBW * kTileRowBytes];
  uint8_t codes[S][kBW][kCodeBytes<BITS>];
};
template <int NTOK, int BITS, int S>
constexpr size_t kSmemBytes = sizeof(Smem<NTOK, BITS, S>) + 1024;  // + alignment slack

template <int NTOK, int BITS, int S>
__device__ __forceinline__ Smem<NTOK, BITS, S>& smem_of(unsigned char* raw) {
  return wgmma::smem_at_atom<Smem<NTOK, BITS, S>>(raw);
}

// fp32 value of 4-bit code n of word w (exact: 2^23 + q as a float, minus 2^23).
__device__ __forceinline__ float code4(uint32_t w, int n) {
  return __uint_as_float(0x4b000000u | ((w >> (4 * n)) & 0xfu)) - 8388608.0f;
}
__device__ __forceinline__ float code8(uint32_t w, int n) {
  return __uint_as_float(0x4b000000u | ((w >> (8 * n)) & 0xffu)) - 8388608.0f;
}

// Splits two fp32 weights into bf16 hi and lo pairs.
__device__ __forceinline__ void split2(float a, float b, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  const float2 hf = __bfloat1622float2(h);
  const __nv_bfloat162 l = __floats2bfloat162_rn(a - hf.x, b - hf.y);
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = *reinterpret_cast<const uint32_t*>(&l);
}

// The x rows of a token tile, NT threads per block side: thread t (< NT) copies 16-byte chunk t % 8 of tile rows
// t / 8 + (NT / 8) j, j < PER. xrow caches their global rows (row_of(r); -1 for padding, copied as zeros).
template <int NTOK, int NT, int PER, class RowOf>
__device__ __forceinline__ void x_rows(int (&xrow)[PER], RowOf row_of, int t) {
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    const int r = (t >> 3) + (NT / 8) * j;
    xrow[j] = r < NTOK ? row_of(r) : -1;
  }
}
// Issues the cp.async copies of this thread's chunks of K tile k0 .. k0 + 63 into the swizzled stage tiles dhi, dlo
// (LO = false: the hi tile only).
template <int NTOK, int NT, bool LO = true, int PER>
__device__ __forceinline__ void copy_x_tile(uint8_t* dhi, uint8_t* dlo, const uint16_t* xhi, const uint16_t* xlo,
                                            const int (&xrow)[PER], int t, int K, int k0) {
  const int xch = t & 7;
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    const int r = (t >> 3) + (NT / 8) * j;
    if (r < NTOK) {
      const bool ok = xrow[j] >= 0;
      const int64_t off = ok ? int64_t(xrow[j]) * K + k0 + 8 * xch : 0;
      const uint32_t d = wgmma::sw128(r, xch);
      ptx::cp_async16(dhi + d, xhi + off, ok);
      if constexpr (LO) ptx::cp_async16(dlo + d, xlo + off, ok);
    }
  }
}

// Issues (and commits as one group) the 12 MMAs of one K tile for this warpgroup: its 64 dequantized weight rows
// (wh, wl: hi and lo) times the NTOK x rows (xh, xl), all swizzled 128-byte rows in shared memory.
template <int NTOK>
__device__ __forceinline__ void mma_tile(float (&acc)[NTOK / 2], const uint8_t* wh, const uint8_t* wl,
                                         const uint8_t* xh, const uint8_t* xl) {
  wgmma::fence_operand(acc);
  wgmma::fence();
#pragma unroll
  for (int ks = 0; ks < kBK / 16; ++ks) {
    const uint64_t dwh = wgmma::desc_sw128(wh + 32 * ks), dwl = wgmma::desc_sw128(wl + 32 * ks);
    const uint64_t dxh = wgmma::desc_sw128(xh + 32 * ks), dxl = wgmma::desc_sw128(xl + 32 * ks);
    wgmma::mma_bf16<NTOK>(acc, dwh, dxh);
    wgmma::mma_bf16<NTOK>(acc, dwh, dxl);
    wgmma::mma_bf16<NTOK>(acc, dwl, dxh);
  }
  wgmma::commit();
  wgmma::fence_operand(acc);
}

// Dequantizes 16 codes (w: 2 words of 4-bit or 4 of 8-bit codes) with scale sb.x and bias sb.y into 16 bf16 hi
// and lo values (8 pairs each), in K order.
template <int BITS>
__device__ __forceinline__ void dequant16(const uint32_t (&w)[BITS / 2], float2 sb, uint32_t (&hi)[8],
                                          uint32_t (&lo)[8]) {
#pragma unroll
  for (int p = 0; p < 8; ++p) {
    float a, b;
    if constexpr (BITS == 4) {
      a = code4(w[p / 4], 2 * (p % 4));
      b = code4(w[p / 4], 2 * (p % 4) + 1);
    } else {
      a = code8(w[p / 2], 2 * (p % 2));
      b = code8(w[p / 2], 2 * (p % 2) + 1);
    }
    split2(fmaf(sb.x, a, sb.y), fmaf(sb.x, b, sb.y), hi[p], lo[p]);
  }
}

// acc (this warpgroup's 64 weight rows x NTOK tokens, wgmma layout) += W x^T over the width K.
// xhi/xlo: the bf16 rows (row stride K); row_of(r): the global row of token-tile row r (< 0: padding);
// wsrc: this thread's weight row (tid / 2; w == nullptr: padding); gs: the affine group size.
// Ends with a barrier, so the caller may reuse the shared memory.
template <int BITS, int NTOK, int S, class RowOf>
__device__ __forceinline__ void mainloop(Smem<NTOK, BITS, S>& sm, int K, int gs, const uint16_t* __restrict__ xhi,
                                         const uint16_t* __restrict__ xlo, RowOf row_of, const gemm::RowSrc& wsrc,
                                         float (&acc)[NTOK / 2]) {
  static_assert(BITS == 4 || BITS == 8, "affine codes only");
  static_assert(S >= 2, "at least double buffering");
  constexpr int kXChunks = NTOK * 8;  // 16-byte chunks of one x tile (hi or lo)
  constexpr int kXPer = (kXChunks + kThreads - 1) / kThreads;
  constexpr int kCB = kCodeBytes<BITS>;
  const int tid = threadIdx.x, wg = tid >> 7;

  int xrow[kXPer];  // global rows of this thread's x chunks (-1: padding)
  x_rows<NTOK, kThreads>(xrow, row_of, tid);
  const int wr = tid >> 1, half = tid & 1;
  const char* wbase = static_cast<const char*>(wsrc.w);

  auto issue = [&](int kt, int st) {
    const int k0 = kt * kBK;
    copy_x_tile<NTOK, kThreads>(sm.xhi[st], sm.xlo[st], xhi, xlo, xrow, tid, K, k0);
    // This thread's half of its weight row: kCB / 2 bytes (16 or 32).
    const bool ok = wbase != nullptr;
    const char* src = ok ? wbase + (int64_t(k0) * BITS) / 8 + half * (kCB / 2) : static_cast<const char*>(nullptr);
#pragma unroll
    for (int u = 0; u < kCB / 32; ++u)
      ptx::cp_async16(&sm.codes[st][wr][half * (kCB / 2) + 16 * u], ok ? src + 16 * u : static_cast<const void*>(xhi),
                      ok);
  };
  // Scale and bias of the two 16-wide segments of this thread's half tile.
  auto load_sb = [&](int kt, float2 (&sb)[2]) {
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int k = kt * kBK + 32 * half + 16 * u;
      sb[u] = wbase != nullptr ? make_float2(bf16_at(wsrc.s, k / gs), bf16_at(wsrc.b, k / gs))
                               : make_float2(0.0f, 0.0f);
    }
  };
  // Dequantizes this thread's 32 codes of stage st into weight buffer wb (row wr, chunks 4 half .. 4 half + 3).
  auto dequant = [&](int st, int wb, const float2 (&sb)[2]) {
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      uint32_t w[BITS / 2];  // 16 codes: 2 words (4-bit) or 4 (8-bit)
      if constexpr (BITS == 4) {
        const uint2 v = *reinterpret_cast<const uint2*>(&sm.codes[st][wr][16 * half + 8 * u]);
        w[0] = v.x, w[1] = v.y;
      } else {
        const uint4 v = *reinterpret_cast<const uint4*>(&sm.codes[st][wr][32 * half + 16 * u]);
        w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
      }
      uint32_t hi[8], lo[8];
      dequant16<BITS>(w, sb[u], hi, lo);
      const int c0 = 4 * half + 2 * u;  // first of the segment's two chunks
#pragma unroll
      for (int cc = 0; cc < 2; ++cc) {
        const uint32_t d = wgmma::sw128(wr, c0 + cc);
        *reinterpret_cast<uint4*>(&sm.whi[wb][d]) = make_uint4(hi[4 * cc], hi[4 * cc + 1], hi[4 * cc + 2], hi[4 * cc + 3]);
        *reinterpret_cast<uint4*>(&sm.wlo[wb][d]) = make_uint4(lo[4 * cc], lo[4 * cc + 1], lo[4 * cc + 2], lo[4 * cc + 3]);
      }
    }
  };

  const int nk = K / kBK;
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < nk) issue(s, s);
    ptx::cp_commit();
  }
  float2 sb[2];
  load_sb(0, sb);
  ptx::cp_wait<S - 2>();
  if (nk > 0) dequant(0, 0, sb);
  if (nk > 1) load_sb(1, sb);
  wgmma::fence_proxy_async();
  __syncthreads();

#pragma unroll
  for (int i = 0; i < NTOK / 2; ++i) acc[i] = 0.0f;
  for (int kt = 0; kt < nk; ++kt) {
    // Tile kt: weights in buffer kt % 2, x in stage kt % S, both published by the last barrier.
    const int st = kt % S, wb = kt & 1;
    mma_tile<NTOK>(acc, &sm.whi[wb][wg * 64 * kTileRowBytes], &sm.wlo[wb][wg * 64 * kTileRowBytes], sm.xhi[st],
                   sm.xlo[st]);

    // Stage (kt + S - 1) % S was last read by tile kt - 1's MMAs, which completed before the last barrier.
    if (kt + S - 1 < nk) issue(kt + S - 1, (kt + S - 1) % S);
    ptx::cp_commit();
    if (kt + 1 < nk) {
      ptx::cp_wait<S - 2>();  // this thread's copies of tile kt + 1 have landed
      dequant((kt + 1) % S, wb ^ 1, sb);  // buffer wb ^ 1 was read by tile kt - 1's MMAs (completed)
      if (kt + 2 < nk) load_sb(kt + 2, sb);
    }
    wgmma::fence_proxy_async();
    wgmma::wait<0>();
    wgmma::fence_operand(acc);
    __syncthreads();
  }
  ptx::cp_wait<0>();
  __syncthreads();
}

}  // namespace fern::cuda::wgtile
