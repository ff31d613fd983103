// What the exact-code GEMM loop's MMA warpgroups can reach with nothing to wait for but their own MMAs: the loop
// (gemm_tile_q4.cuh) runs its dense GEMMs at ~45-50% of the tensor cores' bf16 rate and its MoE GEMMs at ~30%
// (counting the x hi and x lo MMAs), and earlier changes to its chain (turn-taking, halves, a second partial) did not
// say which part of the chain bounds it. Each kernel here is one block per SM of W warpgroups that repeat, on
// operands that stay in shared memory (no producer, no barriers), one piece more of the loop's per-tile chain per
// row of the table:
//   pipe      8 MMAs (4 K steps x hi, lo) per tile into one accumulator, never waiting (the tensor pipe's rate);
//   wait      the same, waiting for each tile's MMAs (wgmma.wait_group 0) before the next;
//   promote   + the loop's promotion of the partial: acc += s P + c xs (xs from shared memory), 2 FMAs per value;
//   zero      + the partial zeroed before each tile (what the loop does) instead of the first MMA overwriting it;
//   codes     + the A fragments unpacked from packed 4-bit codes in shared memory each tile (LDS + shift + LOP3);
//   turns     the codes chain with the warpgroups issuing their tiles' MMAs in turn (named barriers): one promotes
//             while the next one's MMAs run, instead of all of them issuing, waiting and promoting in step;
//   turns, 1 FMA  the same with one FMA per value in the promotion (acc += s P: the bias term c xs left out), to see
//             what the promotion's arithmetic costs when it overlaps the other warpgroup's MMAs;
//   turns, bias under MMAs  the turns chain with the promotion's bias half (acc += c xs, the sums' reads and one FMA
//             per value) between the MMAs' issue and the wait, and only acc += s P after it;
//   turns, sums in registers  the loop's two-FMA promotion with the sums held in registers (no shared-memory reads);
//   turns, 1 FMA + sums read  one FMA per value, plus the sums' shared-memory reads (each used by one add);
//   turns, q codes, bias by MMA  the form that takes the bias term off the chain: codes q (one bf16x2 subtraction
//             more per register), acc += s P per tile, and per 32 tiles (an item at K = 2,048) 4 MMAs of K 16 for
//             the bias term (b per group against the sums' hi/lo pieces) and acc += P (not counted in TFLOP/s);
// and the int8 rows (docs/notes/cuda-prefill-v34-int8-digits-precision.md: x as two int8 digits d1, d0 per 64-wide
// group, u8 codes, wgmma m64nNk32 .s32.u8.s8 at twice the bf16 rate; 4 MMAs per 64-wide tile instead of 8, the same
// multiply-adds per tile, so TFLOP/s and clocks per tile compare with the bf16 rows):
//   i8 pipe   4 MMAs per tile into one int32 partial, never waiting (the int8 pipe's rate);
//   i8 shift  the d1 MMAs, wait, the partial shifted by 8 bits, the d0 MMAs into it, wait, then the promotion
//             acc += s float(P) + c xs; codes unpacked to u8 each tile (two LOP3 and a shift per word);
//   i8 shift, turns, 1 FMA  the shift chain with the warpgroups issuing in turns (two turns per tile, one per digit:
//             a warpgroup shifts while the next one's MMAs run) and one FMA per value (acc += s float(P): the bias
//             term left to MMAs, as the bf16 "turns, q codes, bias by MMA" row, not counted here);
//   i8 two partials  the d1 and d0 MMAs into two partials issued together, one wait, acc += s1 float(P1) + s0
//             float(P0) + c xs (two warpgroups only: with three, 168 registers per thread, it spills);
// in register-A (RS, the loop's form) and shared-memory-A (SS) forms, at token widths 64, 96 and 128 and with one,
// two or three MMA warpgroups. TFLOP/s count the MMAs' multiply-adds (hi and lo both) against the H200's 989 TFLOP/s
// of dense bf16. The operands are arbitrary finite bf16 values (the rate does not depend on them); a sum of each
// thread's accumulators is written out so that nothing is optimized away.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "bench_timing.h"
#include "cuda/cuda_check.h"
#include "cuda/gemm_wg.h"
#include "cuda/wgmma.cuh"

using namespace fern;
using namespace fern::cuda;

namespace {

enum Chain {
  kPipe, kWait, kPromote, kZero, kCodes, kCodesNoZero,  // the loop's chain, piece by piece
  kPingPong, kPingPong1, kBiasUnder, kSumsRegs, kSumsOnly, kBiasMma  // in turns, forms of the promotion
};
constexpr bool takes_turns(Chain c) { return c >= kPingPong; }
constexpr bool unpacks_codes(Chain c) { return c == kCodes || c == kCodesNoZero || takes_turns(c); }
constexpr bool zeroes_partial(Chain c) { return c == kZero || c == kCodes; }
// After the wait: one FMA per value (acc += s P) instead of the loop's two (acc += s P + c xs).
constexpr bool one_fma(Chain c) { return c == kPingPong1 || c == kBiasUnder || c == kSumsOnly || c == kBiasMma; }

template <int W, int N>
struct RateSmem {
  uint8_t a[W][64 * 128];  // SS form: each warpgroup's 64 rows x 64 K
  uint8_t bhi[N * 128];    // N token rows x 64 K, 128-byte swizzled
  uint8_t blo[N * 128];
  uint4 codes[W * 64][2];  // 32 bytes of packed codes per weight row
  float xs[N];
};

__device__ __forceinline__ uint32_t code_pair(uint32_t w, int j) {
  return ((w >> (4 * j)) & 0x000f000fu) | 0x43004300u;
}
// The codes themselves (q, not 128 + q): one bf16x2 subtraction more per register.
__device__ __forceinline__ uint32_t code_pair_q(uint32_t w, int j) {
  const uint32_t v = code_pair(w, j);
  __nv_bfloat162 r = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&v), __floats2bfloat162_rn(128.0f, 128.0f));
  return *reinterpret_cast<const uint32_t*>(&r);
}

// Warpgroup wg's turn (barrier 1 + wg) and the next one's (1 + (wg + 1) % W). Register barrier IDs here: the
// branches that immediate IDs need made ptxas serialize this kernel's MMAs (C7520).
template <int W>
__device__ __forceinline__ void turn_sync(int wg) {
  asm volatile("bar.sync %0, 256;" ::"r"(1 + wg) : "memory");
}
template <int W>
__device__ __forceinline__ void turn_arrive(int wg) {
  asm volatile("bar.arrive %0, 256;" ::"r"(1 + (wg + 1) % W) : "memory");
}

template <int W, int N, bool SS, Chain C>
__global__ void __launch_bounds__(W * 128, 1) rate_kernel(int iters, float* out) {
  extern __shared__ unsigned char rate_raw[];
  auto& sm = wgmma::smem_at_atom<RateSmem<W, N>>(rate_raw);
  const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31;
  // Finite bf16 values in [1, 2) (exponent 127, a varying mantissa), codes from a multiplicative hash.
  {
    uint32_t* w = reinterpret_cast<uint32_t*>(&sm);
    const int words = static_cast<int>(sizeof(RateSmem<W, N>) / 4);
    for (int i = tid; i < words; i += W * 128) w[i] = 0x3f803f80u | ((i * 2654435761u) & 0x007f007fu);
  }
  wgmma::fence_proxy_async();
  __syncthreads();
  const int r0 = 64 * wg + 16 * ((tid >> 5) & 3) + (lane >> 2);
  uint32_t a[4][4];
#pragma unroll
  for (int ks = 0; ks < 4; ++ks)
#pragma unroll
    for (int i = 0; i < 4; ++i) a[ks][i] = 0x3f803f80u | ((tid * 131u + ks * 17u + i) & 0x007f007fu);
  const float s0 = 1.0f + tid * 1e-3f, c0 = 0.5f - tid * 1e-3f;
  float acc[N / 2], part[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) acc[i] = 0.0f, part[i] = 0.0f;
  // kSumsRegs: the sums the promotion reads held in registers for the whole run (no shared-memory reads).
  float2 xr[takes_turns(C) && C == kSumsRegs ? N / 8 : 1];
#pragma unroll
  for (int j = 0; j < int(sizeof(xr) / sizeof(xr[0])); ++j) xr[j] = *reinterpret_cast<const float2*>(&sm.xs[8 * j]);

  // Turns: warpgroup w waits on barrier 1 + w and, once its MMAs are issued, arrives on the next one's; the last
  // warpgroup's arrival lets the first one start.
  if (takes_turns(C) && wg == W - 1) turn_arrive<W>(wg);
  for (int it = 0; it < iters; ++it) {
    if constexpr (unpacks_codes(C)) {
      const uint4 u = sm.codes[r0][it & 1], v = sm.codes[r0 + 8][it & 1];
      const uint32_t c0w[4] = {u.x, u.y, u.z, u.w}, c1w[4] = {v.x, v.y, v.z, v.w};
      const auto pair = [&](uint32_t w) { return C == kBiasMma ? code_pair_q(w, lane & 3) : code_pair(w, lane & 3); };
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        a[ks][0] = pair(c0w[ks]);
        a[ks][1] = pair(c1w[ks]);
        a[ks][2] = pair(c0w[ks] ^ 0x11111111u);
        a[ks][3] = pair(c1w[ks] ^ 0x11111111u);
      }
    }
    if constexpr (zeroes_partial(C)) {
#pragma unroll
      for (int i = 0; i < N / 2; ++i) part[i] = 0.0f;
    }
    wgmma::fence_operand(part);
    if constexpr (takes_turns(C)) turn_sync<W>(wg);
    wgmma::fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      // Overwrite at the tile's first MMA where nothing zeroed the partial and a promotion consumed it.
      const int accum = (C == kPipe || C == kWait || zeroes_partial(C) || ks > 0) ? 1 : 0;
      if constexpr (SS) {
        wgmma::mma_bf16<N>(part, wgmma::desc_sw128(&sm.a[wg][32 * ks]), wgmma::desc_sw128(&sm.bhi[32 * ks]));
        wgmma::mma_bf16<N>(part, wgmma::desc_sw128(&sm.a[wg][32 * ks]), wgmma::desc_sw128(&sm.blo[32 * ks]));
      } else {
        wgmma::mma_bf16_rs<N>(part, a[ks], wgmma::desc_sw128(&sm.bhi[32 * ks]), accum);
        wgmma::mma_bf16_rs<N>(part, a[ks], wgmma::desc_sw128(&sm.blo[32 * ks]));
      }
    }
    wgmma::commit();
    if constexpr (takes_turns(C)) turn_arrive<W>(wg);
    if constexpr (C == kBiasUnder) {
#pragma unroll
      for (int j = 0; j < N / 8; ++j) {
        const float2 x = *reinterpret_cast<const float2*>(&sm.xs[8 * j + 2 * (lane & 3)]);
        acc[4 * j + 0] = fmaf(c0, x.x, acc[4 * j + 0]);
        acc[4 * j + 1] = fmaf(c0, x.y, acc[4 * j + 1]);
        acc[4 * j + 2] = fmaf(s0, x.x, acc[4 * j + 2]);
        acc[4 * j + 3] = fmaf(s0, x.y, acc[4 * j + 3]);
      }
      wgmma::fence_operand(acc);
    }
    if constexpr (C == kPipe) {
      wgmma::wait<1>();
    } else {
      wgmma::wait<0>();
      wgmma::fence_operand(part);
      if constexpr (one_fma(C)) {
#pragma unroll
        for (int i = 0; i < N / 2; ++i) acc[i] = fmaf(i & 2 ? c0 : s0, part[i], acc[i]);
        if constexpr (C == kSumsOnly) {  // the sums' reads, each used by one add
#pragma unroll
          for (int j = 0; j < N / 8; ++j)
            acc[4 * j] += reinterpret_cast<const float2*>(&sm.xs[8 * j + 2 * (lane & 3)])->x;
        }
      } else if constexpr (C != kWait) {
#pragma unroll
        for (int j = 0; j < N / 8; ++j) {
          const float2 x = C == kSumsRegs ? xr[j % (sizeof(xr) / sizeof(xr[0]))]
                                          : *reinterpret_cast<const float2*>(&sm.xs[8 * j + 2 * (lane & 3)]);
          acc[4 * j + 0] = fmaf(s0, part[4 * j + 0], fmaf(c0, x.x, acc[4 * j + 0]));
          acc[4 * j + 1] = fmaf(s0, part[4 * j + 1], fmaf(c0, x.y, acc[4 * j + 1]));
          acc[4 * j + 2] = fmaf(c0, part[4 * j + 2], fmaf(s0, x.x, acc[4 * j + 2]));
          acc[4 * j + 3] = fmaf(c0, part[4 * j + 3], fmaf(s0, x.y, acc[4 * j + 3]));
        }
      }
    }
    // kBiasMma: once per 32 tiles (an item of K = 2,048), the bias term on the tensor cores: 4 MMAs of K 16 (b per
    // group against the sums' hi and lo pieces, 2 x 32 groups) into the partial, then acc += P.
    if (C == kBiasMma && (it & 31) == 31) {
      if constexpr (takes_turns(C)) turn_sync<W>(wg);
      wgmma::fence();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) wgmma::mma_bf16_rs<N>(part, a[ks], wgmma::desc_sw128(&sm.bhi[32 * ks]), ks > 0);
      wgmma::commit();
      if constexpr (takes_turns(C)) turn_arrive<W>(wg);
      wgmma::wait<0>();
      wgmma::fence_operand(part);
#pragma unroll
      for (int i = 0; i < N / 2; ++i) acc[i] += part[i];
    }
  }
  if (takes_turns(C) && wg == 0) turn_sync<W>(wg);  // the last warpgroup's final arrival
  wgmma::wait<0>();
  wgmma::fence_operand(part);
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < N / 2; ++i) sum += acc[i] + part[i];
  out[blockIdx.x * blockDim.x + tid] = sum;
}


// d (64 x N int32, N / 2 per thread) += A (64 x 32 u8, registers; the m16n8k32 fragment layout) B^T (N x 32 s8,
// descriptor); acc == 0 overwrites. Only the bench uses it (the width the int8 rows need).
#define FERN_I8_D8(b)                                                                                             \
  "+r"(d[b]), "+r"(d[b + 1]), "+r"(d[b + 2]), "+r"(d[b + 3]), "+r"(d[b + 4]), "+r"(d[b + 5]), "+r"(d[b + 6]), \
      "+r"(d[b + 7])
__device__ __forceinline__ void mma_u8s8_rs_n128(int (&d)[64], const uint32_t (&a)[4], uint64_t db, int acc) {
#if FERN_HAS_WGMMA
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k32.s32.u8.s8 "
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
               "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
               "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
               "{%64, %65, %66, %67}, %68, p;\n}\n"
               : FERN_I8_D8(0), FERN_I8_D8(8), FERN_I8_D8(16), FERN_I8_D8(24), FERN_I8_D8(32), FERN_I8_D8(40),
                 FERN_I8_D8(48), FERN_I8_D8(56)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
#else
  (void)d, (void)a, (void)db, (void)acc;
  __trap();
#endif
}
#undef FERN_I8_D8

enum I8Chain { kI8Pipe, kI8Shift, kI8TwoParts, kI8ShiftTurns };

template <int W, I8Chain C>
__global__ void __launch_bounds__(W * 128, 1) rate_i8_kernel(int iters, float* out) {
  constexpr int N = 128;
  extern __shared__ unsigned char rate_raw[];
  auto& sm = wgmma::smem_at_atom<RateSmem<W, N>>(rate_raw);
  const int tid = threadIdx.x, lane = tid & 31;
  {
    uint32_t* w = reinterpret_cast<uint32_t*>(&sm);
    const int words = static_cast<int>(sizeof(RateSmem<W, N>) / 4);
    for (int i = tid; i < words; i += W * 128) w[i] = (i * 2654435761u) & 0x3f3f3f3fu;
  }
  wgmma::fence_proxy_async();
  __syncthreads();
  const int r0 = 64 * (tid >> 7) + 16 * ((tid >> 5) & 3) + (lane >> 2);
  uint32_t a[2][4];
#pragma unroll
  for (int ks = 0; ks < 2; ++ks)
#pragma unroll
    for (int i = 0; i < 4; ++i) a[ks][i] = (tid * 131u + ks * 17u + i) & 0x0f0f0f0fu;
  const float s0 = 1.0f + tid * 1e-3f, c0 = 0.5f - tid * 1e-3f;
  float acc[N / 2];
  int p1[N / 2], p0[C == kI8TwoParts ? N / 2 : 1];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) acc[i] = 0.0f, p1[i] = 0;
#pragma unroll
  for (int i = 0; i < int(sizeof(p0) / sizeof(p0[0])); ++i) p0[i] = 0;
  constexpr bool turns = C == kI8ShiftTurns;
  const int wg = tid >> 7;
  if (turns && wg == W - 1) turn_arrive<W>(wg);
  for (int it = 0; it < iters; ++it) {
    if constexpr (C != kI8Pipe) {  // u8 codes from 4-bit words: low nibbles, then high nibbles
      const uint4 u = sm.codes[r0][it & 1], v = sm.codes[r0 + 8][it & 1];
      a[0][0] = u.x & 0x0f0f0f0fu, a[0][1] = v.x & 0x0f0f0f0fu, a[0][2] = (u.x >> 4) & 0x0f0f0f0fu;
      a[0][3] = (v.x >> 4) & 0x0f0f0f0fu, a[1][0] = u.y & 0x0f0f0f0fu, a[1][1] = v.y & 0x0f0f0f0fu;
      a[1][2] = (u.y >> 4) & 0x0f0f0f0fu, a[1][3] = (v.y >> 4) & 0x0f0f0f0fu;
    }
    wgmma::fence_operand(p1);
    if constexpr (turns) turn_sync<W>(wg);
    wgmma::fence();
#pragma unroll
    for (int ks = 0; ks < 2; ++ks)
      mma_u8s8_rs_n128(p1, a[ks], wgmma::desc_sw128(&sm.bhi[32 * ks]), C == kI8Pipe || ks > 0);
    if constexpr (C == kI8Shift || turns) {
      wgmma::commit();
      if constexpr (turns) turn_arrive<W>(wg);
      wgmma::wait<0>();
      wgmma::fence_operand(p1);
#pragma unroll
      for (int i = 0; i < N / 2; ++i) p1[i] <<= 8;
      wgmma::fence_operand(p1);
      if constexpr (turns) turn_sync<W>(wg);
      wgmma::fence();
    }
    if constexpr (C == kI8TwoParts) {
#pragma unroll
      for (int ks = 0; ks < 2; ++ks)
        mma_u8s8_rs_n128(p0, a[ks], wgmma::desc_sw128(&sm.blo[32 * ks]), ks > 0);
    } else {
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) mma_u8s8_rs_n128(p1, a[ks], wgmma::desc_sw128(&sm.blo[32 * ks]), 1);
    }
    wgmma::commit();
    if constexpr (turns) turn_arrive<W>(wg);
    if constexpr (C == kI8Pipe) {
      wgmma::wait<1>();
    } else {
      wgmma::wait<0>();
      wgmma::fence_operand(p1);
      if constexpr (C == kI8TwoParts) wgmma::fence_operand(p0);
      if constexpr (turns) {
#pragma unroll
        for (int i = 0; i < N / 2; ++i) acc[i] = fmaf(i & 2 ? c0 : s0, float(p1[i]), acc[i]);
      } else {
#pragma unroll
        for (int j = 0; j < N / 8; ++j) {
          const float2 x = *reinterpret_cast<const float2*>(&sm.xs[8 * j + 2 * (lane & 3)]);
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            float v = float(p1[4 * j + i]);
            if constexpr (C == kI8TwoParts) v = fmaf(256.0f, v, float(p0[4 * j + i]));
            acc[4 * j + i] = fmaf(i & 2 ? c0 : s0, v, fmaf(i & 2 ? s0 : c0, i & 1 ? x.y : x.x, acc[4 * j + i]));
          }
        }
      }
    }
  }
  if (turns && wg == 0) turn_sync<W>(wg);  // the last warpgroup's final arrival
  wgmma::wait<0>();
  wgmma::fence_operand(p1);
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < N / 2; ++i) sum += acc[i] + float(p1[i]);
  if constexpr (C == kI8TwoParts) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) sum += float(p0[i]);
  }
  out[blockIdx.x * blockDim.x + tid] = sum;
}

// Times `kernel` (sms blocks of W warpgroups, 4,096 tiles each, one block per SM) and prints its row. TFLOP/s count
// a tile's multiply-adds as the bf16 loop's (64 K x hi and lo), whatever MMAs the kernel runs for them, against the
// H200's dense bf16 peak; clk: clocks per iteration (each warpgroup one tile) at the SM clock the run reports
// (cudaDevAttrClockRate, the maximum).
void time_row(const char* name, int W, int N, const char* form, int sms, void (*kernel)(int, float*), size_t smem,
              float* out) {
  // At least 120 KB so that one block holds an SM alone, as the loop's blocks do.
  const size_t ask = smem < 120 * 1024 ? 120 * 1024 : smem;
  FERN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(ask)));
  const int iters = 4096;
  const double ms = bench::median_ms(nullptr, [&] { kernel<<<sms, W * 128, ask>>>(iters, out); });
  FERN_CUDA_CHECK(cudaGetLastError());
  const double flops = 2.0 * sms * W * double(iters) * 8 * 64 * N * 16;
  const double tf = flops / (ms * 1e-3) / 1e12;
  int khz = 0;
  FERN_CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
  const double clk = ms * 1e-3 * khz * 1e3 / iters;
  std::printf("| %-28s | %d | %3d | %s | %8.3f | %6.1f | %5.1f%% | %7.0f |\n", name, W, N, form, ms, tf,
              100.0 * tf / 989.0, clk);
}

template <int W, int N, bool SS, Chain C>
void row(const char* name, int sms, float* out) {
  time_row(name, W, N, SS ? "SS" : "RS", sms, rate_kernel<W, N, SS, C>, sizeof(RateSmem<W, N>) + 1024, out);
}

template <int W, I8Chain C>
void row_i8(const char* name, int sms, float* out) {
  time_row(name, W, 128, "RS", sms, rate_i8_kernel<W, C>, sizeof(RateSmem<W, 128>) + 1024, out);
}

}  // namespace

int main() {
  if (!gemm_wg_supported()) {
    std::printf("bench_wgmma_rate: needs an sm_90a build on compute capability 9.0; skipped\n");
    return 0;
  }
  int sms = 0;
  FERN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  float* out = nullptr;
  FERN_CUDA_CHECK(cudaMalloc(&out, size_t(sms) * 384 * sizeof(float)));
  std::printf("## wgmma rate, one block per SM (%d SMs), 4,096 tiles of 8 MMAs (m64nNk16 bf16) per warpgroup\n\n", sms);
  std::printf("| chain | WGs | N | A | ms | TFLOP/s | of 989 | clk/tile |\n|---|---:|---:|---|---:|---:|---:|---:|\n");
  row<1, 128, false, kPipe>("pipe", sms, out);
  row<2, 128, false, kPipe>("pipe", sms, out);
  row<2, 128, true, kPipe>("pipe", sms, out);
  row<2, 64, false, kPipe>("pipe", sms, out);
  row<2, 128, false, kWait>("wait", sms, out);
  row<2, 128, true, kWait>("wait", sms, out);
  row<2, 128, false, kPromote>("wait+promote", sms, out);
  row<2, 128, false, kZero>("wait+promote+zero", sms, out);
  row<2, 128, false, kCodes>("wait+promote+zero+codes", sms, out);
  row<2, 128, false, kCodesNoZero>("wait+promote+codes (no zero)", sms, out);
  row<3, 128, false, kCodesNoZero>("wait+promote+codes (no zero)", sms, out);
  row<2, 96, false, kCodes>("wait+promote+zero+codes", sms, out);
  row<2, 64, false, kCodes>("wait+promote+zero+codes", sms, out);
  row<3, 64, false, kCodesNoZero>("wait+promote+codes (no zero)", sms, out);
  row<2, 128, false, kPingPong>("codes chain, turns", sms, out);
  row<3, 128, false, kPingPong>("codes chain, turns", sms, out);
  row<2, 96, false, kPingPong>("codes chain, turns", sms, out);
  row<2, 64, false, kPingPong>("codes chain, turns", sms, out);
  row<2, 128, false, kPingPong1>("codes chain, turns, 1 FMA", sms, out);
  row<3, 128, false, kPingPong1>("codes chain, turns, 1 FMA", sms, out);
  row<2, 128, false, kBiasUnder>("turns, bias under MMAs", sms, out);
  row<2, 96, false, kBiasUnder>("turns, bias under MMAs", sms, out);
  row<2, 64, false, kBiasUnder>("turns, bias under MMAs", sms, out);
  row<2, 128, false, kSumsRegs>("turns, sums in registers", sms, out);
  row<2, 128, false, kSumsOnly>("turns, 1 FMA + sums read", sms, out);
  row<2, 128, false, kBiasMma>("turns, q codes, bias by MMA", sms, out);
  row<2, 96, false, kBiasMma>("turns, q codes, bias by MMA", sms, out);
  row<2, 64, false, kBiasMma>("turns, q codes, bias by MMA", sms, out);
  row_i8<1, kI8Pipe>("i8 pipe", sms, out);
  row_i8<2, kI8Pipe>("i8 pipe", sms, out);
  row_i8<2, kI8Shift>("i8 shift", sms, out);
  row_i8<3, kI8Shift>("i8 shift", sms, out);
  row_i8<2, kI8TwoParts>("i8 two partials", sms, out);
  row_i8<2, kI8ShiftTurns>("i8 shift, turns, 1 FMA", sms, out);
  row_i8<3, kI8ShiftTurns>("i8 shift, turns, 1 FMA", sms, out);
  FERN_CUDA_CHECK(cudaFree(out));
  return 0;
}
