// The exact-code Hopper prefill tile loop for 4-bit affine weights (FERN_GEMM_WG_PIPE=q4b, the default where the
// format allows: 4-bit codes, groups a multiple of 64; q4 and q4h are its other forms, kHiLo and kHalf below).
// Why: profiling the warp-specialized hi/lo loop (gemm_tile_ws.cuh; docs/notes/cuda-prefill-v5-ws.md) showed its MMA
// warps waiting ~40% of the time for the producers, whose dequantization (s q + b in fp32, split into bf16 hi + lo:
// ~15 ALU/FMA instructions per weight pair) saturated the integer pipe and waited on the scale loads. Here the
// weights enter the MMA as their codes:
//  - a code q is exact in bf16 as the number 128 + q: one LOP3 per pair of codes ((w >> 4 j) & 0x000f000f | 0x43004300
//    puts codes j and j + 4 of a word into one bf16x2 register). The pairs come out in the K order n0 n4 n1 n5 n2 n6
//    n3 n7 inside each 8-code word; the x rows are written in the same order by to_xbf_q4 (gemm_wg.h), and a dot
//    product does not care about the order of its terms;
//  - the codes stay packed in shared memory (32 bytes per weight row and tile) and the MMA warps unpack them straight
//    into the MMA's register operand (wgmma with A from registers): each thread's fragment needs pair j = lane % 4 of
//    two words per 16-wide K step and row, one shift + LOP3 each. (Version 5 unpacked them in the producers into a
//    16 KB bf16 tile per stage for a shared-memory operand: the unpack, its stores and their proxy fence cost ~16% of
//    the dense loop, docs/notes/cuda-prefill-v6-q4.md);
//  - two MMAs per K step, (128 + q) x_hi and (128 + q) x_lo, into a per-tile fp32 partial P (64 K = one group, or
//    part of one: groups a multiple of 64);
//  - per tile, the MMA warps promote the partial in fp32: acc += s P + (b - 128 s) xs, where xs is the tile's sum of
//    x (hi + lo) of that token row (to_xbf_q4). Precision: the products are exact, x = hi + lo to ~2^-17, the sums
//    fp32 (the split loop's numerics, gemm_tile.cuh).
// Roles (384 threads, one block per SM): two MMA warpgroups (threads 0..255, warpgroup g owns weight rows 64 g ..
// 64 g + 63, the same accumulator layout and epilogue mapping as the other wgmma loops) and one producer warpgroup
// (threads 256..383: thread 256 + r stages weight row r of the tile, so the caller computes its RowSrc from tid % 128
// for these threads: weight_row()). The producers fill a ring of S stages with cp.async only (x rows, row sums, the
// packed codes; their completion arrives on the stage's "full" mbarrier by itself: cp.async.mbarrier.arrive.noinc),
// plus each row's scale and bias (loaded two tiles ahead, converted and stored, then a second arrival). The MMA
// warpgroups wait on "full", unpack, issue the tile's 8 MMAs, wait for them, promote, and hand the stage back on
// "empty"; the next K tile's "full" wait runs under the current tile's MMAs and its code and scale loads under the
// promotion (+0.5-0.9% prefill: docs/notes/cuda-prefill-v25-prefetch.md). (Tried and reverted: the next tile's MMAs
// into a second partial before the promotion, which capped the tiles at 96 tokens and lost 5%:
// docs/notes/cuda-prefill-v9-overlap.md.) H (FERN_GEMM_WG_PIPE=q4h, opt-in):
// x as one fp16 row and the codes as fp16, one MMA per step (docs/notes/cuda-prefill-v13-q4h.md).
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/cuda_util.cuh"
#include "cuda/gemm_tile.cuh"
#include "cuda/ptx.cuh"
#include "cuda/gemm_tile_wg.cuh"
#include "cuda/wgmma.cuh"

namespace fern::cuda::q4tile {

using wgtile::kBK;  // K per tile: one 128-byte swizzled row of bf16
using wgtile::kBW;  // weight rows per block: two MMA warpgroups of 64
constexpr int kRowBytes = wgtile::kTileRowBytes;
constexpr int kConsumers = 256;
constexpr int kProducers = 128;
constexpr int kThreads = kConsumers + kProducers;
// Registers per thread once the roles split (setmaxnreg; the block starts with ptxas's count, 168 in every form that
// reaches this loop): the MMA warpgroups' two NTOK / 2 arrays (accumulators, partial) and fragments spilled at 168
// (ptxas: 92 bytes in the dense 128-token q4b kernel, up to 28 in the MoE ones). The MMA warpgroups can only take
// what the producers give back (128 x 96 + 256 x 200 = 63,488 <= 384 x 168: 96 / 208, the whole SM's 65,536, hung);
// fewer for the producers made them spill (ptxas at 40: 260-676 bytes; at 72: up to 172; at 88: 44).
constexpr int kProducerRegs = 96;
constexpr int kConsumerRegs = 200;
// The block's registers at launch: __launch_bounds__(384, 1) caps ptxas at 168 per thread, and a kernel that holds
// setmaxnreg gets that cap (ptxas -v: 168 in every instance). Were it given fewer, the MMA warpgroups' increase would
// wait for registers that never come (a hang the GPU tests' timeouts catch).
static_assert(kProducers * kProducerRegs + kConsumers * kConsumerRegs <= kThreads * 168,
              "the MMA warpgroups take more registers than the producers give back");
constexpr int kTurnBar = 1;  // named barriers 1 and 2: the MMA warpgroups' turns (0 is __syncthreads)

// Shared memory: S stages of the x hi and lo tiles (each on a 1024-byte boundary, the swizzle atom), the packed
// codes, the rows' (s, b - 128 s) and the token rows' sums; then the barriers.
template <int NTOK, int S>
struct Smem {
  static_assert(NTOK % 8 == 0, "token tiles of whole 8-row atoms");
  uint8_t xhi[S][NTOK * kRowBytes];
  uint8_t xlo[S][NTOK * kRowBytes];
  uint4 codes[S][kBW][2];  // weight row r's 32 bytes, its two 16-byte halves stored swapped when (r / 4) is odd
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

// Where half h of weight row r's codes sits: the halves of rows 4..7 (mod 8) swapped, so that the 8 rows a warp's
// 16-byte reads touch at once (lane / 4) fall on distinct banks.
__device__ __forceinline__ int code_half(int r, int h) { return h ^ ((r >> 2) & 1); }

// bf16x2 (128 + code j, 128 + code j + 4) of an 8-code word: one shift and one LOP3.
__device__ __forceinline__ uint32_t code_pair(uint32_t w, int j) {
  return ((w >> (4 * j)) & 0x000f000fu) | 0x43004300u;
}
// The same pair as fp16x2 (for q4h): 128 = 0x5800 in fp16, whose last mantissa bit is worth 1/8 there, so 128 + q
// is 0x5800 | q << 3 (exact).
__device__ __forceinline__ uint32_t code_pair_f16(uint32_t w, int j) {
  return (((w >> (4 * j)) & 0x000f000fu) << 3) | 0x58005800u;
}

// The same pair as the codes themselves (for q4b): bf16x2 (q j, q j + 4), exact, one subtraction of 128 more.
__device__ __forceinline__ uint32_t code_pair_q(uint32_t w, int j) {
  const uint32_t v = code_pair(w, j);
  const __nv_bfloat162 r =
      __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&v), __floats2bfloat162_rn(128.0f, 128.0f));
  return *reinterpret_cast<const uint32_t*>(&r);
}

// The loop's forms (gemm_wg.h WgPipe): kHiLo (q4: codes 128 + q against x hi and lo, acc += s P + (b - 128 s) xs per
// tile), kHalf (q4h: one fp16 row of x), kBias (q4b: codes q against x hi and lo, acc += s P per tile, and per item
// one more ring tile for the bias term: the rows' biases against the sums' bf16 hi/lo pieces).
enum : int { kHiLo = 0, kHalf = 1, kBias = 2 };
// Blocks of 16 groups of 64 the bias tile covers at most (K <= 4,096: xbf_carve gives wider rows no sums' pieces).
constexpr int kMaxBiasBlocks = 4;

// The weight-tile row thread `tid` stages (producers only; other threads get a row too, unused).
__device__ __forceinline__ int weight_row(int tid) { return tid & (kProducers - 1); }

// One weight row's scale and bias for one tile, as loaded (the bf16 bits are converted only when the tile is staged,
// two tiles later: converting at the load made every producer iteration wait for its own loads).
struct RowSb {
  uint16_t s, b;
};

// q4b's bias tile for one warpgroup: the A fragments (the biases of rows r0 and r0 + 8 for sub-group j, 64 wide,
// group j >> gsh: register 0 row r0 at K 2 jq and 2 jq + 1 of a block of 16, 1 row r0 + 8, 2 and 3 the same at K + 8;
// zero past the last group and for padding rows; loaded before the stage's wait so that their latency overlaps
// it), the stage's wait, this warpgroup's turn, then NB blocks of 16 groups, each two K-16 MMAs (the sums' hi and lo
// pieces, B from the stage's x slots: blocks 0, 1 in the hi slot, 2, 3 in the lo slot) with the block's fragment,
// into the zeroed partial; waits for them. One function per block count: every MMA sequence is straight-line code
// between its fence and its wait, and only NB fragments are live.
template <int NTOK, int NB, int S>
__device__ __forceinline__ void bias_tile(Smem<NTOK, S>& sm, int t, float (&part)[NTOK / 2], const uint16_t* br0,
                                          const uint16_t* br1, int groups, int gsh, int jq, int wg) {
  uint32_t ab[NB][4];
#pragma unroll
  for (int tb = 0; tb < NB; ++tb)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const uint16_t* b = q & 1 ? br1 : br0;
      const int j = 16 * tb + 8 * (q >> 1) + 2 * jq;
      const uint32_t v0 = b != nullptr && j < groups ? __ldg(b + (j >> gsh)) : 0u;
      const uint32_t v1 = b != nullptr && j + 1 < groups ? __ldg(b + ((j + 1) >> gsh)) : 0u;
      ab[tb][q] = v0 | (v1 << 16);
    }
  const int st = t % S;
  ptx::mbar_wait(&sm.full[st], (t / S) & 1);
  wgmma::fence_proxy_async();
#pragma unroll
  for (int i = 0; i < NTOK / 2; ++i) part[i] = 0.0f;
  wgmma::fence_operand(part);
  ptx::bar_sync(kTurnBar + wg, kConsumers);
  wgmma::fence();
#pragma unroll
  for (int tb = 0; tb < NB; ++tb) {
    const uint8_t* slot = tb < 2 ? sm.xhi[st] : sm.xlo[st];
#pragma unroll
    for (int piece = 0; piece < 2; ++piece)
      wgmma::mma_bf16_rs<NTOK>(part, ab[tb], wgmma::desc_sw128(slot + 64 * (tb & 1) + 32 * piece));
  }
  wgmma::commit();
  ptx::bar_arrive(kTurnBar + (wg ^ 1), kConsumers);
  wgmma::wait<0>();
  wgmma::fence_operand(part);
}

// The producer's x copies of one K tile: chunk j of this thread into the swizzled stage tiles at dhi / dlo + j x 16
// rows (the same swizzle phase as chunk 0), from x + off[j] (x: the tile's first column of the hi or lo rows; off[j] =
// row * K + 8 * (p % 8), 32-bit), a padding row (bit j of pad) zero-filled. Why not wgtile::copy_x_tile: its 64-bit
// offset per copy, the reloaded base pointers and the range checks of a thread index the compiler could not bound
// cost ~14 instructions per pair of copies; Nsight Compute on the MoE gate/up kernel at 4,096 rows found the
// producer issuing ~223 instructions per stage at 12% of its cycles while the MMA warpgroups waited for stages 15%
// of theirs.
template <int PER, bool LO>
__device__ __forceinline__ void copy_x_chunks(uint8_t* dhi, uint8_t* dlo, const uint16_t* xhi, const uint16_t* xlo,
                                              const uint32_t (&off)[PER], uint32_t pad) {
  constexpr int kStep = (kProducers / 8) * kRowBytes;  // 16 rows
  if (pad == 0) {  // every row real: no per-copy predicate (all but the last tiles of an expert's rows)
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      ptx::cp_async16(dhi + j * kStep, xhi + off[j]);
      if constexpr (LO) ptx::cp_async16(dlo + j * kStep, xlo + off[j]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      const bool ok = ((pad >> j) & 1u) == 0u;
      ptx::cp_async16(dhi + j * kStep, xhi + off[j], ok);
      if constexpr (LO) ptx::cp_async16(dlo + j * kStep, xlo + off[j], ok);
    }
  }
}

// The loop over n_items weight tiles of one token tile, one after the other through the same ring (a block that
// computes several column blocks of its token rows: the ring never drains between them, and the block's start-up
// (barriers, tile map, row lookups, the first stage's latency) is paid once for all of them). For the MMA threads,
// epilogue(item, acc) receives each item's results (MMA warpgroup's 64 weight rows x NTOK tokens, wgmma layout) = W x^T
// over the width K; the producer threads return false (the caller returns: only the MMA threads hold results).
// xhi/xlo: the permuted bf16 rows of to_xbf_q4 (row stride K), xsum: their 64-wide sums (row stride K / 64); H
// (q4h): xhi holds one fp16 row per row (xlo unused), the codes enter as fp16 and each K step is one MMA;
// row_of(r): the global row of token-tile row r (< 0: padding); wsrc_of(item): the weight row of weight_row(tid) in
// item `item` (w == nullptr: padding); gs: the group size, a multiple of 64. F == kBias (q4b): bsum, bk the sums'
// pieces (X16::bsum, bk), bias_of(item, r) the bias array (one bf16 per group) of weight-tile row r in item `item`
// (nullptr: padding). Must be called by all kThreads threads after the caller's last early return; does not end with
// a block barrier (the epilogues write global memory only).
template <int NTOK, int S, int F, class RowOf, class WsrcOf, class BiasOf, class Epilogue>
__device__ __forceinline__ bool mainloop_items(Smem<NTOK, S>& sm, int K, int gs, const uint16_t* xhi,
                                               const uint16_t* xlo, const float* xsum, const uint16_t* bsum, int bk,
                                               RowOf row_of, int n_items, WsrcOf wsrc_of, BiasOf bias_of,
                                               Epilogue epilogue) {
  static_assert(S >= 2, "a ring of at least two stages");
  constexpr bool H = F == kHalf, B = F == kBias;
  static_assert(B || NTOK <= kProducers, "one producer per token row copies the sums (q4b takes them in its bias tile)");
  // The next tile's codes and scales loaded under the promotion: 20 more registers across it, which the 144-token
  // loop (acc and partial 72 each) does not have (ptxas spilled in the MoE gate/up kernel); it loads them after the
  // stage's wait, as before version 25.
  constexpr bool kEarlyFetch = NTOK <= 128;
  const int tid = threadIdx.x;
  const int nk = K / kBK;
  const int per_item = nk + (B ? 1 : 0);  // q4b: the item's bias tile after its K tiles
  const int n_tiles = n_items * per_item;  // ring tile t is item t / per_item, K tile t % per_item
  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < S; ++s) {
      ptx::mbar_init(&sm.full[s], 2 * kProducers);  // per producer: its copies landing, its scale and bias
      ptx::mbar_init(&sm.empty[s], kConsumers);
    }
  }
  __syncthreads();

  if (tid < kConsumers) {
    ptx::regs_inc<kConsumerRegs>();
    const int wg = tid >> 7, lane = tid & 31;
    // The two warpgroups issue their tiles' MMAs in turn (named barriers kTurnBar + g: warpgroup g waits on its own
    // before issuing, then arrives on the other's), so that the tensor cores run one warpgroup's MMAs while the
    // other promotes and unpacks; left alone they fall into step (both issue, both wait, both promote with the
    // tensor cores idle: bench_wgmma_rate). Warpgroup 1 lets warpgroup 0 start.
    if (wg == 1) ptx::bar_arrive(kTurnBar, kConsumers);
    const int r0 = 64 * wg + 16 * ((tid >> 5) & 3) + (lane >> 2);  // this thread's rows r0 and r0 + 8
    const int jq = lane & 3;  // its K pair in each 8-wide step of the MMA fragment
    float acc[NTOK / 2], part[NTOK / 2];
    int t = 0;
    for (int item = 0; item < n_items; ++item) {
#pragma unroll
      for (int i = 0; i < NTOK / 2; ++i) acc[i] = 0.0f;
      // The packed codes of rows r0 and r0 + 8 (8 words each, word 2 ks + h holding K 16 ks + 8 h .. + 7) and their
      // (s, b - 128 s): loaded at the top for the item's first K tile, else under the previous tile's promotion.
      uint32_t c0[8], c1[8];
      float2 sb0, sb1;
      auto fetch = [&](int st) {
        sb0 = sm.sb[st][r0], sb1 = sm.sb[st][r0 + 8];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint4 a = sm.codes[st][r0][code_half(r0, h)], b = sm.codes[st][r0 + 8][code_half(r0 + 8, h)];
          c0[4 * h + 0] = a.x, c0[4 * h + 1] = a.y, c0[4 * h + 2] = a.z, c0[4 * h + 3] = a.w;
          c1[4 * h + 0] = b.x, c1[4 * h + 1] = b.y, c1[4 * h + 2] = b.z, c1[4 * h + 3] = b.w;
        }
      };
      for (int kt = 0; kt < nk; ++kt, ++t) {
        const int st = t % S;
        if (kt == 0) {  // later K tiles' stages were waited for under the previous tile's MMAs
          ptx::mbar_wait(&sm.full[st], (t / S) & 1);
          wgmma::fence_proxy_async();  // the stage's cp.async data, published by the barrier, to the MMA's proxy
        }
        if (kt == 0 || !kEarlyFetch) fetch(st);
        // The MMA fragments of the four 16-wide steps, all written before the wgmma fence (registers an MMA reads
        // must be written before the fence that precedes it).
        uint32_t a[kBK / 16][4];
#pragma unroll
        for (int ks = 0; ks < kBK / 16; ++ks) {
          const auto pair = [&](uint32_t w) {
            return H ? code_pair_f16(w, jq) : B ? code_pair_q(w, jq) : code_pair(w, jq);
          };
          a[ks][0] = pair(c0[2 * ks]);
          a[ks][1] = pair(c1[2 * ks]);
          a[ks][2] = pair(c0[2 * ks + 1]);
          a[ks][3] = pair(c1[2 * ks + 1]);
        }
#pragma unroll
        for (int i = 0; i < NTOK / 2; ++i) part[i] = 0.0f;
        wgmma::fence_operand(part);
        ptx::bar_sync(kTurnBar + wg, kConsumers);  // this warpgroup's turn to issue
        wgmma::fence();
#pragma unroll
        for (int ks = 0; ks < kBK / 16; ++ks) {
          if constexpr (H) {
            wgmma::mma_f16_rs<NTOK>(part, a[ks], wgmma::desc_sw128(&sm.xhi[st][32 * ks]));
          } else {
            wgmma::mma_bf16_rs<NTOK>(part, a[ks], wgmma::desc_sw128(&sm.xhi[st][32 * ks]));
            wgmma::mma_bf16_rs<NTOK>(part, a[ks], wgmma::desc_sw128(&sm.xlo[st][32 * ks]));
          }
        }
        wgmma::commit();
        ptx::bar_arrive(kTurnBar + (wg ^ 1), kConsumers);  // the other warpgroup's turn
        // The next K tile's stage, waited for while these MMAs run (its wait at the top of the next iteration
        // is skipped): Nsight Compute on the dense 128-token and MoE gate/up kernels at 4,096 rows found that
        // wait on the chain between a warpgroup's MMAs (tensor pipe active 64% / 50%); moving it, with the loads
        // below, gained only 0.5-0.9%, so most of the pipe's idle time lies elsewhere (notes v25).
        if (kt + 1 < nk) {
          ptx::mbar_wait(&sm.full[(t + 1) % S], ((t + 1) / S) & 1);
          wgmma::fence_proxy_async();
        }
        wgmma::wait<0>();
        wgmma::fence_operand(part);
        const float2 s0 = sb0, s1 = sb1;
        if (kEarlyFetch && kt + 1 < nk) fetch((t + 1) % S);  // their latency under the promotion
        // part[4 j + i]: row r0 + 8 (i / 2), token 8 j + 2 (lane % 4) + i % 2.
        if constexpr (B) {  // the bias term comes with the item's bias tile
#pragma unroll
          for (int j = 0; j < NTOK / 8; ++j) {
            acc[4 * j + 0] = fmaf(s0.x, part[4 * j + 0], acc[4 * j + 0]);
            acc[4 * j + 1] = fmaf(s0.x, part[4 * j + 1], acc[4 * j + 1]);
            acc[4 * j + 2] = fmaf(s1.x, part[4 * j + 2], acc[4 * j + 2]);
            acc[4 * j + 3] = fmaf(s1.x, part[4 * j + 3], acc[4 * j + 3]);
          }
        } else {
#pragma unroll
          for (int j = 0; j < NTOK / 8; ++j) {
            const float2 xs = *reinterpret_cast<const float2*>(&sm.xs[st][8 * j + 2 * (lane & 3)]);
            acc[4 * j + 0] = fmaf(s0.x, part[4 * j + 0], fmaf(s0.y, xs.x, acc[4 * j + 0]));
            acc[4 * j + 1] = fmaf(s0.x, part[4 * j + 1], fmaf(s0.y, xs.y, acc[4 * j + 1]));
            acc[4 * j + 2] = fmaf(s1.x, part[4 * j + 2], fmaf(s1.y, xs.x, acc[4 * j + 2]));
            acc[4 * j + 3] = fmaf(s1.x, part[4 * j + 3], fmaf(s1.y, xs.y, acc[4 * j + 3]));
          }
        }
        ptx::mbar_arrive(&sm.empty[st]);  // the stage's operands, sums and scales are all read
      }
      if constexpr (B) {  // the item's bias tile: acc += sum over groups g of b_g (xs_hi + xs_lo)_g
        const int groups = K / kBK, gsh = 31 - __clz(gs / kBK), nb = (groups + 15) / 16;
        const uint16_t *br0 = bias_of(item, r0), *br1 = bias_of(item, r0 + 8);
        if (nb == 1)
          bias_tile<NTOK, 1>(sm, t, part, br0, br1, groups, gsh, jq, wg);
        else if (nb == 2)
          bias_tile<NTOK, 2>(sm, t, part, br0, br1, groups, gsh, jq, wg);
        else
          bias_tile<NTOK, kMaxBiasBlocks>(sm, t, part, br0, br1, groups, gsh, jq, wg);
#pragma unroll
        for (int i = 0; i < NTOK / 2; ++i) acc[i] += part[i];
        ptx::mbar_arrive(&sm.empty[t % S]);
        ++t;
      }
      epilogue(item, acc);
    }
    if (wg == 0) ptx::bar_sync(kTurnBar, kConsumers);  // warpgroup 1's last arrival (each barrier ends balanced)
    return true;
  }

  // Producers: thread p stages weight row p of every item.
  ptx::regs_dec<kProducerRegs>();
  constexpr int kXChunks = NTOK * 8;  // 16-byte chunks of one x tile (hi or lo)
  constexpr int kXPer = kXChunks / kProducers;
  static_assert(kXChunks % kProducers == 0, "whole x chunks per producer");
  const int p = (tid - kConsumers) & (kProducers - 1);  // the mask bounds p for the compiler (tid >= kConsumers here)
  int xrow[kXPer];  // global rows of this thread's x chunks (-1: padding)
  wgtile::x_rows<NTOK, kProducers>(xrow, row_of, p);
  // Their element offsets in the x rows (32-bit: an x buffer holds fewer than 2^32 elements, xbf_carve), padding
  // rows at 0 with their bit in xpad, and chunk 0's place in a stage tile (copy_x_chunks).
  uint32_t xoff[kXPer], xpad = 0;
#pragma unroll
  for (int j = 0; j < kXPer; ++j) {
    xpad |= xrow[j] < 0 ? 1u << j : 0u;
    xoff[j] = xrow[j] < 0 ? 0u : uint32_t(xrow[j]) * uint32_t(K) + 8u * uint32_t(p & 7);
  }
  const uint32_t xd0 = wgmma::sw128(p >> 3, p & 7);
  const int srow = p < NTOK ? row_of(p) : -1;  // the token row whose sums this thread copies
  const int groups = K / kBK;
  const int gsh = 31 - __clz(gs / kBK);  // tiles per group: a power of two (make_qw checks the group size)

  // Scale and bias run two tiles ahead of the copies (their latency hides behind this tile's and the next one's
  // work), at their own position (sb_item, sb_kt) with that item's weight row, advanced by counting (no division).
  int sb_item = 0, sb_kt = 0;
  gemm::RowSrc sb_src = wsrc_of(0);
  auto next_sb = [&](RowSb& r) {
    if (sb_item >= n_items || sb_src.w == nullptr) {  // past the end, or a padding row (zero codes, scale, bias)
      r.s = r.b = 0;
    } else {
      const int g = sb_kt >> gsh;
      r.s = __ldg(sb_src.s + g);
      r.b = __ldg(sb_src.b + g);
    }
    if (++sb_kt == nk) {
      sb_kt = 0;
      if (++sb_item < n_items) sb_src = wsrc_of(sb_item);
    }
  };

  RowSb cur, n1, n2;
  next_sb(cur);
  next_sb(n1);
  gemm::RowSrc wsrc = wsrc_of(0);
  for (int t = 0, item = 0, kt = 0; t < n_tiles; ++t) {
    const int st = t % S;
    if (B && kt == nk) {  // q4b: the item's bias tile, the sums' pieces of its token rows in the x slots
      ptx::mbar_wait(&sm.empty[st], ((t / S) & 1) ^ 1);
      if (bk > 64)
        wgtile::copy_x_tile<NTOK, kProducers, true>(sm.xhi[st], sm.xlo[st], bsum, bsum + 64, xrow, p, bk, 0);
      else
        wgtile::copy_x_tile<NTOK, kProducers, false>(sm.xhi[st], sm.xlo[st], bsum, bsum, xrow, p, bk, 0);
      ptx::cp_async_arrive_noinc(&sm.full[st]);
      ptx::mbar_arrive(&sm.full[st]);
      kt = 0;
      if (t + 1 < n_tiles) wsrc = wsrc_of(++item);
      continue;
    }
    next_sb(n2);
    ptx::mbar_wait(&sm.empty[st], ((t / S) & 1) ^ 1);
    copy_x_chunks<kXPer, !H>(sm.xhi[st] + xd0, sm.xlo[st] + xd0, xhi + kt * kBK, xlo + kt * kBK, xoff, xpad);
    if (!B && p < NTOK)
      ptx::cp_async4(&sm.xs[st][p], srow >= 0 ? xsum + int64_t(srow) * groups + kt : xsum, srow >= 0);
    // This row's 32 bytes of codes (zeros for a padding row: cp.async with no source bytes fills zeros).
    const char* wbase = static_cast<const char*>(wsrc.w);
    const char* src = wbase != nullptr ? wbase + int64_t(kt) * (kBK / 2) : reinterpret_cast<const char*>(xsum);
#pragma unroll
    for (int h = 0; h < 2; ++h) ptx::cp_async16(&sm.codes[st][p][code_half(p, h)], src + 16 * h, wbase != nullptr);
    ptx::cp_async_arrive_noinc(&sm.full[st]);
    const float sc = bf16_to_f32(cur.s), bi = bf16_to_f32(cur.b);
    sm.sb[st][p] = make_float2(sc, fmaf(-128.0f, sc, bi));
    ptx::mbar_arrive(&sm.full[st]);
    cur = n1;
    n1 = n2;
    if (++kt == nk && !B && t + 1 < n_tiles) {  // the next item's weight row (q4b: after the bias tile)
      kt = 0;
      wsrc = wsrc_of(++item);
    }
  }
  return false;
}

}  // namespace fern::cuda::q4tile
