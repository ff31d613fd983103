// The whole MoE block of one token (decode) in one launch, instead of the fused router, gate/up and down launches
// of moe.cu (docs/notes/cuda-decode-v3.md: 8.2 + 10.2 + 7.2 us per layer for 16 MB of expert weights that need
// ~4 us at bandwidth; each launch paid its own start, activation staging and first-load latency).
//
// Every block of a grid that is fully resident (at most the occupancy per SM, times the SMs) runs three phases
// separated by two grid-wide handoffs through counters:
//  1. Router rows (and the shared-expert gate's row) and the shared expert's gate/up rows, whose weights are
//     requested before the PDL wait. Each block then counts itself in and waits for all blocks.
//  2. Every block runs the top-k itself on the complete logits (a redundant 1 KB read from L2 per block instead of
//     one block's result being published through a second handoff; redux.sync rounds, topk_keys), then requests
//     the down rows it will need (they depend only on the chosen experts) and computes its share of the routed
//     gate/up rows while those loads are in flight. Count in, wait for all blocks.
//  3. Each warp finishes its down row(s) from the already loaded weights and the complete intermediate h.
// With a MoeNorm (moe_residual) the kernel also computes its input, resid += delta and RMSNorm, in every block, and
// adds its output to resid (block 0 writes resid + delta after the first handoff; the warp of down row n adds row n
// after the second). Measured on the H200 (docs/notes/cuda-decode-v4.md): 22.4 us per layer against 25.5 for the
// three launches, far from the 11-13 predicted. Version 5 (docs/notes/cuda-decode-v5.md) times the phases
// (moe_fused_timed, compiled only with -DFERN_MOE_PHASE_TIMING) and shortens the chain: one fence per block at a
// handoff, chunk sums by shuffles (one barrier less per staging), the top-k on redux.sync, the residual row read
// together with h. Version 6 (docs/notes/cuda-decode-v6.md) reads every input of an earlier kernel through L2
// (stage_x: its const __restrict__ reads raced with the previous kernel under PDL) and can run 512-thread blocks.
// Version 7 (docs/notes/cuda-decode-v7.md) drops version 5's comparison switches (FERN_CUDA_MOE_V4; 128 registers
// and no spill in every instantiation now: 20.9 us per launch against 21.6). Its other candidate, the experts' code
// words through per-warp bulk copies (cp.async.bulk) into shared memory instead of registers, measured slower on
// the H200 (23.5 us per launch; the gate/up segment 9.7 us against ~7.5) and is not kept. Version 20
// (docs/notes/cuda-decode-v20-burst.md) loads the experts' scales and biases one word per lane and row (sb32):
// 20.40 -> 19.86 us per launch. Version 22 (docs/notes/cuda-decode-v22-fastdiv.md) takes the divisions out of the
// row loads' address math (FastDiv: 20.11 -> 19.42 us) and packs the down rows' scales and biases too (18.59 us).
// Version 29 runs the gate/up rows on the normed row's 8-bit digits (17.32 us); version 30
// (docs/notes/cuda-decode-v30-int-digits.md) writes the expert tables from warp 0's registers and computes the
// routing weights after the loads are requested (17.14 us). Version 31 (docs/notes/cuda-decode-v31-fold.md) takes
// the router out of the launch where the mixer's output projection ran it (FOLD, kernels.h RouteFold): no router
// rows, no first handoff, the top-k as soon as the row is staged (17.18 -> 14.76 us; the projections +1.1 us each).
// Version 33 (docs/notes/cuda-decode-v33-down-digits.md) runs the down rows on 8-bit digits of h with a scale per
// chunk (kDownQ8, qdot.cuh Q8ChunkSink): 13.57 -> 13.28 us. Version 36 (docs/notes/cuda-decode-v36-topk-sorted.md)
// sorts each lane's keys before the top-k rounds (topk_rounds): the 4K step 1,372 -> 1,364 us, about 0.2 us per launch.
//
// Handoff counters (ctx.counters[0, kMoeFusedCounters)): [0] an epoch, [1..2] arrivals at the router handoff, [3..4]
// arrivals at the h handoff, one of each pair per epoch parity. A launch reads the epoch after its PDL wait (the
// previous launch has then finished), uses the pair of its parity, zeroes the other pair for the next launch, and
// the last block to arrive at the h handoff (every block has read the epoch by then) advances the epoch. Nothing
// needs a reset between launches, whatever the grid size.
//
// Deadlock freedom: the grid is at most the number of blocks that fit on the GPU at once, so every block becomes
// resident; a PDL successor launches only once every block has passed pdl_trigger(), i.e. is resident already.
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/env.h"
#include "cuda/fast_div.h"
#include "cuda/kernels.h"
#include "cuda/launch.cuh"
#include "cuda/qdot.cuh"
#include "cuda/topk.cuh"

namespace fern::cuda {
namespace {

// Threads per block: 512 with one block per SM (the default), or 256 with two (FERN_CUDA_MOE_WIDE=0, moe_wide):
// half the blocks of version 5, so half the requests for the rows that every block reads from L2 (the input row,
// h), which docs/notes/cuda-decode-v5.md measured as hot-spot bound; the same warps per SM. Measured on the H200
// (docs/notes/cuda-decode-v6.md, run 1): 21.57 against 22.65 us per launch.
constexpr int kThreads = 256;
constexpr int kMaxSlots = 33;  // top-k <= 32 routed slots + the shared expert
constexpr int kDownU = 5;
// Dynamic shared memory limit (x twice and h; the real model needs 37 KB). Two blocks per SM fit with room to
// spare; a larger need falls back to the three launches.
constexpr size_t kMaxSmem = 96 * 1024;

// Chunks per lane per pass of a 2048-wide row: 2 (4-bit, 64 chunks), 4 (8-bit, 128 chunks). Wider rows take more
// passes (loaded and consumed one after another), narrower ones leave lanes idle.
template <int BITS>
constexpr int kNch = BITS == 4 ? 2 : 4;

// N rows of one width, NCH chunks per lane of one pass. sbw: the rows' scales and biases as one word per lane (the
// packed form below), where s and b are not used.
template <int BITS, int N>
struct Rows {
  uint4 w[kNch<BITS>][N];
  float s[kNch<BITS>][N], b[kNch<BITS>][N];
  uint32_t sbw[N];
};

// The packed form of a 4-bit row of 2,048 weights in groups of 64 (sb32, decided by the host: fused_args): its 32
// scales and 32 biases in one 4-byte load per lane (qdot.cuh load_sb_word) instead of four 2-byte loads per lane,
// handed to the lanes by shuffles when the row is consumed (dot_rows, sb_from_word), so that the loads of all rows
// are in flight together. Same values, same arithmetic: the same bits. Why: the expert rows of one launch are a
// ~14 MB burst that takes ~7.3 us against ~4.0 us for a bare burst of loads of that size (bench_cuda_stage), and two
// thirds of the phase's load instructions were these 2-byte loads (docs/notes/cuda-decode-v20-burst.md).
template <int N, typename Mat>
__device__ __forceinline__ void load_rows_sb32(const Mat& mat, const int (&row)[N], int lane, Rows<4, N>& R) {
#pragma unroll
  for (int u = 0; u < kNch<4>; ++u) {
#pragma unroll
    for (int r = 0; r < N; ++r) {
      const ChunkMat m = mat(r);
      R.w[u][r] = row[r] >= 0 ? ld_stream(m.w + (row[r] * m.cpr + lane + 32 * u)) : make_uint4(0, 0, 0, 0);
    }
  }
#pragma unroll
  for (int r = 0; r < N; ++r) R.sbw[r] = row[r] >= 0 ? load_sb_word(mat(r), row[r], 0, lane) : 0u;
}

// Pass `pass` of rows row[r] of matrix mat(r) (row < 0: none): lane takes chunks lane + 32 * (pass * NCH + u).
// `mat` returns a view (from registers or from a shared-memory table, so that no view stays live in registers).
// sb32: the packed scales and biases (load_rows_sb32; 4-bit rows of 64 chunks only, so one pass).
template <int BITS, int N, typename Mat>
__device__ __forceinline__ void load_rows(const Mat& mat, const int (&row)[N], int pass, int cpr, int lane,
                                          Rows<BITS, N>& R, bool sb32 = false) {
  constexpr int NCH = kNch<BITS>;
  if constexpr (BITS == 4) {
    if (sb32) return load_rows_sb32<N>(mat, row, lane, R);
  }
#pragma unroll
  for (int u = 0; u < NCH; ++u) {
    const int c = lane + 32 * (pass * NCH + u);
#pragma unroll
    for (int r = 0; r < N; ++r) {
      if (row[r] >= 0 && c < cpr) {
        load_chunk<BITS>(mat(r), row[r], c, R.w[u][r], R.s[u][r], R.b[u][r]);
      } else {
        R.w[u][r] = make_uint4(0, 0, 0, 0);
        R.s[u][r] = R.b[u][r] = 0.0f;
      }
    }
  }
}

template <int BITS, int N>
__device__ __forceinline__ void dot_rows(const Rows<BITS, N>& R, int pass, int cpr, const float4* xs, const float* xc,
                                         int lane, float (&acc)[N], bool sb32 = false) {
  constexpr int NCH = kNch<BITS>, F4 = ChunkTraits<BITS>::kF4;
  if constexpr (BITS == 4) {
    if (sb32) {  // one pass of 64 chunks: every lane takes part (the shuffles need all 32)
#pragma unroll
      for (int u = 0; u < NCH; ++u) {
        float d[N];
        chunk_dot<BITS, 32, N>(R.w[u], xs + lane + u * (F4 * 32), d);
        const float xsum = xc[lane + 32 * u];
#pragma unroll
        for (int r = 0; r < N; ++r) {
          float sc, bi;
          sb_from_word(R.sbw[r], lane, u, sc, bi);
          acc[r] += apply_group<BITS>(d[r], sc, bi, xsum);
        }
      }
      return;
    }
  }
#pragma unroll
  for (int u = 0; u < NCH; ++u) {
    const int j = pass * NCH + u, c = lane + 32 * j;
    if (c < cpr) {
      float d[N];
      chunk_dot<BITS, 32, N>(R.w[u], xs + lane + j * (F4 * 32), d);
      const float xsum = xc[c];
#pragma unroll
      for (int r = 0; r < N; ++r) acc[r] += apply_group<BITS>(d[r], R.s[u][r], R.b[u][r], xsum);
    }
  }
}

// The packed 4-bit rows of one pass (sb32) against x as 8-bit digits (qdot.cuh chunk_dot_q8): xq the digits in
// shared memory, xsc = sx / 65536 (the row's scale in the dot's units).
template <int N>
__device__ __forceinline__ void dot_rows_q8(const Rows<4, N>& R, const uint4* xq, const float* xc, float xsc,
                                            int lane, float (&acc)[N]) {
#pragma unroll
  for (int u = 0; u < kNch<4>; ++u)
    q8_rows_chunk<N>(R.w[u], R.sbw, xq + u * (kQ8Slots * 32) + lane, xc + lane + 32 * u, xsc, lane, u, acc);
}

// Full dot products of N rows whose first pass is already in `first`; every lane gets the sums. ONE: the caller
// knows that the rows have one pass (rows of 2,048 weights: the packed forms), so the loop over further passes,
// whose loads and dots are a second copy of the row code, is not compiled. Q8 (packed 4-bit rows of one pass only):
// x as 8-bit digits (xq, xsc: dot_rows_q8) instead of the fp32 row xs.
template <int BITS, int N, bool ONE = false, bool Q8 = false, typename Mat>
__device__ __forceinline__ void finish_rows(const Mat& mat, const int (&row)[N], const Rows<BITS, N>& first,
                                            int cpr, const float4* xs, const float* xc, int lane, float (&out)[N],
                                            bool sb32 = false, const uint4* xq = nullptr, float xsc = 0.0f) {
  constexpr int NCH = kNch<BITS>;
  float acc[N];
#pragma unroll
  for (int r = 0; r < N; ++r) acc[r] = 0.0f;
  if constexpr (Q8) {
    static_assert(BITS == 4 && ONE, "the digit form takes the packed one-pass rows only");
    dot_rows_q8<N>(first, xq, xc, xsc, lane, acc);
  } else {
    dot_rows<BITS, N>(first, 0, cpr, xs, xc, lane, acc, sb32);  // sb32 rows have this one pass only
  }
  if constexpr (!ONE) {
    const int passes = (cpr + 32 * NCH - 1) / (32 * NCH);
    for (int p = 1; p < passes; ++p) {
      Rows<BITS, N> R;
      load_rows<BITS, N>(mat, row, p, cpr, lane, R);
      dot_rows<BITS, N>(R, p, cpr, xs, xc, lane, acc);
    }
  }
#pragma unroll
  for (int r = 0; r < N; ++r) out[r] = warp_sum(acc[r]);
}

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Phase timestamps (kernels.h, kMoeStamp*), written only by the TIMED instantiation, which exists only when the
// file is compiled with -DFERN_MOE_PHASE_TIMING (moe_fused_timed).
template <bool TIMED>
struct Stamps {
  unsigned long long* p;
  // Block 0's thread `tid` at this point (0 unless that thread is elsewhere then: moe_fused_kernel's FOLD).
  __device__ __forceinline__ void at(int i, int tid = 0) const {
    if constexpr (TIMED) {
      if (blockIdx.x == 0 && threadIdx.x == tid) p[i] = global_ns();
    }
  }
  // The latest (LATEST) or earliest (!LATEST, stored inverted so that both are an atomicMax) block at this point.
  template <bool LATEST = true>
  __device__ __forceinline__ void extreme(int i) const {
    if constexpr (TIMED) {
      if (threadIdx.x == 0) atomicMax(p + i, LATEST ? global_ns() : ~global_ns());
    }
  }
};

// All blocks meet: every thread's writes of the phase before, every block's after. As a cooperative grid sync does
// it: one barrier, then thread 0 alone fences (the fence is cumulative over what the barrier ordered before it),
// counts the block in at *cnt and waits until all blocks have; the second barrier releases the block. (Version 4
// fenced on all 256 threads, each waiting for its own outstanding stores.)
template <bool TIMED>
__device__ __forceinline__ void grid_handoff(int* cnt, int epoch_next, int* epoch, bool advance_epoch,
                                             const Stamps<TIMED>& st, int s_arrive, int s_last, int s_pass) {
  __syncthreads();
  if (threadIdx.x == 0) {
    st.at(s_arrive);
    st.extreme(s_last);
    __threadfence();
    const int old = atomicAdd(cnt, 1);
    if (advance_epoch && old == int(gridDim.x) - 1) atomicExch(epoch, epoch_next);
    while (ld_acquire(cnt) < int(gridDim.x)) {
    }
    st.at(s_pass);
  }
  __syncthreads();
}

// Order-preserving unsigned key of a float (a larger float has a larger key; 0 is below every float, -inf too).
// -0 becomes +0 first (f + 0.0f), so that the two zeros tie as they do as floats.
__device__ __forceinline__ uint32_t float_key(float f) {
  const uint32_t u = __float_as_uint(f + 0.0f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_float(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

template <int NPL>
__device__ __forceinline__ void topk_rounds(uint32_t (&key)[NPL], int k, uint32_t& my_key, int& my_id);

// Router top-k of one token by one warp, on the logits themselves (softmax is monotone, and the weights are
// renormalised over the chosen experts, so the softmax's denominator cancels: w = exp(l - l_max) / sum over the
// chosen). A round is two single-instruction warp reductions (redux.sync: the largest key, then the lowest index
// holding it, the CPU's tie rule) instead of topk.cuh's five shuffle-and-compare steps of (value, index) pairs; no
// softmax over all E before the selection. Same choice and order as topk_warp (descending, lowest index on ties).
// `st` stamps block 0 once the keys are in registers and once the rounds are done (TIMED builds only;
// docs/notes/cuda-decode-v15-topk.md).
// The choice: lane r < k of the warp gets slot r's key (my_key) and expert (my_id); every lane the shared-expert
// gate's logit (sgl). route_weights turns them into the routing weights.
template <int NPL, bool TIMED>
__device__ __forceinline__ void topk_keys(const float* logits, const float* sg_logit, int E, int k, uint32_t& my_key,
                                          int& my_id, float& sgl, const Stamps<TIMED>& st) {
  const int lane = threadIdx.x & 31;
  uint32_t key[NPL];
#pragma unroll
  for (int i = 0; i < NPL; ++i) {
    const int e = i * 32 + lane;
    key[i] = e < E ? float_key(__ldcg(logits + e)) : 0u;
  }
  sgl = __ldcg(sg_logit);  // requested with the logits
  if constexpr (TIMED) {
    if (key[0] != 1u) st.at(kMoeStampTopkKeys);  // (a use of the loaded keys: the stamp waits for them)
  }
  topk_rounds<NPL>(key, k, my_key, my_id);
  st.at(kMoeStampTopkRounds);
}

// topk_keys' rounds on keys already in registers (lane l holds experts l, l + 32, ...). With up to 8 keys per lane
// (FERN_MOE_TOPK_SORTED, the default) each lane first sorts its keys, so that a round's owner takes its next best in
// one step instead of a pass over its keys behind the round's two reductions (that pass was on every round's chain:
// the next round's reduction waits for the owner). The sort is a comparator network (Batcher's for 8 keys) on
// (key, slot) pairs, largest key first and the lower slot (hence the lower expert) first among equal keys: the same
// choice and order as the pass. -DFERN_MOE_TOPK_SORTED=0 keeps the pass (a comparison build).
#ifndef FERN_MOE_TOPK_SORTED
#define FERN_MOE_TOPK_SORTED 1
#endif
template <int NPL>
__device__ __forceinline__ void topk_rounds(uint32_t (&key)[NPL], int k, uint32_t& my_key, int& my_id) {
  const int lane = threadIdx.x & 31;
  my_key = 0u;
  my_id = 0;
  // The rounds, on this lane's best key and its expert (head: bk, bi; INT_MAX where none is left) and how its owner
  // drops it (drop).
  auto rounds = [&](auto head, auto drop) {
#pragma unroll 1
    for (int r = 0; r < k; ++r) {
      uint32_t bk;
      int bi;
      head(bk, bi);
      const uint32_t mk = __reduce_max_sync(0xffffffffu, bk);
      const int win =
          static_cast<int>(__reduce_min_sync(0xffffffffu, bk == mk ? static_cast<uint32_t>(bi) : 0xffffffffu));
      if (bi == win) drop(win);
      if (lane == r) {
        my_key = mk;
        my_id = win;
      }
    }
  };
  if constexpr (FERN_MOE_TOPK_SORTED && NPL <= 8) {
    // s = key << 32 | (NPL - 1 - slot): as unsigned 64-bit numbers, a larger key first, then the lower slot.
    uint64_t srt[NPL];
#pragma unroll
    for (int i = 0; i < NPL; ++i) srt[i] = (uint64_t(key[i]) << 32) | uint32_t(NPL - 1 - i);
    auto cas = [&](int i, int j) {  // the larger of srt[i], srt[j] into i
      const uint64_t a = srt[i], b = srt[j];
      const bool swap = b > a;
      srt[i] = swap ? b : a;
      srt[j] = swap ? a : b;
    };
    if constexpr (NPL == 8) {  // Batcher's odd-even merge sort: 19 comparators in 6 layers
      constexpr int kPairs[19][2] = {{0, 1}, {2, 3}, {4, 5}, {6, 7}, {0, 2}, {1, 3}, {4, 6}, {5, 7}, {1, 2}, {5, 6},
                                     {0, 4}, {1, 5}, {2, 6}, {3, 7}, {2, 4}, {3, 5}, {1, 2}, {3, 4}, {5, 6}};
#pragma unroll
      for (int c = 0; c < 19; ++c) cas(kPairs[c][0], kPairs[c][1]);
    } else {  // odd-even transposition: NPL layers
#pragma unroll
      for (int p = 0; p < NPL; ++p)
#pragma unroll
        for (int i = p & 1; i + 1 < NPL; i += 2) cas(i, i + 1);
    }
    rounds(
        [&](uint32_t& bk, int& bi) {
          bk = uint32_t(srt[0] >> 32);
          bi = bk != 0u ? (NPL - 1 - int(uint32_t(srt[0]) & 0xffu)) * 32 + lane : INT_MAX;
        },
        [&](int) {  // its next best moves up
#pragma unroll
          for (int i = 0; i + 1 < NPL; ++i) srt[i] = srt[i + 1];
          srt[NPL - 1] = 0u;
        });
  } else {
    uint32_t best_k = 0u;
    int best_i = INT_MAX;
    auto local_best = [&] {  // i ascending and strict >: the lowest index among this lane's equal keys
      best_k = 0u;
      best_i = INT_MAX;
#pragma unroll
      for (int i = 0; i < NPL; ++i) {
        if (key[i] > best_k) {
          best_k = key[i];
          best_i = i * 32 + lane;
        }
      }
    };
    local_best();
    rounds(
        [&](uint32_t& bk, int& bi) {
          bk = best_k;
          bi = best_i;
        },
        [&](int win) {  // clears it and finds its next best
#pragma unroll
          for (int i = 0; i < NPL; ++i)
            if (i * 32 + lane == win) key[i] = 0u;
          local_best();
        });
  }
}

// The routing weights from topk_keys' choice (all lanes of the warp): lane r < k gets slot r's weight, softmax over
// the chosen logits; the shared expert's gate sigmoid(sgl) is returned to every lane.
// FOLD: the keys are of the pre-logits (RouteFold), scaled by the norm's factor inv here.
template <bool FOLD = false>
__device__ __forceinline__ float route_weights(uint32_t my_key, float sgl, int k, float& sgate, float inv = 1.0f) {
  const int lane = threadIdx.x & 31;
  const float lmax = key_float(__shfl_sync(0xffffffffu, my_key, 0));
  const float p = lane < k ? expf(FOLD ? (key_float(my_key) - lmax) * inv : key_float(my_key) - lmax) : 0.0f;
  const float sum = warp_sum(p);
  sgate = 1.0f / (1.0f + expf(FOLD ? -(sgl * inv) : -sgl));
  return p / sum;
}

// A fixed-point pre-logit (RouteFold) as a float.
__device__ __forceinline__ float fold_value(long long v) { return __ll2float_rn(v) * (1.0f / kFoldUnit); }

// SMALL: the caller knows E <= 256 (the packed forms), so only the 8-per-lane top-k is compiled into the kernel.
template <bool TIMED, bool SMALL>
__device__ __forceinline__ void topk_fused(const float* logits, const float* sg_logit, int E, int k, uint32_t& my_key,
                                           int& my_id, float& sgl, const Stamps<TIMED>& st) {
  if constexpr (SMALL) {
    topk_keys<8>(logits, sg_logit, E, k, my_key, my_id, sgl, st);
  } else if (E <= 64) {
    topk_keys<2>(logits, sg_logit, E, k, my_key, my_id, sgl, st);
  } else if (E <= 256) {
    topk_keys<8>(logits, sg_logit, E, k, my_key, my_id, sgl, st);
  } else {
    topk_keys<kTopkMaxPerLane>(logits, sg_logit, E, k, my_key, my_id, sgl, st);
  }
}

struct FusedArgs {
  QW router, sgr;             // router [E, H] and the shared-expert gate's single row [1, H] (format RB)
  QW gate, up, down;          // routed experts (format B)
  QW sgate, sup, sdown;       // shared expert (format B)
  const float* x;             // [H]
  MoeScratch s;               // router_logits [E], sgate_logit [1], topk_ids/topk_w [k], sgate [1], h [k*I + Is]
  float* out;                 // [H]
  int* counters;              // kFusedCounters ints, zero before the first launch
  int topk;
  MoeNorm norm;               // norm.resid != nullptr: x = rmsnorm(resid + delta) computed here (x unused)
  unsigned long long* stamps;  // kMoeStamps words (TIMED only)
  int sb32;                    // packed scales and biases: 0 none, 1 gate/up rows (load_rows_sb32), 2 and down rows
  FastDiv div_i, div_cd;       // by I (a task's slot) and by I's chunks per row (an item's slot)
};

// Float4s of the input row each thread keeps in registers when the kernel computes the norm itself (H <= 2048).
constexpr int kNormV = 2;
// The fold form (moe_fused_kernel's FOLD): rows of this width only (the packed forms').
constexpr int kFoldH = 2048;

// The down rows against h as 8-bit digits with a scale per chunk (Q8ChunkSink, chunk_dot_q8) in the lean digit form
// with packed down rows, instead of fp32 h (chunk_dot); -DFERN_MOE_DOWN_Q8=0 keeps fp32 h (a comparison build).
#ifndef FERN_MOE_DOWN_Q8
#define FERN_MOE_DOWN_Q8 1
#endif

// Thread 0 of every block after the PDL wait: the epoch for its block (moe_fused_kernel, read after a barrier), and
// block 0 zeroes the other parity's pair of handoff counters for the next launch (the previous one has finished).
__device__ __forceinline__ void take_epoch(int* counters, int* epoch_s) {
  const int ep = __ldcg(counters);
  *epoch_s = ep;
  if (blockIdx.x == 0) {
    const int o = (ep + 1) & 1;
    counters[1 + o] = 0;
    counters[3 + o] = 0;
  }
}

// LATE (moe_fused_kernel): warp 0 writes the expert tables from its registers (lane r < k: slot r's expert my_id;
// no shared round trip of the ids, one barrier), and the routing weights, needed only by the down rows, come after
// this warp's loads are issued (route_late).
template <int B>
__device__ __forceinline__ void late_tables(const FusedArgs& a, int k, int my_id, const ChunkMat& m_sg,
                                            const ChunkMat& m_su, ChunkMat* mg, ChunkMat* mu, ChunkMat* md) {
  const int lane = threadIdx.x & 31;
  if (lane < k) {
    mg[lane] = chunk_mat<B>(a.gate, my_id);
    mu[lane] = chunk_mat<B>(a.up, my_id);
    md[lane] = chunk_mat<B>(a.down, my_id);
    if (blockIdx.x == 0) a.s.topk_ids[lane] = my_id;
  }
  if (lane == (k & 31)) {  // the shared slot (k <= 32: lane 0 takes it too when k = 32)
    mg[k] = m_sg;
    mu[k] = m_su;
    md[k] = chunk_mat<B>(a.sdown, 0);
  }
}

// Writes float4 f of a row into the lane-major staging layout of BITS (qdot.cuh).
template <int BITS>
__device__ __forceinline__ void put_x(float4* xs, int f, float4 v) {
  constexpr int F4 = ChunkTraits<BITS>::kF4;
  xs[x_slot<BITS, 32>(f / F4, f % F4)] = v;
}

// SB: the packed scales and biases (FusedArgs::sb32: 1 the gate/up rows, 2 the down rows too; a template argument,
// so that each form has its own register allocation). The slot of a gate/up task and of a down item comes from
// FastDiv (one wide multiply and a shift) instead of a division (~20 instructions) ahead of the loads that depend
// on it: 20.11 -> 19.42 us per launch (docs/notes/cuda-decode-v22-fastdiv.md).
//
// Q8: the shared and routed experts' gate/up rows against the normed row as three 8-bit digits per value with
// integer dot products (qdot.cuh chunk_dot_q8; FERN_CUDA_MOE_Q8=1): the norm's block reduction also takes the row's
// largest magnitude, and the digits take the place of the fp32 expert-layout row in shared memory. Only the lean
// norm-mode form with packed rows (the forward pass's).
//
// FOLD (MoeNorm::pre; kernels.h RouteFold): the output projection before has added delta to resid and left the
// router's pre-logits in a.norm.pre. Phase 1 is then the shared expert's rows alone and the first handoff is gone.
// The top-k needs the pre-logits only, not the normed row, so warp 0 runs it beside the staging: it requests the
// pre-logits right after the PDL wait, runs the top-k and writes the expert tables while warps 1.. stage the row
// (their block reduction and barriers on named barrier 1, without warp 0) and run phase 1; all meet at the tables'
// barrier. The chosen are scaled by the norm's factor for the routing weights. Block 0 zeroes pre after the second
// handoff (every block has read it by then) for the next projection.
template <int RB, int B, bool TIMED, int NT, int SB, int LEAN, bool Q8, bool LATE, bool FOLD = false>
__global__ void __launch_bounds__(NT, 512 / NT) moe_fused_kernel(FusedArgs a) {
  static_assert(!Q8 || (LEAN == 1 && SB >= 1 && B == 4), "the digit form is compiled for the lean norm mode only");
  static_assert(!FOLD || (Q8 && LATE), "the fold is compiled for the lean digit form with the late weights only");
  constexpr int kWarps = NT / 32;
  // The threads that stage the normed row: all, or (FOLD) warps 1..; thread t holds float4s t - kSt0 + q kStN,
  // q < kNV, so that each warp holds 32 consecutive float4s from a multiple of 32 (chunk_sum_lanes, the chunk sums).
  constexpr int kSt0 = FOLD ? 32 : 0, kStN = NT - kSt0, kNV = FOLD ? (kFoldH / 4 + kStN - 1) / kStN : kNormV;
  const bool stager = !FOLD || threadIdx.x >= 32;
  // The packed forms (SB >= 1) are taken only for rows of 2,048 weights and at most 256 experts (fused_args): every
  // router and expert row is one pass, and the top-k needs 8 logits per lane. Compiling only that code keeps the
  // kernel's hot path in fewer instruction-cache lines (the generic kernel is ~140 KB of code).
  constexpr bool kOne = SB >= 1 && LEAN >= 1;
  // LEAN 1 / 2: the norm mode known at compile time (1: with the norm, as the forward pass calls it; 2: without),
  // and every task loop known to run at most once per warp (the host checked that the grid's warps cover each
  // phase: lean_fits), so that the loops' second copies of the row loads are not compiled.
  constexpr bool kLean = LEAN >= 1;
  const bool norm_mode = LEAN == 1 ? true : LEAN == 2 ? false : a.norm.resid != nullptr;
  const Stamps<TIMED> st{a.stamps};
  st.at(kMoeStampStart);
  st.template extreme<false>(kMoeStampFirstStart);
  st.extreme(kMoeStampLastStart);
  extern __shared__ float4 smem[];
  __shared__ ChunkMat mg[kMaxSlots], mu[kMaxSlots], md[kMaxSlots];
  __shared__ float fac[kMaxSlots];
  __shared__ int32_t ids_s[32];
  __shared__ float wts_s[32], sg_s;
  __shared__ int epoch_s;
  __shared__ float2 fold_f;  // FOLD: the norm's factor and the digits' factor, for warp 0 (it took no part in them)
  constexpr int FB = ChunkTraits<B>::kF4, EB = ChunkTraits<B>::kElems;
  const int H = static_cast<int>(a.router.in);
  const int E = static_cast<int>(a.router.out);
  const int I = static_cast<int>(a.gate.out), Is = static_cast<int>(a.sgate.out);
  const int k = a.topk;
  const int nx = k * I + Is;
  const int lane = threadIdx.x & 31;
  const int W = gridDim.x * kWarps;
  // Warp order: block index fastest, so that the first tasks of each phase spread over all SMs.
  const int v = (threadIdx.x >> 5) * gridDim.x + blockIdx.x;

  // Dynamic shared memory: x in the router's layout, x in the experts' layout, then h in the experts' layout.
  float4* xr = smem;
  float* xrc = reinterpret_cast<float*>(xr + x_slots<RB, 32>(H));
  float4* xe = reinterpret_cast<float4*>(xrc + (H / ChunkTraits<RB>::kElems + 31) / 32 * 32);
  float* xec = reinterpret_cast<float*>(xe + x_slots<B, 32>(H));
  float4* xh = reinterpret_cast<float4*>(xec + (H / EB + 31) / 32 * 32);
  float* xhc = reinterpret_cast<float*>(xh + x_slots<B, 32>(nx));
  // Q8: the digits of the normed row in xe's place (q8_slots(H) <= x_slots<B, 32>(H) uint4) and the row's scale and
  // factor (qdot.cuh Q8Sink's, set by the norm below).
  Q8Sink q8{reinterpret_cast<uint4*>(xe), xec};
  float xsc = 0.0f;

  // ---- phase 1: router rows [0, E), the shared-expert gate row E, shared gate/up rows E + 1 + [0, Is) ----
  const ChunkMat m_router = chunk_mat<RB>(a.router, 0), m_sgr = chunk_mat<RB>(a.sgr, 0);
  const ChunkMat m_sg = chunk_mat<B>(a.sgate, 0), m_su = chunk_mat<B>(a.sup, 0);
  const int cpr_r = m_router.cpr, cpr_e = m_sg.cpr;
  const int n_route = FOLD ? 0 : E + 1, n_p1 = n_route + Is;
  Rows<RB, 1> rr;
  Rows<B, 2> sr;
  auto route_mat = [&](int u) { return [&, u](int) { return select(u < E, m_router, m_sgr); }; };
  auto shared_mat = [&](int r) { return select(r == 0, m_sg, m_su); };
  auto load_p1 = [&](int u) {
    if (u < n_route) {
      const int row[1] = {u < E ? u : 0};
      load_rows<RB, 1>(route_mat(u), row, 0, cpr_r, lane, rr);
    } else {
      const int row[2] = {u - n_route, u - n_route};
      load_rows<B, 2>(shared_mat, row, 0, cpr_e, lane, sr, SB >= 1);
    }
  };
  // FOLD: warp 0 takes no phase-1 row (it runs the top-k meanwhile); warps 1.. take the rows in the same order.
  const int v1 = FOLD ? v - int(gridDim.x) : v;
  if ((!FOLD || v1 >= 0) && v1 < n_p1) load_p1(v1);  // weights only: before waiting on the previous kernel
  float4 wn[kNV];  // the norm weight (norm mode), also a weight: requested before the wait
  if (norm_mode && stager) {
#pragma unroll
    for (int q = 0; q < kNV; ++q) {
      const int f = threadIdx.x - kSt0 + q * kStN;
      wn[q] = f < H / 4 ? __ldg(reinterpret_cast<const float4*>(a.norm.w) + f) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  pdl_wait();
  st.at(kMoeStampWaited);
  float rinv = 1.0f;  // the norm's factor (FOLD: for the routing weights)
  if (!FOLD && threadIdx.x == 0) take_epoch(a.counters, &epoch_s);  // FOLD: in warp 0's branch below
  float4 rsum[kNV];  // resid + delta (norm mode), written back by block 0 once every block has read resid
  if (!norm_mode) {
    stage_x<RB, 32>(a.x, H, xr, xrc);
    stage_x<B, 32>(a.x, H, xe, xec);  // (ends with a barrier: epoch_s is visible)
  } else if (stager) {
    // The residual add + RMSNorm that precedes the block (MODEL.md 2.0), computed by every block from L2: one
    // launch less per layer. Nobody writes resid during this launch until the first handoff.
    __shared__ float2 red[32];
    const float4* r4 = reinterpret_cast<const float4*>(a.norm.resid);
    const float4* d4 = reinterpret_cast<const float4*>(a.norm.delta);
    float ss = 0.0f, mx = 0.0f;  // mx (Q8): the largest |resid + delta| x |w|, the normed row's largest magnitude / inv
#pragma unroll
    for (int q = 0; q < kNV; ++q) {
      const int f = threadIdx.x - kSt0 + q * kStN;
      rsum[q] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (f < H / 4) {
        const float4 r = __ldcg(r4 + f), d = FOLD ? make_float4(0.f, 0.f, 0.f, 0.f) : __ldcg(d4 + f);
        rsum[q] = make_float4(r.x + d.x, r.y + d.y, r.z + d.z, r.w + d.w);
        ss += rsum[q].x * rsum[q].x + rsum[q].y * rsum[q].y + rsum[q].z * rsum[q].z + rsum[q].w * rsum[q].w;
        if constexpr (Q8) mx = max_abs_prod(mx, rsum[q], wn[q]);
      }
    }
    float inv;
    if constexpr (Q8) {
      inv = norm_inv_row_max<FOLD ? 1 : 0>(ss, mx, H, a.norm.eps, red, q8);  // FOLD: warps 1.. at barrier 1
      xsc = q8.factor();
      if (FOLD && threadIdx.x == kSt0) fold_f = make_float2(inv, xsc);  // for warp 0, read after the tables' barrier
    } else {
      inv = rsqrtf(block_sum(ss, reinterpret_cast<float*>(red)) / float(H) + a.norm.eps);
    }
    rinv = inv;
    // The normed row into both layouts (FOLD: the experts' only; no router rows), its chunk sums by shuffles (thread
    // f holds float4 f; qdot.cuh chunk_sum_lanes) instead of a second pass over shared memory behind another barrier.
#pragma unroll
    for (int q = 0; q < kNV; ++q) {
      if (q * kStN >= H / 4) break;  // the same on every thread: all lanes take part in the shuffles
      const int f = threadIdx.x - kSt0 + q * kStN;
      const float4 w = wn[q];  // zero beyond the row, as rsum is
      const float4 xv =
          make_float4(rsum[q].x * inv * w.x, rsum[q].y * inv * w.y, rsum[q].z * inv * w.z, rsum[q].w * inv * w.w);
      if (f < H / 4) {
        if constexpr (!FOLD) put_x<RB>(xr, f, xv);
        if constexpr (Q8) {
          // The digits only: the chunk sums below serve both layouts (their first shuffles are shared with the
          // router layout's; Q8Sink's own sums would repeat them).
          q8_put(q8.xq, f, make_float4(xv.x * q8.unit, xv.y * q8.unit, xv.z * q8.unit, xv.w * q8.unit));
        } else {
          put_x<B>(xe, f, xv);
        }
        if (blockIdx.x == 0 && a.norm.xn) reinterpret_cast<float4*>(a.norm.xn)[f] = xv;
      }
      const float sr = FOLD ? 0.0f : chunk_sum_lanes<RB>(xv), se = chunk_sum_lanes<B>(xv);
      if (!FOLD && f < H / 4 && f % ChunkTraits<RB>::kF4 == 0) xrc[f / ChunkTraits<RB>::kF4] = sr;
      if (f < H / 4 && f % FB == 0) xec[f / FB] = se;
    }
    if constexpr (FOLD) {
      named_sync<1>(kStN);  // the row for phase 1 (warp 0 meets the others at the tables' barrier)
    } else {
      __syncthreads();  // epoch_s is visible too
    }
  }
  st.at(kMoeStampStaged, kSt0);
  if (stager) pdl_trigger();  // every thread (FOLD: warp 0 once its tables are written, below)
  int epoch = 0;  // FOLD: read after the tables' barrier (thread 0 wrote it beside the staging)
  if constexpr (!FOLD) epoch = epoch_s;
  for (int u = v1; (!FOLD || u >= 0) && u < n_p1; u += W) {
    if (!kLean && u != v1) load_p1(u);
    if (u < n_route) {
      const int row[1] = {u < E ? u : 0};
      float d[1];
      finish_rows<RB, 1, kOne>(route_mat(u), row, rr, cpr_r, xr, xrc, lane, d);
      if (lane == 0) {
        if (u < E)
          a.s.router_logits[u] = d[0];
        else
          a.s.sgate_logit[0] = d[0];
      }
    } else {
      const int row[2] = {u - n_route, u - n_route};
      float d[2];
      finish_rows<B, 2, kOne, Q8>(shared_mat, row, sr, cpr_e, xe, xec, lane, d, SB >= 1, q8.xq, xsc);
      if (lane == 0) a.s.h[int64_t(k) * I + row[0]] = silu(d[0]) * d[1];
    }
    if constexpr (kLean) break;
  }
  if constexpr (FOLD) st.at(kMoeStampArrive1, kSt0);  // warp 1's shared-expert rows done (no router handoff)
  if constexpr (!FOLD)
    grid_handoff(a.counters + 1 + (epoch & 1), 0, a.counters, false, st, kMoeStampArrive1, kMoeStampLastArrive1,
                 kMoeStampPass1);
  if (!FOLD && norm_mode && blockIdx.x == 0) {  // every block has read resid by now
#pragma unroll
    for (int q = 0; q < kNV; ++q) {
      const int f = threadIdx.x + q * NT;
      if (f < H / 4) reinterpret_cast<float4*>(a.norm.resid)[f] = rsum[q];
    }
  }

  // ---- top-k in every block (FOLD: warp 0, beside the other warps' staging and phase 1), then the expert tables ----
  uint32_t my_key = 0u;  // warp 0, lane r < k: slot r's key and expert
  int my_id = 0;
  float sgl = 0.0f;
  if constexpr (FOLD) {
    if (!stager) {
      // Warp 0 comes here straight from the PDL wait (no staging, no phase-1 row), so that no other registers are
      // live beside the pre-logits. Lane l takes pre-logits l + 32 i (E <= 256) and the shared-expert gate's (E),
      // all requested at once.
      long long pv[9];
      const int S = a.norm.pre_stride;
#pragma unroll
      for (int i = 0; i < 9; ++i) {
        const int e = i < 8 ? i * 32 + lane : E;
        pv[i] = e < E || i == 8 ? __ldcg(a.norm.pre + int64_t(e) * S) : 0;
      }
      if (threadIdx.x == 0) take_epoch(a.counters, &epoch_s);  // behind the pre-logits' requests
      uint32_t key[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) key[i] = i * 32 + lane < E ? float_key(fold_value(pv[i])) : 0u;
      sgl = fold_value(pv[8]);
      if constexpr (TIMED) {
        if (key[0] != 1u) st.at(kMoeStampTopkKeys);  // (a use of the loaded keys: the stamp waits for them)
      }
      topk_rounds<8>(key, k, my_key, my_id);
      st.at(kMoeStampTopkRounds);
      late_tables<B>(a, k, my_id, m_sg, m_su, mg, mu, md);
      pdl_trigger();  // warp 0's (each thread executes it once; warps 1.. after their staging)
    }
  } else if (threadIdx.x < 32) {
    topk_fused<TIMED, kOne>(a.s.router_logits, a.s.sgate_logit, E, k, my_key, my_id, sgl, st);
  }
  if constexpr (LATE) {
    if (!FOLD && threadIdx.x < 32) late_tables<B>(a, k, my_id, m_sg, m_su, mg, mu, md);
    __syncthreads();  // FOLD: the join of warp 0 (tables) and warps 1.. (staging, phase 1)
    if constexpr (FOLD) {
      epoch = epoch_s;
      rinv = fold_f.x;
      xsc = fold_f.y;
    }
  } else {
    if (threadIdx.x < 32) {
      float sg;
      const float w = route_weights(my_key, sgl, k, sg);
      if (lane < k) {
        ids_s[lane] = my_id;
        wts_s[lane] = w;
      }
      if (lane == 0) sg_s = sg;
    }
    __syncthreads();
  }
  // LATE: warp 0's routing weights into fac (and block 0's copy for inspection), read after the h handoff.
  auto route_late = [&] {
    float sg;
    const float w = route_weights<FOLD>(my_key, sgl, k, sg, rinv);
    if (lane < k) {
      fac[lane] = w;
      if (blockIdx.x == 0) a.s.topk_w[lane] = w;
    }
    if (lane == 0) {
      fac[k] = sg;
      if (blockIdx.x == 0) a.s.sgate[0] = sg;
    }
  };
  if (!LATE && threadIdx.x <= k) {
    const int sl = threadIdx.x;
    const bool sh = sl == k;
    const int64_t e = sh ? 0 : ids_s[sl];
    mg[sl] = sh ? m_sg : chunk_mat<B>(a.gate, e);
    mu[sl] = sh ? m_su : chunk_mat<B>(a.up, e);
    md[sl] = sh ? chunk_mat<B>(a.sdown, 0) : chunk_mat<B>(a.down, e);
    fac[sl] = sh ? sg_s : wts_s[sl];
    if (blockIdx.x == 0) {  // the routing decision, for inspection (the kernel itself uses the shared copy)
      if (sh) {
        a.s.sgate[0] = sg_s;
      } else {
        a.s.topk_ids[sl] = ids_s[sl];
        a.s.topk_w[sl] = wts_s[sl];
      }
    }
  }
  if constexpr (!LATE) __syncthreads();

  // ---- phase 2: request this warp's first down row, then the routed gate/up rows (two tasks per warp pass) ----
  const int cprd = I / EB;
  const int routed_items = k * cprd, items = routed_items + Is / EB;
  auto item_slot = [&](int j) { return j < routed_items ? a.div_cd.div(j) : k; };
  auto item_chunk = [&](int j) { return j < routed_items ? a.div_cd.mod(j) : j - routed_items; };
  uint4 dw[kDownU];
  float ds[kDownU], db[kDownU];
  uint32_t dsb[kDownU] = {};  // SB == 2: the packed scale or bias word of this lane (below)
  auto load_down = [&](int n, int j0) {
#pragma unroll
    for (int q = 0; q < kDownU; ++q) {
      const int j = j0 + 32 * q;
      if constexpr (SB == 2) {
        // Every slot's down row is 16 chunks in groups of 64 (host: fused_args), so half-warp h of pass q holds
        // row n of slot j / 16 (the shared expert's included), chunk j % 16 per lane. Its 8 scales and 8 biases are
        // 8 words: lanes 0-3 of the half load the scale words, lanes 4-7 the bias words (one 4-byte load instead of
        // two 2-byte loads per lane), and the phase-3 loop hands them out by shuffles (down_sb).
        const bool ok = j < items;  // the same on the 16 lanes of a half
        const ChunkMat& m = md[ok ? j >> 4 : 0];
        const int c = lane & 15;
        dw[q] = ok ? ld_stream(m.w + (n * m.cpr + c)) : make_uint4(0, 0, 0, 0);
        dsb[q] = ok && c < 8 ? __ldg(reinterpret_cast<const uint32_t*>((c < 4 ? m.s : m.b) + n * m.gpr) + (c & 3)) : 0u;
      } else if (j < items) {
        load_chunk<B>(md[item_slot(j)], n, item_chunk(j), dw[q], ds[q], db[q]);
      } else {
        dw[q] = make_uint4(0, 0, 0, 0);
        ds[q] = db[q] = 0.0f;
      }
    }
  };
  // SB == 2: the scale and bias of this lane's chunk of pass q from the lanes of its half that loaded them (group
  // c / 2 of the row: word c / 4, half (c / 2) % 2). Every lane of the warp must call it (shuffles).
  auto down_sb = [&](int q, float& sc, float& bi) {
    const int c = lane & 15, src = (lane & 16) + (c >> 2);
    const uint32_t ws = __shfl_sync(0xffffffffu, dsb[q], src), wb = __shfl_sync(0xffffffffu, dsb[q], src + 4);
    const bool hi = (c >> 1) & 1;
    sc = __uint_as_float(hi ? ws & 0xffff0000u : ws << 16);
    bi = __uint_as_float(hi ? wb & 0xffff0000u : wb << 16);
  };
  st.at(kMoeStampRouted);
  if (v < H) load_down(v, lane);

  const int ntask = k * I;
  for (int u0 = v; u0 < ntask; u0 += 2 * W) {
    const int u1 = u0 + W;
    const int s0 = a.div_i.div(u0), r0 = u0 - s0 * I;
    const bool ok1 = u1 < ntask;
    const int s1 = ok1 ? a.div_i.div(u1) : s0, r1 = ok1 ? u1 - s1 * I : -1;
    // Views read from the shared tables where they are used (four views in registers would take 36 of them).
    auto mat = [&](int r) -> const ChunkMat& { return r == 0 ? mg[s0] : r == 1 ? mu[s0] : r == 2 ? mg[s1] : mu[s1]; };
    const int row[4] = {r0, r0, r1, r1};
    Rows<B, 4> R;
    load_rows<B, 4>(mat, row, 0, cpr_e, lane, R, SB >= 1);
    if (LATE && threadIdx.x < 32 && u0 == v) route_late();  // while the rows are in flight
    float d[4];
    finish_rows<B, 4, kOne, Q8>(mat, row, R, cpr_e, xe, xec, lane, d, SB >= 1, q8.xq, xsc);
    if (lane == 0) {
      a.s.h[u0] = silu(d[0]) * d[1];  // task u = slot * I + row is also h's index
      if (ok1) a.s.h[u1] = silu(d[2]) * d[3];
    }
    if constexpr (kLean) break;
  }
  if (LATE && threadIdx.x < 32 && v >= ntask) route_late();  // warp 0 had no gate/up task
  grid_handoff(a.counters + 3 + (epoch & 1), epoch + 1, a.counters, true, st, kMoeStampArrive2, kMoeStampLastArrive2,
               kMoeStampPass2);
  if constexpr (FOLD) {  // every block has read the pre-logits: zero for the next projection
    if (blockIdx.x == 0)
      for (int e = threadIdx.x; e <= E; e += NT) a.norm.pre[e * a.norm.pre_stride] = 0;
  }

  // ---- phase 3: down rows with the routing weights and the gated shared expert ----
  // The residual of this warp's first row is requested before staging h, so that both L2 round trips overlap.
  const bool resid_early = norm_mode && a.norm.add_out;
  const float resid_v = resid_early && lane == 0 && v < H ? __ldcg(a.norm.resid + v) : 0.0f;
  constexpr bool kDownQ8 = FERN_MOE_DOWN_Q8 && Q8 && SB == 2 && kLean;
  uint4* xqh = reinterpret_cast<uint4*>(xh);  // kDownQ8: h's digits in xh's place, the chunks' factors after them
  float* xhf = reinterpret_cast<float*>(xqh + q8_slots(nx));
  if constexpr (kDownQ8) {
    stage_rows(a.s.h, nx, Q8ChunkSink{xqh, xhc, xhf});
  } else {
    stage_x<B, 32>(a.s.h, nx, xh, xhc);
  }
  st.at(kMoeStampHStaged);
  for (int n = v; n < H; n += W) {
    float acc = 0.0f;
    for (int p0 = 0; p0 < items; p0 += 32 * kDownU) {  // warp-uniform passes (down_sb's shuffles)
      const int j0 = p0 + lane;
      if (!kLean && (n != v || p0 != 0)) load_down(n, j0);
#pragma unroll
      for (int q = 0; q < kDownU; ++q) {
        const int j = j0 + 32 * q;
        float sc = 0.0f, bi = 0.0f;
        if constexpr (SB == 2) {
          down_sb(q, sc, bi);
        } else {
          sc = ds[q];
          bi = db[q];
        }
        if (j < items) {
          const uint4 w1[1] = {dw[q]};
          if constexpr (kDownQ8) {
            int t[1], a2[1];
            chunk_dot_q8<1>(w1, xqh + (j >> 5) * (kQ8Slots * 32) + (j & 31), t, a2);
            acc = fmaf(fac[item_slot(j)], q8_apply_group(0.0f, t[0], a2[0], sc, bi, xhc[j], xhf[j]), acc);
          } else {
            float d[1];
            chunk_dot<B, 32, 1>(w1, xh + (j >> 5) * (FB * 32) + (j & 31), d);
            acc = fmaf(fac[item_slot(j)], apply_group<B>(d[0], sc, bi, xhc[j]), acc);
          }
        }
      }
      if constexpr (kLean) break;
    }
    acc = warp_sum(acc);
    if (lane == 0) {
      a.out[n] = acc;
      // resid + delta was written by block 0 before the second handoff; this warp owns row n.
      if (norm_mode && a.norm.add_out)
        a.norm.resid[n] = (n == v && resid_early ? resid_v : __ldcg(a.norm.resid + n)) + acc;
    }
    if constexpr (kLean) break;
  }
  st.at(kMoeStampEnd);
  st.extreme(kMoeStampLastEnd);
}

template <int RB, int B>
size_t fused_smem(int64_t H, int64_t nx) {
  constexpr int ER = ChunkTraits<RB>::kElems, FR = ChunkTraits<RB>::kF4;
  constexpr int EB = ChunkTraits<B>::kElems, FB = ChunkTraits<B>::kF4;
  auto cols = [](int64_t chunks) { return (chunks + 31) / 32 * 32; };
  return size_t(cols(H / ER)) * (FR * 16 + 4) + size_t(cols(H / EB)) * (FB * 16 + 4) +
         size_t(cols(nx / EB)) * (FB * 16 + 4);
}

// Blocks of this kernel that fit on the GPU at once (0: none), computed once per instantiation and size.
template <int RB, int B, bool TIMED, int NT, int SB, int LEAN, bool Q8, bool LATE, bool FOLD>
int resident_blocks(const Ctx& c, size_t smem) {
  thread_local size_t cached_smem = SIZE_MAX;
  thread_local int cached = 0;
  if (smem != cached_smem) {
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &per_sm, moe_fused_kernel<RB, B, TIMED, NT, SB, LEAN, Q8, LATE, FOLD>, NT, smem) != cudaSuccess)
      per_sm = 0;
    cached = per_sm;
    cached_smem = smem;
  }
  return std::min(cached, 512 / NT) * c.sms;
}

// The lean kernels run each task loop once per warp: W warps must cover the router and shared-expert rows of
// phase 1, the routed gate/up rows in pairs, the down rows, and one down pass (kDownU chunks per lane) must cover
// every slot's chunks. The real model on a 132-SM GPU: 769 <= 2,112, 4,096 <= 4,224, 2,048 <= 2,112, 144 <= 160.
bool lean_fits(const FusedArgs& a, int W) {
  const int64_t E = a.router.out, H = a.router.in, I = a.gate.out, Is = a.sgate.out, eb = 128 / a.gate.bits;
  return E + 1 + Is <= W && a.topk * I <= 2 * int64_t(W) && H <= W && a.topk * (I / eb) + Is / eb <= 32 * kDownU;
}

template <int RB, int B, bool TIMED, int NT, int SB, int LEAN, bool Q8 = false, bool LATE = false, bool FOLD = false>
bool launch_fused_form(const Ctx& c, const FusedArgs& a) {
  const int64_t nx = a.topk * a.gate.out + a.sgate.out;
  const size_t smem = fused_smem<RB, B>(a.router.in, nx);
  if (smem > kMaxSmem) return false;
  thread_local bool opted_in = false;  // dynamic shared memory above 48 KB must be allowed per kernel
  if (!opted_in) {
    check(cudaFuncSetAttribute(moe_fused_kernel<RB, B, TIMED, NT, SB, LEAN, Q8, LATE, FOLD>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, int(kMaxSmem)),
          "cudaFuncSetAttribute", __FILE__, __LINE__);
    opted_in = true;
  }
  const int blocks = resident_blocks<RB, B, TIMED, NT, SB, LEAN, Q8, LATE, FOLD>(c, smem);
  if (blocks <= 0) return false;
  if constexpr (LEAN >= 1) {
    if (!lean_fits(a, blocks * (NT / 32))) {
      if constexpr (FOLD) return false;  // only the lean form takes the fold (moe_fused_fold_ok checks first)
      return launch_fused_form<RB, B, TIMED, NT, SB, 0>(c, a);
    }
  }
  launch(c, "moe_fused_kernel", moe_fused_kernel<RB, B, TIMED, NT, SB, LEAN, Q8, LATE, FOLD>, blocks, NT, smem, a);
  FERN_CUDA_LAUNCH_CHECK("moe_fused_kernel");
  return true;
}

// 512 threads per block, one block per SM ("1" or unset), or 256 with two per SM ("0"); read at every call, for
// comparisons. Any other value is an error naming the switch, not a silent default.
bool moe_wide() { return env_choice("FERN_CUDA_MOE_WIDE", {"0", "1"}, 1) == 1; }

// The experts' gate/up rows against the normed row as 8-bit digits ("1", the default; moe_fused_kernel's Q8) or in
// fp32 ("0"); read at every call, for comparisons. Taken by the lean norm-mode form with packed rows only. Measured
// on the H200 (docs/notes/cuda-decode-v29-digits.md): 17.51 -> 17.32 us per launch, +0.65% / +0.3% decode at 4K /
// 128K.
bool moe_q8() { return env_choice("FERN_CUDA_MOE_Q8", {"0", "1"}, 1) == 1; }

// Where the routing weights are computed: "late" (the default: warp 0 writes the expert tables from its registers
// behind one barrier and computes the weights once its gate/up rows are requested; the lean digit form only) or
// "early" (the weights with the choice, then the tables from shared memory, two barriers); read at every call, for
// comparisons. Measured on the H200 (docs/notes/cuda-decode-v30-int-digits.md): 17.34 -> 17.14 us per launch,
// 676.5 -> 679.8 tok/s at 4K, 476.5 -> 478.5 at 128K.
bool moe_route_late() { return env_choice("FERN_CUDA_MOE_ROUTE", {"early", "late"}, 1) == 1; }

template <int RB, int B, bool TIMED, int NT>
bool launch_fused_nt(const Ctx& c, const FusedArgs& a) {
  // The packed forms compile lean where the grid allows it (LEAN 1 with the norm, 2 without; lean_fits), the
  // generic kernel otherwise; FERN_CUDA_MOE_LEAN=0 takes the generic one everywhere (for comparisons). Read at
  // every call.
  const bool lean = env_choice("FERN_CUDA_MOE_LEAN", {"0", "1"}, 1) == 1;
  const bool q8 = moe_q8();
  const bool late = moe_route_late();
  const bool nm = a.norm.resid != nullptr;
  if (a.norm.pre != nullptr) {  // the fold: one form only (fused_args checked the shapes; moe_fused_fold_ok the rest)
    if constexpr (RB == 8) {
      if (a.sb32 == 2 && lean && q8 && late) return launch_fused_form<RB, B, TIMED, NT, 2, 1, true, true, true>(c, a);
    }
    return false;
  }
  switch (a.sb32) {
    case 2:
      if (!lean) return launch_fused_form<RB, B, TIMED, NT, 2, 0>(c, a);
      if (nm && q8)
        return late ? launch_fused_form<RB, B, TIMED, NT, 2, 1, true, true>(c, a)
                    : launch_fused_form<RB, B, TIMED, NT, 2, 1, true>(c, a);
      return nm ? launch_fused_form<RB, B, TIMED, NT, 2, 1>(c, a) : launch_fused_form<RB, B, TIMED, NT, 2, 2>(c, a);
    case 1:
      if (!lean) return launch_fused_form<RB, B, TIMED, NT, 1, 0>(c, a);
      return nm ? launch_fused_form<RB, B, TIMED, NT, 1, 1>(c, a) : launch_fused_form<RB, B, TIMED, NT, 1, 2>(c, a);
    default: return launch_fused_form<RB, B, TIMED, NT, 0, 0>(c, a);
  }
}

template <int RB, int B, bool TIMED>
bool launch_fused(const Ctx& c, const FusedArgs& a) {
  return moe_wide() ? launch_fused_nt<RB, B, TIMED, 512>(c, a) : launch_fused_nt<RB, B, TIMED, kThreads>(c, a);
}

// FERN_CUDA_MOE_SB=all (the default: the packed scales and biases of the gate/up and down rows where the shapes
// allow), row (the gate/up rows only, load_rows_sb32) or chunk (two 2-byte loads per chunk everywhere); read at every
// call, for comparisons. Any other value is an error naming the switch. Returns 0, 1, 2 as FusedArgs::sb32.
int moe_sb32() { return env_choice("FERN_CUDA_MOE_SB", {"chunk", "row", "all"}, 2); }

// The arguments of one launch, or false where the formats or shapes are not taken (see moe_fused in kernels.h).
bool fused_args(const Ctx& c, const MoeQW& w, const float* x, const MoeScratch& s, float* out, int topk,
                const MoeNorm* norm, FusedArgs& a) {
  const int64_t H = w.router.in, E = w.router.out, I = w.gate.out, Is = w.sgate.out;
  const int RB = w.router.bits, B = w.gate.bits;
  if (c.n_counters < kMoeFusedCounters || topk < 1 || topk > 32 || topk > E || E > 32 * kTopkMaxPerLane) return false;
  if (w.sgr.out != 1 || w.sgr.bits != RB || w.sgr.in != H) return false;
  for (const QW* q : {&w.up, &w.down, &w.sgate, &w.sup, &w.sdown})
    if (q->bits != B) return false;
  if (w.up.out != I || w.up.in != H || w.gate.in != H || w.sgate.in != H || w.sup.in != H || w.sup.out != Is ||
      w.down.in != I || w.down.out != H || w.sdown.in != Is || w.sdown.out != H || w.gate.experts != E ||
      w.up.experts != E || w.down.experts != E)
    return false;
  // 4-bit experts only: with 8-bit ones the four rows per warp pass need twice the registers (ptxas: 552 bytes of
  // spills at 128 registers); the real model's experts are 4-bit.
  if (B != 4 || (RB != 8 && RB != 4)) return false;
  const int eb = 128 / B, er = 128 / RB;
  if (H % eb != 0 || H % er != 0 || I % eb != 0 || Is % eb != 0 || H > INT_MAX / 64 || I < eb) return false;
  if (norm != nullptr && (H % 4 != 0 || H > 4 * kNormV * kThreads || norm->resid == nullptr)) return false;
  a = FusedArgs{w.router, w.sgr, w.gate, w.up, w.down, w.sgate, w.sup, w.sdown, x, s, out, c.counters, topk,
                norm != nullptr ? *norm : MoeNorm{}, nullptr, 0, FastDiv(I), FastDiv(I / eb)};
  if (!a.div_i.ok() || !a.div_cd.ok()) return false;
  // The packed scales and biases (load_rows_sb32): rows of 2,048 4-bit weights in groups of 64 whose scale and bias
  // rows start on 4-byte boundaries (rows of 64 bytes, experts of whole rows: the base pointers decide).
  auto aligned = [](const QW& q) {
    return (reinterpret_cast<uintptr_t>(q.s) & 3) == 0 && (reinterpret_cast<uintptr_t>(q.b) & 3) == 0;
  };
  const int want = moe_sb32();
  const bool rows = H == 2048 && E <= 256 && w.gate.gs == 64 && w.up.gs == 64 && w.sgate.gs == 64 && w.sup.gs == 64 &&
                    aligned(w.gate) && aligned(w.up) && aligned(w.sgate) && aligned(w.sup);
  // The packed down rows: every slot's row 16 chunks (I = Is = 512 4-bit weights) in groups of 64 (scale rows of
  // 16 bytes), so that each half-warp holds one row (load_down).
  const bool down = I == 16 * eb && Is == 16 * eb && w.down.gs == 64 && w.sdown.gs == 64 && aligned(w.down) &&
                    aligned(w.sdown);
  a.sb32 = want >= 1 && rows ? (want == 2 && down ? 2 : 1) : 0;
  return true;
}

}  // namespace

bool moe_fused(const Ctx& c, const MoeQW& w, const float* x, const MoeScratch& s, float* out, int topk,
               const MoeNorm* norm) {
  FusedArgs a;
  if (!fused_args(c, w, x, s, out, topk, norm, a)) return false;
  return w.router.bits == 8 ? launch_fused<8, 4, false>(c, a) : launch_fused<4, 4, false>(c, a);
}

bool moe_fused_fold_ok(const Ctx& c, const MoeQW& w, int topk) {
  FusedArgs a;
  const MoeScratch none{};
  if (!fused_args(c, w, nullptr, none, nullptr, topk, nullptr, a)) return false;
  // The kernel's FOLD: 8 pre-logits per lane of warp 0 (E <= 256), k <= 32 slots (fused_args), rows of kFoldH
  // (the staging's float4s per thread, kNV, are counted for it; sb32 == 2 implies it too).
  if (w.router.bits != 8 || a.sb32 != 2 || a.router.out > 256 || a.topk > 32 || a.router.in != kFoldH ||
      env_choice("FERN_CUDA_MOE_LEAN", {"0", "1"}, 1) != 1 || !moe_q8() || !moe_route_late())
    return false;
  const int nt = moe_wide() ? 512 : kThreads;
  const size_t smem = fused_smem<8, 4>(a.router.in, a.topk * a.gate.out + a.sgate.out);
  const int blocks = nt == 512 ? resident_blocks<8, 4, false, 512, 2, 1, true, true, true>(c, smem)
                               : resident_blocks<8, 4, false, kThreads, 2, 1, true, true, true>(c, smem);
  return smem <= kMaxSmem && blocks > 0 && lean_fits(a, blocks * (nt / 32)) &&
         a.sgate.out <= int64_t(blocks) * (nt / 32 - 1);  // phase 1 on warps 1.. only
}

int moe_fused_packing(const Ctx& c, const MoeQW& w, int topk) {
  FusedArgs a;
  const MoeScratch none{};
  return fused_args(c, w, nullptr, none, nullptr, topk, nullptr, a) ? a.sb32 : -1;
}

bool moe_fused_timed(const Ctx& c, const MoeQW& w, const float* x, const MoeScratch& s, float* out, int topk,
                     const MoeNorm* norm, unsigned long long* stamps) {
#ifdef FERN_MOE_PHASE_TIMING
  FusedArgs a;
  if (!fused_args(c, w, x, s, out, topk, norm, a)) return false;
  a.stamps = stamps;
  return w.router.bits == 8 ? launch_fused<8, 4, true>(c, a) : launch_fused<4, 4, true>(c, a);
#else
  (void)c, (void)w, (void)x, (void)s, (void)out, (void)topk, (void)norm, (void)stamps;
  return false;
#endif
}

}  // namespace fern::cuda
