// The Hopper tile loop of the prefill GEMMs (FERN_GEMM=wg, gemm_wg.h): warpgroup MMAs (wgmma.cuh) with the weights
// as the 64-row A operand, held in registers, and the token rows as the N side from shared memory ("swapped": the
// weight tile, 128 rows, is the wide side, the token tile, NTOK = 16..128 rows, the narrow one, so that one loop
// serves the dense projections and the uneven expert groups). One block of 256 threads = two warpgroups, each
// owning 64 of the block's 128 weight rows and all NTOK token rows; a thread owns the two weight rows of its A
// fragment (16 warp + lane / 4 and + 8 within its warpgroup's 64). Numerics (no per-group epilogue, no partial sums):
//  - x arrives as bf16 rows hi = bf16(x), lo = bf16(x - hi) (gemm_wg.h: once per op), x = hi + lo to ~2^-17;
//  - each thread dequantizes the weights of its own A fragments straight from the codes (loaded from global memory
//    into registers a tile ahead): w = s q + b in fp32 (exact: a bf16 scale times a 4/8-bit code has at most 16
//    significant bits) split the same way into bf16 hi + lo. Every weight is dequantized once per block, by the one
//    thread that feeds it to the MMA, and never passes through shared memory;
//  - three bf16 MMAs per K step, x_hi w_hi + x_lo w_hi + x_hi w_lo, fp32 accumulation: each product to ~2^-16
//    relative (the dropped x_lo w_lo is below 2^-16 of it), the order of the split loop (gemm_tile.cuh).
// Pipeline per 64-wide K tile kt (one barrier): the MMAs of tile kt are issued (A fragments from register buffer
// kt % 2), and while they run the block issues the cp.async copies of x tile kt + S - 1, dequantizes tile kt + 1's
// codes into the other register buffer and requests tile kt + 2's codes; then it waits for its MMAs and meets at
// the barrier. (Version one staged dequantized bf16 tiles in shared memory for both operands: shared-memory
// bandwidth bound, docs/notes/cuda-prefill-v4-wg.md.)
// The caller decides the global row of each token-tile row (a functor, -1 for padding) and the two weight rows of
// each thread (gemm::RowSrc). K must be a multiple of 64, the affine group a multiple of 16.
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

// Shared memory: S stages of x (hi, lo) tiles, each on a 1024-byte boundary (the swizzle atom); the dynamic shared
// memory is aligned by smem_of.
template <int NTOK, int S>
struct Smem {
  static_assert(NTOK % 8 == 0, "token tiles of whole 8-row atoms");
  uint8_t xhi[S][NTOK * kTileRowBytes];
  uint8_t xlo[S][NTOK * kTileRowBytes];
};
template <int NTOK, int S>
constexpr size_t kSmemBytes = sizeof(Smem<NTOK, S>) + 1024;  // + alignment slack

template <int NTOK, int S>
__device__ __forceinline__ Smem<NTOK, S>& smem_of(unsigned char* raw) {
  const uintptr_t p = (reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023);
  return *reinterpret_cast<Smem<NTOK, S>*>(p);
}

// The weight row of A-fragment row h (0: lane / 4, 1: lane / 4 + 8) of this thread within the block's 128:
// 64 (warpgroup) + 16 (warp in the warpgroup) + lane / 4 + 8 h = 16 warp + lane / 4 + 8 h.
__device__ __forceinline__ int frag_row(int h) { return 16 * (threadIdx.x >> 5) + ((threadIdx.x & 31) >> 2) + 8 * h; }

// fp32 value of a code held in the low bits (exact: 2^23 + q as a float, minus 2^23).
__device__ __forceinline__ float code_f(uint32_t q) { return __uint_as_float(0x4b000000u | q) - 8388608.0f; }

// Splits two fp32 weights into bf16 hi and lo pairs.
__device__ __forceinline__ void split2(float a, float b, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  const float2 hf = __bfloat1622float2(h);
  const __nv_bfloat162 l = __floats2bfloat162_rn(a - hf.x, b - hf.y);
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = *reinterpret_cast<const uint32_t*>(&l);
}

// What a thread loads per K tile for its two rows: per 16-wide segment the two code words holding its values
// (4-bit: the segment's two words, byte lane % 4 of each; 8-bit: words lane % 4 / 2 and 2 + lane % 4 / 2, half
// lane % 2) and the scale and bias (bf16 pair) of the segment's group.
struct Raw {
  uint32_t w[2][4][2];
  uint32_t sb[2][4];
};

// acc (this warpgroup's 64 weight rows x NTOK tokens, wgmma layout) += W x^T over the width K.
// xhi/xlo: the bf16 rows (row stride K); row_of(r): the global row of token-tile row r (< 0: padding);
// wsrc[h]: the weight row of this thread's fragment row h (frag_row; w == nullptr: padding); gs: the group size.
// Ends with a barrier, so the caller may reuse the shared memory.
template <int BITS, int NTOK, int S, class RowOf>
__device__ __forceinline__ void mainloop(Smem<NTOK, S>& sm, int K, int gs, const uint16_t* __restrict__ xhi,
                                         const uint16_t* __restrict__ xlo, RowOf row_of,
                                         const gemm::RowSrc (&wsrc)[2], float (&acc)[NTOK / 2]) {
  static_assert(BITS == 4 || BITS == 8, "affine codes only");
  static_assert(S >= 2, "at least double buffering");
  constexpr int kXChunks = NTOK * 8;  // 16-byte chunks of one x tile (hi or lo)
  constexpr int kXPer = (kXChunks + kThreads - 1) / kThreads;
  const int tid = threadIdx.x, c = tid & 3;

  int xrow[kXPer];  // global rows of this thread's x chunks (-1: padding)
  const int xch = tid & 7;
#pragma unroll
  for (int j = 0; j < kXPer; ++j) {
    const int r = (tid >> 3) + 32 * j;
    xrow[j] = r < NTOK ? row_of(r) : -1;
  }
  auto issue_x = [&](int kt, int st) {
    const int k0 = kt * kBK;
#pragma unroll
    for (int j = 0; j < kXPer; ++j) {
      const int r = (tid >> 3) + 32 * j;
      if (r < NTOK) {
        const bool ok = xrow[j] >= 0;
        const int64_t off = ok ? int64_t(xrow[j]) * K + k0 + 8 * xch : 0;
        const uint32_t d = wgmma::sw128(r, xch);
        ptx::cp_async16(&sm.xhi[st][d], xhi + off, ok);
        ptx::cp_async16(&sm.xlo[st][d], xlo + off, ok);
      }
    }
  };
  // Codes, scales and biases of tile kt for both rows (zeros for padding rows: w = 0).
  auto load_raw = [&](int kt, Raw& r) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t* row = static_cast<const uint32_t*>(wsrc[h].w);
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        const int k = kt * kBK + 16 * ks;
        if (row != nullptr) {
          if constexpr (BITS == 4) {
            const uint2 v = __ldg(reinterpret_cast<const uint2*>(row + k / 8));
            r.w[h][ks][0] = v.x, r.w[h][ks][1] = v.y;
          } else {
            r.w[h][ks][0] = __ldg(row + k / 4 + (c >> 1));
            r.w[h][ks][1] = __ldg(row + k / 4 + 2 + (c >> 1));
          }
          const int g = k / gs;
          r.sb[h][ks] = uint32_t(__ldg(wsrc[h].s + g)) | (uint32_t(__ldg(wsrc[h].b + g)) << 16);
        } else {
          r.w[h][ks][0] = r.w[h][ks][1] = 0u;
          r.sb[h][ks] = 0u;
        }
      }
    }
  };
  // A fragments (hi and lo) of one tile from its raw codes: per segment ks, a[0]/a[1] rows 0/1 at k 2c, 2c + 1,
  // a[2]/a[3] at k 2c + 8, 2c + 9.
  auto dequant = [&](const Raw& r, uint32_t (&ahi)[4][4], uint32_t (&alo)[4][4]) {
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float s = __uint_as_float(r.sb[h][ks] << 16), b = __uint_as_float(r.sb[h][ks] & 0xffff0000u);
#pragma unroll
        for (int part = 0; part < 2; ++part) {  // k 2c.. (word 0) and 2c + 8.. (word 1)
          uint32_t q0, q1;
          if constexpr (BITS == 4) {
            const uint32_t byte = (r.w[h][ks][part] >> (8 * c)) & 0xffu;
            q0 = byte & 0xfu, q1 = byte >> 4;
          } else {
            const uint32_t half = (r.w[h][ks][part] >> (16 * (c & 1))) & 0xffffu;
            q0 = half & 0xffu, q1 = half >> 8;
          }
          split2(fmaf(s, code_f(q0), b), fmaf(s, code_f(q1), b), ahi[ks][2 * part + h], alo[ks][2 * part + h]);
        }
      }
    }
  };

  const int nk = K / kBK;
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < nk) issue_x(s, s);
    ptx::cp_commit();
  }
  uint32_t ahi[2][4][4], alo[2][4][4];  // A fragments of two tiles: the one in the MMAs, the next one
  Raw raw;
  if (nk > 0) {
    load_raw(0, raw);
    dequant(raw, ahi[0], alo[0]);
  }
  if (nk > 1) load_raw(1, raw);
#pragma unroll
  for (int i = 0; i < NTOK / 2; ++i) acc[i] = 0.0f;
  ptx::cp_wait<S - 2>();
  wgmma::fence_proxy_async();
  __syncthreads();

  // One K tile with its A fragments in register buffer B (a compile-time index: the loop is unrolled by two).
  auto step = [&]<int B>(int kt) {
    const int st = kt % S;
    wgmma::fence_operand(acc);
    wgmma::fence();
#pragma unroll
    for (int ks = 0; ks < kBK / 16; ++ks) {
      const uint64_t dxh = wgmma::desc_sw128(&sm.xhi[st][32 * ks]), dxl = wgmma::desc_sw128(&sm.xlo[st][32 * ks]);
      wgmma::mma_rs_bf16<NTOK>(acc, ahi[B][ks], dxh);
      wgmma::mma_rs_bf16<NTOK>(acc, ahi[B][ks], dxl);
      wgmma::mma_rs_bf16<NTOK>(acc, alo[B][ks], dxh);
    }
    wgmma::commit();
    wgmma::fence_operand(acc);
    // Stage (kt + S - 1) % S was last read by tile kt - 1's MMAs, which completed before the last barrier.
    if (kt + S - 1 < nk) issue_x(kt + S - 1, (kt + S - 1) % S);
    ptx::cp_commit();
    if (kt + 1 < nk) {
      dequant(raw, ahi[B ^ 1], alo[B ^ 1]);  // buffer B ^ 1 fed tile kt - 1's MMAs, which completed
      if (kt + 2 < nk) load_raw(kt + 2, raw);
    }
    ptx::cp_wait<S - 2>();  // this thread's copies of x tile kt + 1 have landed
    wgmma::fence_proxy_async();
    wgmma::wait<0>();
    wgmma::fence_operand(acc);
    __syncthreads();
  };
  for (int kt = 0; kt < nk; kt += 2) {
    step.template operator()<0>(kt);
    if (kt + 1 < nk) step.template operator()<1>(kt + 1);
  }
  ptx::cp_wait<0>();
  __syncthreads();
}

}  // namespace fern::cuda::wgtile
