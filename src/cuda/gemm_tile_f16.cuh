// The fast tensor-core tile loop of the prefill GEMMs (dense linear_gemm.cu, grouped moe_prefill.cu), for 4- and
// 8-bit affine weights and activations already converted to fp16 rows (gemm_f16.h: one conversion per op). One
// block of 256 threads computes BM token rows x 128 weight rows, walking the width in tiles of 64:
//  - a STAGES-deep cp.async pipeline brings, per k tile, the fp16 x rows (BM x 64) and the raw weight codes (128
//    rows x 32 or 64 bytes) into shared memory; one barrier per tile, the loads of tile i + STAGES - 1 in flight
//    while tile i's MMAs run. The per-group scale and bias (bf16 in memory, exact in fp16) are loaded into
//    registers one pipeline step ahead and stored to the stage after the MMAs (they are 2-byte aligned, too small
//    for cp.async);
//  - x fragments by ldmatrix; weight fragments built in registers from the codes: 0x6400 | q is the fp16 value
//    1024 + q (exact for q < 1024), minus 1024 gives q exactly, then one HFMA2 gives w = s q + b rounded once to
//    fp16 (11 significant bits). So the weights, like x, carry one fp16 rounding (relative 2^-11), and one
//    mma.sync m16n8k16 f16 x f16 -> f32 per fragment replaces the two bf16 MMAs of the hi/lo split (gemm_tile.cuh);
//  - the caller multiplies the fp32 accumulators by its rows' scales (2^e) in its epilogue.
// Limits: |s q + b| must stay below 65504 (fp16) and weights below 2^-14 lose relative precision (fp16
// subnormals; absolute error below 2^-25). Rows of shared memory are padded (x by 16 bytes, codes to 48 / 80
// bytes) so that ldmatrix and the 8-row code reads hit 32 different banks.
// The caller decides which x row each staging thread reads (a functor from the tile row to the global row, -1 for
// padding) and which weight row each thread stages (row tid / 2, as in gemm_tile.cuh).
#pragma once
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/cuda_util.cuh"
#include "cuda/gemm_tile.cuh"
#include "cuda/ptx.cuh"

namespace fern::cuda::gemm16 {

using gemm::kBK;
using gemm::kBN;
using gemm::kSeg;
using gemm::kThreads;
constexpr int kXPad = kBK + 8;  // halfs per shared x row (144 bytes)
template <int BITS>
constexpr int kWRow = BITS == 4 ? 48 : 80;  // bytes per shared code row: 32 / 64 of codes + 16 of padding

// One pipeline stage. P (precise, gemm_f16.h): also the lo rows, the segment sums of x, and fp32 scale/bias.
template <int BM, int BITS, bool P>
struct Stage {
  __half x[BM][kXPad];
  __half xl[P ? BM : 1][kXPad];
  uint8_t w[kBN][kWRow<BITS>];
  __half2 sb[P ? 1 : kBN][kSeg];  // fast: (scale, bias) of the group holding each 16-wide segment of the tile
  float2 sbf[P ? kBN : 1][kSeg];  // precise: the same in fp32
  float xs[P ? BM : 1][kSeg];     // precise: sums of x over each segment
};
template <int BM, int BITS, int S, bool P = false>
struct Smem {
  Stage<BM, BITS, P> st[S];
};
template <int BM, int BITS, int S, bool P = false>
constexpr size_t kSmemBytes = sizeof(Smem<BM, BITS, S, P>);

using ptx::cp_async16;
using ptx::cp_async8;
using ptx::cp_commit;
using ptx::cp_wait;
using ptx::ldmatrix_x4;

// fp16 pair (1024 + q_lo, 1024 + q_hi) of two codes: 4-bit, the two nibbles of byte `c` of w; 8-bit, bytes 2 (c % 2)
// and 2 (c % 2) + 1 of w.
template <int BITS>
__device__ __forceinline__ uint32_t magic_pair(uint32_t w, int c) {
  if constexpr (BITS == 4) {
    const uint32_t t = (w >> (8 * c)) & 0xffu;
    return ((t | (t << 12)) & 0x000f000fu) | 0x64006400u;
  } else {
    return __byte_perm(w, 0x64u, 0x4140u + 0x0202u * static_cast<uint32_t>(c & 1));
  }
}

// The codes themselves as an fp16 pair (exact).
__device__ __forceinline__ uint32_t code_pair(uint32_t magic) {
  const __half2 q = __hsub2(*reinterpret_cast<const __half2*>(&magic), __float2half2_rn(1024.0f));
  return *reinterpret_cast<const uint32_t*>(&q);
}

// w = s q + b as an fp16 pair from the magic pair (q exact after the subtraction, one rounding in the HFMA2).
__device__ __forceinline__ uint32_t dequant_pair(uint32_t magic, __half2 s2, __half2 b2) {
  const __half2 q = __hsub2(*reinterpret_cast<const __half2*>(&magic), __float2half2_rn(1024.0f));
  const __half2 w = __hfma2(q, s2, b2);
  return *reinterpret_cast<const uint32_t*>(&w);
}

// acc[mt][nt][i] += x16[row] . W[col] over the width K (a multiple of 16; the last tile's missing segments are
// zeros), where row = row0(warp) + mt * 16 + lane / 4 + 8 * (i / 2), col = col0(warp) + nt * 8 + 2 * (lane % 4) +
// i % 2 (gemm::Layout). x16: the fp16 rows (row stride K); row_of(r) the global row of tile row r (< 0: padding);
// wsrc: this thread's weight row (tid / 2; w == nullptr: padding); gs the group size (a multiple of 16). Ends with
// a barrier, so the caller may reuse `sm`.
// P (precise): x16 holds hi rows, xlo the lo rows and xsums the segment sums (gemm_f16.h, stride ks); two MMAs per
// fragment on the exact codes into per-group partial sums, the scale and bias applied per group in fp32
// (acc += s * sum x q + b * sum x), as gemm_tile.cuh does.
template <int BITS, int WM, int MT, int NT, int S, bool P = false, class RowOf>
__device__ __forceinline__ void mainloop(Smem<16 * WM * MT, BITS, S, P>& sm, int K, int gs,
                                         const __half* __restrict__ x16, RowOf row_of, const gemm::RowSrc& wsrc,
                                         float (&acc)[MT][NT][4], const __half* __restrict__ xlo = nullptr,
                                         const float* __restrict__ xsums = nullptr, int ks = 0) {
  static_assert(BITS == 4 || BITS == 8, "affine codes only");
  static_assert(S >= 2, "at least double buffering");
  using L = gemm::Layout<WM, MT, NT>;
  constexpr int BM = L::kBM;
  constexpr int kXChunks = BM * 8;  // 16-byte chunks of the x tile
  constexpr int kXPer = (kXChunks + kThreads - 1) / kThreads;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = L::row0(warp), wn = L::col0(warp);
  const int g = lane >> 2, c = lane & 3;

  // This thread's x chunks: tile row tid / 8 + 32 j, 8 halfs at column 8 (tid % 8).
  int xrow[kXPer];  // global rows (-1: padding); pointers are formed per copy to keep registers for the MMAs
  const int xch = tid & 7;
#pragma unroll
  for (int j = 0; j < kXPer; ++j) {
    const int r = (tid >> 3) + 32 * j;
    xrow[j] = r < BM && tid + kThreads * j < kXChunks ? row_of(r) : -1;
  }
  const int wr = tid >> 1, wseg = (tid & 1) * 2;
  const char* wbase = static_cast<const char*>(wsrc.w);
  const int srow = P && tid < BM ? row_of(tid) : -1;  // precise: the row whose segment sums this thread copies

  auto issue = [&](int kt, Stage<BM, BITS, P>& st) {
    const int k0 = kt * kBK;
#pragma unroll
    for (int j = 0; j < kXPer; ++j) {
      if (tid + kThreads * j < kXChunks) {
        const bool ok = xrow[j] >= 0 && k0 + 8 * xch < K;
        const int64_t off = ok ? int64_t(xrow[j]) * K + k0 + 8 * xch : 0;
        cp_async16(&st.x[(tid >> 3) + 32 * j][8 * xch], x16 + off, ok);
        if constexpr (P) cp_async16(&st.xl[(tid >> 3) + 32 * j][8 * xch], xlo + off, ok);
      }
    }
    if constexpr (P) {
      if (tid < BM) cp_async16(&st.xs[tid][0], xsums + (srow >= 0 ? int64_t(srow) * ks + 4 * kt : 0), srow >= 0);
    }
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int seg = wseg + u, k = k0 + 16 * seg;
      const bool ok = wbase != nullptr && k < K;
      if constexpr (BITS == 4)
        cp_async8(&st.w[wr][8 * seg], ok ? static_cast<const void*>(wbase + k / 2) : x16, ok);
      else
        cp_async16(&st.w[wr][16 * seg], ok ? static_cast<const void*>(wbase + k) : x16, ok);
    }
  };
  // Scale and bias of this thread's two segments of tile kt (held as fp16 pairs by the fast loop: fewer registers).
  using SbReg = std::conditional_t<P, float2, __half2>;
  auto load_sb = [&](int kt, SbReg (&sb)[2]) {
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int k = kt * kBK + 16 * (wseg + u);
      float s = 0.0f, b = 0.0f;
      if (wbase != nullptr && k < K) {
        s = bf16_at(wsrc.s, k / gs);
        b = bf16_at(wsrc.b, k / gs);
      }
      if constexpr (P)
        sb[u] = make_float2(s, b);
      else
        sb[u] = __floats2half2_rn(s, b);
    }
  };
  auto store_sb = [&](const SbReg (&sb)[2], Stage<BM, BITS, P>& st) {
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      if constexpr (P)
        st.sbf[wr][wseg + u] = sb[u];
      else
        st.sb[wr][wseg + u] = sb[u];
    }
  };
  float part[P ? MT : 1][P ? NT : 1][4] = {};  // precise: the current group's sum_k x_k q_k
  float xsr[P ? MT : 1][2] = {};               // precise: the current group's sum_k x_k of this thread's rows

  const int nk = (K + kBK - 1) / kBK;
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < nk) {
      issue(s, sm.st[s]);
      SbReg sb[2];
      load_sb(s, sb);
      store_sb(sb, sm.st[s]);
    }
    cp_commit();
  }

  for (int kt = 0; kt < nk; ++kt) {
    cp_wait<S - 2>();
    __syncthreads();  // tile kt is in shared memory; every thread is done with tile kt - 1's stage
    const int nxt = kt + S - 1;
    SbReg sbn[2];
    if (nxt < nk) {
      issue(nxt, sm.st[nxt % S]);
      load_sb(nxt, sbn);
    }
    cp_commit();

    const Stage<BM, BITS, P>& st = sm.st[kt % S];
#pragma unroll
    for (int kk = 0; kk < kSeg; ++kk) {
      // The weight fragments of the warp's NT column tiles first, then one x fragment at a time (fewer live
      // registers than holding all MT x fragments: the 128-row tile spilled that way).
      uint32_t b[NT][2];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int n = wn + nt * 8 + g;
        uint32_t w0, w1;
        if constexpr (BITS == 4) {
          const uint2 v = *reinterpret_cast<const uint2*>(&st.w[n][8 * kk]);
          w0 = v.x, w1 = v.y;
        } else {
          w0 = *reinterpret_cast<const uint32_t*>(&st.w[n][16 * kk + 4 * (c >> 1)]);
          w1 = *reinterpret_cast<const uint32_t*>(&st.w[n][16 * kk + 8 + 4 * (c >> 1)]);
        }
        if constexpr (P) {  // the exact codes
          b[nt][0] = code_pair(magic_pair<BITS>(w0, c));
          b[nt][1] = code_pair(magic_pair<BITS>(w1, c));
        } else {
          const __half2 sb = st.sb[n][kk];
          const __half2 s2 = __low2half2(sb), b2 = __high2half2(sb);
          b[nt][0] = dequant_pair(magic_pair<BITS>(w0, c), s2, b2);
          b[nt][1] = dequant_pair(magic_pair<BITS>(w1, c), s2, b2);
        }
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        uint32_t a[4];
        ldmatrix_x4(a, &st.x[wm + mt * 16 + (lane & 15)][kk * 16 + (lane >> 4) * 8]);
        if constexpr (P) {
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) ptx::mma16816<true>(part[mt][nt], a, b[nt][0], b[nt][1]);
          ldmatrix_x4(a, &st.xl[wm + mt * 16 + (lane & 15)][kk * 16 + (lane >> 4) * 8]);
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) ptx::mma16816<true>(part[mt][nt], a, b[nt][0], b[nt][1]);
        } else {
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) ptx::mma16816<true>(acc[mt][nt], a, b[nt][0], b[nt][1]);
        }
      }
      if constexpr (P) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          xsr[mt][0] += st.xs[wm + mt * 16 + g][kk];
          xsr[mt][1] += st.xs[wm + mt * 16 + g + 8][kk];
        }
        if ((kt * kBK + kk * 16 + 16) % gs == 0) {  // end of a group: apply its scale and bias
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            const int n = wn + nt * 8 + 2 * c;
            const float2 sb0 = st.sbf[n][kk], sb1 = st.sbf[n + 1][kk];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
              float* a = acc[mt][nt];
              float* p = part[mt][nt];
              a[0] += sb0.x * p[0] + sb0.y * xsr[mt][0];
              a[1] += sb1.x * p[1] + sb1.y * xsr[mt][0];
              a[2] += sb0.x * p[2] + sb0.y * xsr[mt][1];
              a[3] += sb1.x * p[3] + sb1.y * xsr[mt][1];
              p[0] = p[1] = p[2] = p[3] = 0.0f;
            }
          }
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) xsr[mt][0] = xsr[mt][1] = 0.0f;
        }
      }
    }
    if (nxt < nk) store_sb(sbn, sm.st[nxt % S]);  // that stage was last read in tile kt - 1
  }
  cp_wait<0>();
  __syncthreads();
}

}  // namespace fern::cuda::gemm16
