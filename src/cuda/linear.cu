// GEMV y = x W^T for affine 4/8-bit and bf16 weights, one launch for all T rows (decode: T = 1; a few rows re-read
// the weights once per row; in prefill, linear/linear_multi hand over to the tensor-core kernel in linear_gemm.cu
// where linear_gemm_wins). Also several matrices of one input and one format in
// one launch over their concatenated rows (linear_multi: the GDN input projections, attention q/k/v; each launch
// has a fixed ~2-3 us of staging and first-load latency), and the fused MoE router: the router's rows and the
// shared-expert gate's row in one launch, with softmax/top-k run by the last block to finish (moe_route).
// Work split: `LPR` lanes cooperate on one row, lane `sub` taking chunks sub, sub + LPR, ...; two chunks per row
// and kRPI = 2 rows at a time (a "step": 4 independent 16-byte loads per lane). Warps walk their row groups as a
// software pipeline of NB register buffers: the first NB steps' loads are issued before waiting on the previous
// kernel (PDL), and each buffer is refilled with the loads of step s + NB as soon as step s is consumed.
// (Version 4 issued only the first step before the wait; an 8192 x 2048 matrix is two steps per warp, so the
// second step's round trip came after the activations were staged: 6.4 us for 2.2 us of bytes.)
// Index arithmetic is kept out of the inner loop (docs/notes/cuda-decode-v1.md found 64-bit divisions and the
// swizzle there): the step's row group and chunk pass advance as counters, offsets are 32-bit, a chunk's group is
// a shift, and the activations are read through one per-lane shared-memory base plus constants (qdot.cuh).
// linear_tc_kernel below is the same GEMV with its inner loop on the tensor cores (gemv_tc.cuh); by default it
// takes only lm_head-sized matrices, where it measured faster (gemv_tc_wanted).
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "core/env.h"
#include "cuda/gemv_tc.cuh"
#include "cuda/kernels.h"
#include "cuda/launch.cuh"
#include "cuda/qdot.cuh"
#include "cuda/topk.cuh"

namespace fern::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kRPI = 2;
constexpr int kMaxMats = 4;

// The chunks one lane handles in one pipeline step: 2 chunks of each of kRPI rows, with their scales/biases.
struct StepBuf {
  uint4 w[2][kRPI];
  float s[2][kRPI], b[2][kRPI];
  uint32_t sbw[kRPI];  // SB kernels: the step's scales and biases, one word per lane and row (s and b unused)
};

// The next MoE's router over this projection's rows (FOLD kernels; kernels.h RouteFold, route_fold_pack's layout):
// R = E + 1 rows (the router's, then the shared-expert gate's).
struct FoldArgs {
  const uint4* pc = nullptr;      // [H / 16][R] 16 code bytes (column n of a row is byte n % 16 of chunk n / 16)
  const uint32_t* psb = nullptr;  // [H / 64][R] bf16 scale | bf16 bias << 16
  int R = 0;
  const float* nw = nullptr;    // [H] the MoE's norm weight
  float* resid = nullptr;       // [H]
  unsigned long long* pre = nullptr;  // [R * stride] fixed point, two's complement
  int stride = 0;
};

// Top-k tail of the fused router (ROUTE kernels only), or the fold's arguments (FOLD kernels only).
struct RouteTail {
  int topk = 0;
  int32_t* ids = nullptr;
  float* wts = nullptr;
  float* sgate = nullptr;
  int* counters = nullptr;  // one per token row, zero between launches (the last block resets its own)
  FoldArgs fold;
};

// Optional RMSNorm of the input row, computed by every block while staging it (linear_multi_norm: a layer's input
// norm folded into its mixer projections, one launch less per layer). w == nullptr: x is used as it is.
// The same struct carries the gated norm of the GDN core's output (linear_gated_norm): w is then the per-head norm
// weight, z the gate row, head the head width.
struct InNorm {
  const float* w = nullptr;
  float eps = 0.0f;
  float* xn = nullptr;  // the normed rows, written by the blocks of grid column 0 (may be null)
  const float* z = nullptr;
  int head = 0;
  int z_early = 0;  // z may be read before the PDL wait (linear_gated_norm's early_z)
};

// How a block stages its input row: as it is (stage_x), RMSNorm-ed (stage_x_norm), or gated-RMSNorm-ed per head
// (stage_x_gated_norm).
// kStageGatedNorm128: the gated norm at the real model's shape fixed at compile time (rows of 4,096 = 32 heads of
// 128, z read before the PDL wait; linear_gated_norm takes it unless FERN_CUDA_GEMV_GN_LEAN=0): the same arithmetic
// without the bound checks and the branches that shape never takes (kernel code 51,200 -> 42,240 bytes).
enum Stage : int { kStagePlain = 0, kStageNorm = 1, kStageGatedNorm = 2, kStageGatedNorm128 = 3 };
constexpr int kGn128Width = 4096, kGn128Head = 128;

// Float4s of the row each thread keeps in registers for the norm (rows up to 4 * kThreads * kNormV = 4096 wide).
constexpr int kNormV = 4;

// stage_x (qdot.cuh) of rmsnorm(x) * w, with the norm weight already in registers (wn: requested before the PDL
// wait) and the row read once into registers. Block 0 of the row's grid column also writes the row to xn.
// (The first version re-read the row and read the weight after the reduction: two more dependent round trips,
// measured ~1.9 us per GDN projection launch against 1.33 us for the separate norm launch it replaced.)
// A sink that wants the row's largest magnitude (qdot.cuh Q8Sink, the digit form) gets it from the same block
// reduction (block_sum_max: max |x w| times the norm's factor) through set_row_max, before the first float4.
template <int NT, int NV, typename Sink>
__device__ __forceinline__ void stage_x_norm(const float* x, const float4 (&wn)[NV], float eps, int n, Sink&& sink,
                                             float* xn) {
  constexpr bool kRowMax = sink_wants_row_max<std::remove_cvref_t<Sink>>();
  const float4* x4 = reinterpret_cast<const float4*>(x);
  float4 xv[NV];
  float ss = 0.0f, mx = 0.0f;
#pragma unroll
  for (int q = 0; q < NV; ++q) {
    const int f = threadIdx.x + q * NT;
    xv[q] = f < n / 4 ? __ldcg(x4 + f) : make_float4(0.f, 0.f, 0.f, 0.f);  // through L2: stage_x
    ss += (xv[q].x * xv[q].x + xv[q].y * xv[q].y) + (xv[q].z * xv[q].z + xv[q].w * xv[q].w);
    if constexpr (kRowMax) mx = max_abs_prod(mx, xv[q], wn[q]);
  }
  float inv;
  if constexpr (kRowMax) {
    __shared__ float2 red2[32];
    inv = norm_inv_row_max(ss, mx, n, eps, red2, sink);
  } else {
    __shared__ float red[32];
    inv = rsqrtf(block_sum(ss, red) / float(n) + eps);
  }
  // The sink's sums come from shuffles (qdot.cuh, ChunkSink): thread f holds float4 f, so a chunk's float4s sit in
  // consecutive lanes; no second pass over shared memory behind another barrier.
#pragma unroll
  for (int q = 0; q < NV; ++q) {
    if (q * NT >= n / 4) break;  // the same on every thread: all lanes take part in the shuffles
    const int f = threadIdx.x + q * NT;
    const float4 o = make_float4(xv[q].x * inv * wn[q].x, xv[q].y * inv * wn[q].y, xv[q].z * inv * wn[q].z,
                                 xv[q].w * inv * wn[q].w);  // zero beyond the row (xv and wn are)
    if (f < n / 4 && xn != nullptr) reinterpret_cast<float4*>(xn)[f] = o;
    sink(f, f < n / 4, o);
  }
  __syncthreads();
}

// The gate of the GDN core's gated norm for one float4: silu(z) * w.
__device__ __forceinline__ float4 norm_gate(const float4& z, const float4& w) {
  return make_float4(silu(z.x) * w.x, silu(z.y) * w.y, silu(z.z) * w.z, silu(z.w) * w.w);
}

// stage_x (qdot.cuh) of the GDN core's gated RMSNorm (MODEL.md 2.4 step 9) of its raw output y [n]: per head of
// hd values, y * rsqrt(mean(y^2) + eps) * w * silu(z). Thread f holds float4 f of the row (f = threadIdx.x + q * NT);
// a head is hd/4 consecutive float4s, so hd/4 consecutive lanes of one warp (hd <= 128, a power of two; at the
// real hd = 128 the 32 lanes of a warp hold exactly one head for each q): its sum of squares is a shuffle
// reduction within those lanes, no block barrier. gv holds the gate silu(z) * w of each float4: computed before
// the PDL wait by the caller when z may be read there (gate_ready), else here from z read through L2 (the norm
// weight's float4 w is the same for every q of a thread). y is read through L2 after the wait (stage_x says why
// never through the non-coherent path).
// FIXED: n = kGn128Width and hd = kGn128Head, whatever the arguments say.
template <int NT, bool FIXED, typename Sink>
__device__ __forceinline__ void stage_x_gated_norm(const float* y, const float* z, float4 (&gv)[kNormV],
                                                   bool gate_ready, float4 w, float eps, int n, int hd,
                                                   const Sink& sink) {
  if constexpr (FIXED) {
    n = kGn128Width;
    hd = kGn128Head;
  }
  const float4* y4 = reinterpret_cast<const float4*>(y);
  const float4* z4 = reinterpret_cast<const float4*>(z);
  const int hl = hd / 4;  // lanes per head
  const float rhd = 1.0f / float(hd);  // exact (hd a power of two): a multiply instead of a division per float4
  float4 yv[kNormV], zv[kNormV];
#pragma unroll
  for (int q = 0; q < kNormV; ++q) {
    const int f = threadIdx.x + q * NT;
    yv[q] = f < n / 4 ? __ldcg(y4 + f) : make_float4(0.f, 0.f, 0.f, 0.f);
    if (!gate_ready) zv[q] = f < n / 4 ? __ldcg(z4 + f) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
#pragma unroll
  for (int q = 0; q < kNormV; ++q) {
    if (q * NT >= n / 4) break;  // the same on every thread: all lanes take part in the shuffles
    const int f = threadIdx.x + q * NT;
    if (!gate_ready) gv[q] = norm_gate(zv[q], w);
    float ss = (yv[q].x * yv[q].x + yv[q].y * yv[q].y) + (yv[q].z * yv[q].z + yv[q].w * yv[q].w);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
      if (o < hl) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = rsqrtf(ss * rhd + eps);
    const float4 o = make_float4(yv[q].x * inv * gv[q].x, yv[q].y * inv * gv[q].y, yv[q].z * inv * gv[q].z,
                                 yv[q].w * inv * gv[q].w);  // zero beyond the row (yv is)
    sink(f, f < n / 4, o);
  }
  __syncthreads();
}

// The staging of a kernel's input row, split around the PDL wait: before_wait() requests what does not depend on
// the previous kernel (kStageNorm: the norm weight; kStageGatedNorm: the norm weight's float4 of this thread and,
// with early_z, the gates silu(z) * w, so that only the norm itself is left after the wait: the first version read
// z there but left the gates, 16 silu per thread, after it), run() stages token row t through `sink` after it.
// LATE: the norm weight and the gates are read after the wait, with the row (no round trip more: the loads go out
// together), so that they hold no registers across the weights' first loads (the capped-register kernels, MINB > 1).
// NV: float4s of the norm's row per thread (LATE kernels: 2, rows up to 2,048 at 256 threads; launch_bits checks).
template <int STAGE, int NT, bool LATE = false>
struct InputStage {
  static constexpr int NV = LATE ? 2 : kNormV;
  float4 wn[NV];
  float4 gnw = make_float4(0.f, 0.f, 0.f, 0.f), gv[kNormV];

  __device__ __forceinline__ void load_norm_w(const InNorm& nm, int K) {
#pragma unroll
    for (int q = 0; q < NV; ++q) {
      const int f = threadIdx.x + q * NT;
      wn[q] = f < K / 4 ? __ldg(reinterpret_cast<const float4*>(nm.w) + f) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }

  __device__ __forceinline__ void before_wait(const InNorm& nm, int K, int t) {
    if constexpr (STAGE == kStageNorm && !LATE) load_norm_w(nm, K);
    if constexpr (STAGE == kStageGatedNorm || STAGE == kStageGatedNorm128) {
      constexpr bool kFixed = STAGE == kStageGatedNorm128;
      gnw = __ldg(reinterpret_cast<const float4*>(nm.w) + threadIdx.x % ((kFixed ? kGn128Head : nm.head) / 4));
      if ((kFixed || nm.z_early) && !LATE) {
#pragma unroll
        for (int q = 0; q < kNormV; ++q) {
          const int f = threadIdx.x + q * NT;
          gv[q] = norm_gate(f < K / 4 ? __ldcg(reinterpret_cast<const float4*>(nm.z + int64_t(t) * K) + f)
                                      : make_float4(0.f, 0.f, 0.f, 0.f),
                            gnw);
        }
      }
    }
  }

  // Sink: the lvalue Q8Sink comes back with its row factor set (stage_x_norm).
  template <typename Sink>
  __device__ __forceinline__ void run(const float* x, const InNorm& nm, int K, int t, Sink&& sink) {
    if constexpr (STAGE == kStageNorm) {
      if constexpr (LATE) load_norm_w(nm, K);
      stage_x_norm<NT, NV>(x + int64_t(t) * K, wn, nm.eps, K, sink,
                           blockIdx.x == 0 && nm.xn != nullptr ? nm.xn + int64_t(t) * K : nullptr);
    } else if constexpr (STAGE == kStageGatedNorm || STAGE == kStageGatedNorm128) {
      constexpr bool kFixed = STAGE == kStageGatedNorm128;  // z read early (gated_norm_fixed)
      stage_x_gated_norm<NT, kFixed>(x + int64_t(t) * K, nm.z + int64_t(t) * K, gv,
                                     (kFixed || nm.z_early != 0) && !LATE, gnw, nm.eps, K, nm.head, sink);
    } else {
      stage_rows(x + int64_t(t) * K, K, sink);
    }
  }
};

// Up to kMaxMats matrices of one width and format, concatenated by rows: matrix q holds rows [start[q],
// start[q + 1]) and writes y[q] [T, start[q + 1] - start[q]]. Unused entries have start = INT_MAX.
struct Mats {
  const void* w[kMaxMats];
  const uint16_t* s[kMaxMats];
  const uint16_t* b[kMaxMats];
  float* y[kMaxMats];
  int start[kMaxMats + 1];
};

// The matrix q whose range [start[q], start[q + 1]) holds v (MULTI kernels; the others have one matrix): of a
// concatenated row (Mats::start) or of a tile (TcTiles::start).
template <bool MULTI>
__device__ __forceinline__ int mat_of(const int (&start)[kMaxMats + 1], int v) {
  int q = 0;
  if constexpr (MULTI) {
#pragma unroll
    for (int i = 1; i < kMaxMats; ++i) q += v >= start[i];
  }
  return q;
}

// One router row's share of the fold (FOLD kernels): its codes at the block's RB columns (RB / 16 16-byte loads),
// the scale and bias of their group. load() before the PDL wait; add() once the block's router inputs x (RB values,
// norm_w * (resid + y)) are in shared memory: pre[e] += s * sum_j q_j x_j + b * sum_j x_j, the group term as every
// affine dot in fern has it, converted to units of 2^-kFoldShift and added as a 64-bit integer (the same bits
// whatever order the blocks' additions arrive in). Row e = E is the shared-expert gate's; rows beyond it do nothing.
template <int RB>
struct FoldRows {
  static_assert(RB % 16 == 0 && 64 % RB == 0, "a block's rows: whole 16-byte loads within one group of 64");
  uint4 q[RB / 16];
  float s, b;
  __device__ __forceinline__ void load(const FoldArgs& f, int e, int row0) {
    if (e >= f.R) return;
#pragma unroll
    for (int j = 0; j < RB / 16; ++j) q[j] = __ldg(f.pc + int64_t(row0 / 16 + j) * f.R + e);
    const uint32_t sb = __ldg(f.psb + int64_t(row0 / 64) * f.R + e);
    s = __uint_as_float(sb << 16);
    b = __uint_as_float(sb & 0xffff0000u);
  }
  __device__ __forceinline__ void add(const FoldArgs& f, int e, const float* x, float xsum) const {
    if (e >= f.R) return;
    float d = 0.0f;
#pragma unroll
    for (int j = 0; j < RB / 16; ++j) {
      const uint32_t u[4] = {q[j].x, q[j].y, q[j].z, q[j].w};
#pragma unroll
      for (int m = 0; m < 16; ++m) d = fmaf(float((u[m / 4] >> (8 * (m % 4))) & 0xffu), x[16 * j + m], d);
    }
    const float p = fmaf(s, d, b * xsum);
    atomicAdd(f.pre + int64_t(e) * f.stride, static_cast<unsigned long long>(__float2ll_rn(p * kFoldUnit)));
  }
};

// A's shape and format describe every matrix; the rows come from M. With ROUTE (two matrices: the router, then the
// shared-expert gate's single row) the last block of each token row runs the router's top-k over y[0] with y[1]
// as the shared-expert gate logit.
// MINB > 1: registers capped so that MINB blocks fit on an SM (FERN_CUDA_GEMV_OCC, gemv_occupancy).
// SB: 4-bit rows in groups of 64 whose width is a multiple of 2,048 (a step: 64 chunks of one row per warp, 32
// groups), 32 lanes per row: a step's 32 scales and 32 biases of a row in one 4-byte load per lane (qdot.cuh
// load_sb_word), shuffled to the lanes when the step is consumed (sb_from_word), instead of two 2-byte loads per
// chunk; the same values and arithmetic (gemv_sb, docs/notes/cuda-decode-v20-burst.md).
// CONTIG (MULTI kernels): the matrices' codes, scales and biases follow each other in memory (mats_contiguous), so
// the loads read the table as matrix 0 over all rows and only the output row picks its matrix.
// Q8 (SB kernels with the input norm; FERN_CUDA_GEMV_Q8=1, gemv_q8): the normed row as three 8-bit digits per value
// and the rows' codes against them with integer dot products (qdot.cuh chunk_dot_q8: 9 instructions per 8 weights
// instead of 19).
// FOLD (linear_fold, linear_gated_norm with a RouteFold; one matrix, SB, one token row): every warp has exactly
// one row group and takes every step of it before its first refill (the host checks S = nc <= NB), so block b owns
// rows [b RB, b RB + RB), RB = kFoldRows<NT>, all in one group of 64 of the router's columns. The epilogue adds each
// row's y to resid, and each thread e adds router row e's dot with the block's rows (norm_w * (resid + y)) to
// pre[e] in fixed point (FoldRows). The refill stays compiled although it never runs: without it ptxas took 255
// registers and spilled (184 with it, 168 without the fold).
template <int NT>
constexpr int kFoldRows = NT / 32 * kRPI;

template <int BITS, int LPR, bool MULTI, bool ROUTE, int STAGE, int NB, int NT, int MINB = 1, bool SB = false,
          bool CONTIG = false, bool Q8 = false, bool FOLD = false>
__global__ void __launch_bounds__(NT, MINB) linear_kernel(QW A, Mats M, int rows, const float* x,
                                                          RouteTail tail, InNorm nm) {
  static_assert(MULTI || !ROUTE, "the fused router has two matrices");
  static_assert(!FOLD || (!MULTI && SB && LPR == 32), "the fold: one packed matrix, 32 lanes per row");
  static_assert(!Q8 || (SB && STAGE == kStageNorm), "the digit form: packed rows with the input norm");
  static_assert(!SB || (BITS == 4 && LPR == 32), "packed scales: 4-bit rows, 32 lanes per row");
  static_assert(!CONTIG || MULTI, "one matrix is contiguous already");
  extern __shared__ float4 smem[];
  constexpr int F4 = ChunkTraits<BITS>::kF4;
  constexpr int RS = 32 / LPR;       // rows side by side in one warp
  constexpr int RPW = RS * kRPI;     // rows per row group (one warp, one pass)
  const int t = blockIdx.y;
  const int K = static_cast<int>(A.in);
  const ChunkMat ma = chunk_mat<BITS>(A, 0);
  const int CPR = ma.cpr;
  const int nc = (CPR + 2 * LPR - 1) / (2 * LPR);  // pipeline steps per row group
  const int lane = threadIdx.x & 31;
  const int sub = lane % LPR, rslot = lane / LPR;
  const int warps = gridDim.x * (NT / 32);
  const int gw = blockIdx.x * (NT / 32) + threadIdx.x / 32;
  const int ngroups = (rows + RPW - 1) / RPW;
  const int S = (gw < ngroups ? (ngroups - 1 - gw) / warps + 1 : 0) * nc;

  int lg = gw, lci = 0;  // row group and chunk pass of the next step to load
  auto load_step = [&](StepBuf& Bf) {
#pragma unroll
    for (int r = 0; r < kRPI; ++r) {
      const int row = lg * RPW + r * RS + rslot;
      const bool ok = row < rows;
      ChunkMat m = ma;
      int rr = row;
      if constexpr (MULTI && !CONTIG) {
        // Same shape for every matrix: only the pointers and the row offset differ (selects, no memory trips).
#pragma unroll
        for (int i = 1; i < kMaxMats; ++i) {
          if (row >= M.start[i]) {
            m.w = static_cast<const uint4*>(M.w[i]);
            m.s = M.s[i];
            m.b = M.b[i];
            rr = row - M.start[i];
          }
        }
      }
      if constexpr (SB) {  // every chunk of the step exists (the width is a multiple of 64 chunks)
#pragma unroll
        for (int u = 0; u < 2; ++u)
          Bf.w[u][r] = ok ? ld_stream(m.w + (rr * CPR + sub + (lci * 2 + u) * LPR)) : make_uint4(0, 0, 0, 0);
        Bf.sbw[r] = ok ? load_sb_word(m, rr, 32 * lci, lane) : 0u;
      } else {
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const int c = sub + (lci * 2 + u) * LPR;
          if (ok && c < CPR) {
            load_chunk<BITS>(m, rr, c, Bf.w[u][r], Bf.s[u][r], Bf.b[u][r]);
          } else {
            Bf.w[u][r] = make_uint4(0, 0, 0, 0);
            Bf.s[u][r] = Bf.b[u][r] = 0.0f;
          }
        }
      }
    }
    if (++lci == nc) {
      lci = 0;
      lg += warps;
    }
  };

  // Weights do not depend on the previous kernel: the first NB steps' loads are issued before waiting for it (the
  // 8192 x 2048 projections take two steps per warp, so all their weights are requested here).
  StepBuf buf[NB];
#pragma unroll
  for (int i = 0; i < NB; ++i)
    if (i < S) load_step(buf[i]);
  InputStage<STAGE, NT, (MINB > 1)> in;
  in.before_wait(nm, K, t);
  // FOLD: the router's codes, scales and biases for this block's rows and the norm weight there are weights too.
  constexpr int kFR = kFoldRows<NT>;
  __shared__ float fold_nw[FOLD ? kFR : 1], fold_x[FOLD ? kFR : 1];
  FoldRows<kFR> fr[2];
  float fold_r[kRPI];  // resid at this warp's rows (lane 0)
  if constexpr (FOLD) {
    const FoldArgs& f = tail.fold;
    const int row0 = blockIdx.x * kFR;
#pragma unroll
    for (int i = 0; i < 2; ++i) fr[i].load(f, threadIdx.x + i * NT, row0);
    if (threadIdx.x < kFR) fold_nw[threadIdx.x] = __ldg(f.nw + row0 + threadIdx.x);
  }
  pdl_wait();
  if constexpr (FOLD) {
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < kRPI; ++r) fold_r[r] = __ldcg(tail.fold.resid + gw * RPW + r);  // with the staging's loads
    }
  }
  float4* xs = smem;
  float* xc = reinterpret_cast<float*>(smem + x_slots<BITS, LPR>(K));
  float xsc = 0.0f;  // Q8: the digits' row factor
  if constexpr (Q8) {
    Q8Sink q8{reinterpret_cast<uint4*>(smem), xc};  // the digits in xs's place (q8_slots(K) <= x_slots<4, 32>(K))
    in.run(x, nm, K, t, q8);
    xsc = q8.factor();
  } else {
    in.run(x, nm, K, t, ChunkSink<BITS, LPR>{xs, xc});
  }
  pdl_trigger();
  const float4* xl = xs + sub;
  const uint4* xql = reinterpret_cast<const uint4*>(smem) + sub;
  const float* xcl = xc + sub;

  float acc[kRPI] = {};
  int cg = gw, cci = 0;  // row group and chunk pass of the step being consumed
  // One pipeline step: consume this step's registers, then refill them with the loads of step s + NB (steps
  // s + 1 .. s + NB - 1 are in flight meanwhile).
  auto step = [&](int s, StepBuf& cur) {
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int j = cci * 2 + u;
      if constexpr (Q8) {  // as SB below, the dots on the digits
        q8_rows_chunk<kRPI>(cur.w[u], cur.sbw, xql + j * (kQ8Slots * 32), xcl + j * LPR, xsc, lane, u, acc);
      } else if constexpr (SB) {  // chunk lane + 32 j is chunk lane + 32 u of the step's 64 (sb_from_word)
        float d[kRPI];
        chunk_dot<BITS, LPR, kRPI>(cur.w[u], xl + j * (F4 * LPR), d);
        const float xsum = xcl[j * LPR];
#pragma unroll
        for (int r = 0; r < kRPI; ++r) {
          float sc, bi;
          sb_from_word(cur.sbw[r], lane, u, sc, bi);
          acc[r] += apply_group<BITS>(d[r], sc, bi, xsum);
        }
      } else if (sub + j * LPR < CPR) {
        float d[kRPI];
        chunk_dot<BITS, LPR, kRPI>(cur.w[u], xl + j * (F4 * LPR), d);
        const float xsum = BITS == 16 ? 0.0f : xcl[j * LPR];
#pragma unroll
        for (int r = 0; r < kRPI; ++r) acc[r] += apply_group<BITS>(d[r], cur.s[u][r], cur.b[u][r], xsum);
      }
    }
    if (++cci == nc) {
      cci = 0;
#pragma unroll
      for (int r = 0; r < kRPI; ++r) {
        float v = acc[r];
#pragma unroll
        for (int o = LPR / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        const int row = cg * RPW + r * RS + rslot;
        if (sub == 0 && row < rows) {
          const int q = mat_of<MULTI>(M.start, row);
          const int r0 = MULTI ? M.start[q] : 0;
          const int nq = MULTI ? M.start[q + 1] - r0 : rows;
          M.y[q][int64_t(t) * nq + (row - r0)] = v;
          if constexpr (FOLD) {  // the residual add of MODEL.md 2.0 (r = h + a) for this row, then its router input
            const float rv = fold_r[r] + v;
            tail.fold.resid[row] = rv;
            fold_x[row - blockIdx.x * kFR] = rv * fold_nw[row - blockIdx.x * kFR];
          }
        }
        acc[r] = 0.0f;
      }
      cg += warps;
    }
    if (s + NB < S) load_step(cur);
  };
  for (int s = 0; s < S; s += NB) {
#pragma unroll
    for (int i = 0; i < NB; ++i)
      if (s + i < S) step(s + i, buf[i]);
  }

  if constexpr (FOLD) {
    __syncthreads();  // fold_x complete
    float xsum = 0.0f;
#pragma unroll
    for (int j = 0; j < kFR; ++j) xsum += fold_x[j];
#pragma unroll
    for (int i = 0; i < 2; ++i) fr[i].add(tail.fold, threadIdx.x + i * NT, fold_x, xsum);
  }
  if constexpr (ROUTE) {
    // Last block of this token row: every block's logits are visible once it sees the count complete.
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(tail.counters + t, 1) == int(gridDim.x) - 1;
    __syncthreads();
    if (last) {
      __threadfence();
      const int rowsA = M.start[1];
      if (threadIdx.x < 32)
        topk_warp(M.y[0] + int64_t(t) * rowsA, M.y[1] + int64_t(t) * (rows - rowsA), rowsA, tail.topk,
                  tail.ids + int64_t(t) * tail.topk, tail.wts + int64_t(t) * tail.topk, tail.sgate + t);
      if (threadIdx.x == 0) tail.counters[t] = 0;
    }
  }
}

// ---- The tensor-core GEMV (4-bit, groups a multiple of 64; gemv_tc.cuh for the inner loop) ----
// Work split: 16-row tiles (each matrix's rows rounded up to whole tiles, tile starts in TcTiles) times 256-wide
// blocks of K ("items"). Block b takes tiles [b * tpb, b * tpb + tpb). With at least one tile per warp (tpb >= the
// warps) a warp owns whole tiles (tiles w, w + W, ... of the block, every K block in order, the row sums kept in
// registers); with fewer, the block's tile x K-block items are dealt out to its warps round-robin (an 8192 x 2048
// matrix on 132 SMs: two tiles per block, two items per warp), each item's partial row sums go to shared memory,
// and after a barrier the block adds them per row in K order (deterministic). As in linear_kernel, the first NB
// items' weights are requested before the PDL wait and each buffer is refilled once consumed.
struct TcTiles {
  int start[kMaxMats + 1];  // first tile of each matrix; unused entries INT_MAX
  int tiles, tpb;
};

template <bool MULTI, int STAGE, int NB, int NT>
__global__ void __launch_bounds__(NT) linear_tc_kernel(QW A, Mats M, int rows, TcTiles tt, const float* x,
                                                       InNorm nm) {
  extern __shared__ float4 smem[];
  constexpr int W = NT / 32;
  const int t = blockIdx.y;
  const int K = static_cast<int>(A.in);
  const int KB = tc_blocks(K);
  const ChunkMat ma = chunk_mat<4>(A, 0);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, j = lane & 3;
  const int tile0 = blockIdx.x * tt.tpb;
  const int ntl = min(tt.tpb, tt.tiles - tile0);
  const bool whole = tt.tpb >= W;  // the same in every block
  // This warp's items as (tile of the block, K block), advanced by dkb with carries into the tile by dtl.
  int S, ltl, lkb;
  const int dkb = whole ? 1 : W, dtl = whole ? W : 1;
  if (whole) {
    S = warp < ntl ? ((ntl - 1 - warp) / W + 1) * KB : 0;
    ltl = warp;
    lkb = 0;
  } else {
    const int ni = ntl * KB;
    S = warp < ni ? (ni - 1 - warp) / W + 1 : 0;
    ltl = warp / KB;
    lkb = warp - ltl * KB;
  }
  int ctl = ltl, ckb = lkb;  // the item being consumed
  auto advance = [&](int& tl, int& kb) {
    kb += dkb;
    while (kb >= KB) {
      kb -= KB;
      tl += dtl;
    }
  };
  // Rows of tile `tile` (its matrix's row count, the tile's first row inside it) and the matrix's view.
  auto tile_rows = [&](int tile, int& nq, int& r0, int& q) {
    q = mat_of<MULTI>(tt.start, tile);
    nq = MULTI ? M.start[q + 1] - M.start[q] : rows;
    r0 = (tile - (MULTI ? tt.start[q] : 0)) * 16;
  };
  auto load_item = [&](TcItem& it) {
    int nq, r0, q;
    tile_rows(tile0 + ltl, nq, r0, q);
    ChunkMat m = ma;
    if constexpr (MULTI) {
#pragma unroll
      for (int i = 1; i < kMaxMats; ++i) {
        if (q == i) {
          m.w = static_cast<const uint4*>(M.w[i]);
          m.s = M.s[i];
          m.b = M.b[i];
        }
      }
    }
    const int c0 = lkb * 8 + 2 * j;  // chunks c0, c0 + 1: group j of K block lkb (cpr is even: K % 64 == 0)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = r0 + g + 8 * r;
      if (row < nq && c0 < m.cpr) {
        const uint4* p = m.w + (row * m.cpr + c0);
        it.w[2 * r] = ld_stream(p);
        it.w[2 * r + 1] = ld_stream(p + 1);
        load_group<4>(m, row, c0, it.s[r], it.b[r]);
      } else {
        it.w[2 * r] = it.w[2 * r + 1] = make_uint4(0, 0, 0, 0);
        it.s[r] = it.b[r] = 0.0f;
      }
    }
    advance(ltl, lkb);
  };

  TcItem buf[NB];
#pragma unroll
  for (int i = 0; i < NB; ++i)
    if (i < S) load_item(buf[i]);
  InputStage<STAGE, NT> in;
  in.before_wait(nm, K, t);
  pdl_wait();
  uint4* xb = reinterpret_cast<uint4*>(smem);
  float* xg = reinterpret_cast<float*>(xb + tc_table_uint4s(K));
  float* red = xg + KB * 4;  // split mode: [ntl][KB][16] partial row sums
  tc_zero_tail(xb, xg, K);
  in.run(x, nm, K, t, TcSink{xb, xg});
  pdl_trigger();

  const int bq = (g >> 1) == j ? g : -1;
  float acc[2] = {0.0f, 0.0f};
  auto step = [&](int s, TcItem& cur) {
    tc_item(cur, xb, xg, ckb, j, bq, acc);
    if (!whole || ckb == KB - 1) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], 1);
        acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], 2);
      }
      if (j < 2) {  // lane j = 0 writes row g, lane j = 1 row g + 8
        const float v = j == 0 ? acc[0] : acc[1];
        if (whole) {
          int nq, r0, q;
          tile_rows(tile0 + ctl, nq, r0, q);
          const int row = r0 + g + 8 * j;
          if (row < nq) M.y[q][int64_t(t) * nq + row] = v;
        } else {
          red[(ctl * KB + ckb) * 16 + g + 8 * j] = v;
        }
      }
      acc[0] = acc[1] = 0.0f;
    }
    advance(ctl, ckb);
    if (s + NB < S) load_item(cur);
  };
  for (int s = 0; s < S; s += NB) {
#pragma unroll
    for (int i = 0; i < NB; ++i)
      if (s + i < S) step(s + i, buf[i]);
  }
  if (!whole) {
    __syncthreads();
    for (int e = threadIdx.x; e < ntl * 16; e += NT) {
      const int tl = e >> 4, r = e & 15;
      float v = 0.0f;
      for (int kb = 0; kb < KB; ++kb) v += red[(tl * KB + kb) * 16 + r];
      int nq, r0, q;
      tile_rows(tile0 + tl, nq, r0, q);
      if (r0 + r < nq) M.y[q][int64_t(t) * nq + r0 + r] = v;
    }
  }
}

// Pipeline steps in flight per warp (NB) for a plain GEMV: 2. FERN_CUDA_GEMV_NB=3 selects a third buffer for the
// plain GEMVs with 32 lanes per row (read at every call, for comparisons). Measured on the H200, cold L2, lm_head:
// 104.8 us with 3 against 96.9 with 2 (docs/notes/cuda-decode-v5.md), then 96.0 / 96.7 and 95.1 / 96.4
// (cuda-decode-v6.md, runs 1-2): within ~1%, so 2 stays the default.
int gemv_depth() { return env_choice("FERN_CUDA_GEMV_NB", {"2", "3"}, 0) == 1 ? 3 : 2; }

// 512-thread blocks (one per SM) for a GEMV with 32 lanes per row (not the fused router): by default only where
// every block walks at least kWideGroups row groups of 32 rows (>= 67,584 rows on 132 SMs: lm_head). Measured on
// the H200 (docs/notes/cuda-decode-v7.md): alone with a cold L2 they are faster from 8192 rows (8192 x 2048
// 6.55 -> 5.21 us, lm_head 97.2 -> 93.8); lm_head + argmax in the step's chain gained in both runs (109.5 -> 106.8,
// 108.1 -> 105.7), but for the 30 GDN mixers the two runs disagree by more than the effect (run 1: 636.9 us with
// them on the input projections against 623.2 without; run 2: 602.2 with them everywhere against 608.0 without;
// in both the row timed second was the faster), so the projections keep 256 threads until a step-level
// comparison decides. That comparison (docs/notes/cuda-decode-v9-prefetch.md, fern bench --decode-switch, five
// interleaved runs): 4K 574.0 tok/s with this rule, 563.6 with wide blocks from 8,192 rows, 564.8 from 12,000 (the
// GDN input projections only), 561.4 everywhere; 128K 415.3 against 410.8 / 410.9 / 409.5: the rule stays.
// FERN_CUDA_GEMV_WIDE=1 takes them for every GEMV with 32 lanes per row, =0 for none, =N > 1 from N rows (read at
// every call, for comparisons).
constexpr int kWideGroups = 16;
// A GEMV choice taken by row count, overridable through the environment variable `var` (read at every call, for
// comparisons): "0" / "1" never / always, N > 1 from N rows, unset `by_default`.
bool rows_switch(const char* var, int rows, bool by_default) {
  const long n = env_int(var, 0, INT_MAX, -1);
  return n < 0 ? by_default : n <= 1 ? n == 1 : rows >= n;
}

bool gemv_wide(const Ctx& c, int rows) {
  return rows_switch("FERN_CUDA_GEMV_WIDE", rows,
                     int64_t(rows) >= int64_t(kWideGroups) * (2 * kThreads / 32) * kRPI * c.sms);
}

// Block size of the out_proj GEMV with the gated norm (linear_gated_norm): the GEMV rule above unless
// FERN_CUDA_GNORM_WIDE=1 / 0 forces 512 / 256 threads (read at every call, for comparisons: with 512 threads each
// block stages the row with half the work per thread, in half as many blocks).
bool gated_norm_wide(const Ctx& c, int rows) {
  const int forced = env_choice("FERN_CUDA_GNORM_WIDE", {"0", "1"}, -1);
  return forced >= 0 ? forced == 1 : gemv_wide(c, rows);
}

// Blocks per SM of the 256-thread 4-bit GEMVs with 32 lanes per row that have more than two blocks' work per SM
// (the input projections with their norm, 9,216-12,352 rows): 3 (the default: registers capped at 80 so that three
// fit, 24 warps per SM and half as many weights again requested before the PDL wait; the norm weight read after the
// wait with the row) or 2 (FERN_CUDA_GEMV_OCC=2). Smaller GEMVs (out_proj, o_proj: one block's work per SM) keep
// the uncapped kernel, which measured faster for them (docs/notes/cuda-decode-v16-occupancy.md). Read at every
// call, for comparisons.
int gemv_occupancy() { return env_choice("FERN_CUDA_GEMV_OCC", {"2", "3"}, 1) == 0 ? 2 : 3; }

// The packed scales and biases of linear_kernel's SB form (FERN_CUDA_GEMV_SB=row, the default, or chunk; read at
// every call, for comparisons): 4-bit matrices in groups of 64, widths a multiple of 2,048, every matrix's scale and
// bias arrays on 4-byte boundaries (their rows are then too: 2 K / 64 bytes each).
bool gemv_sb(const QW& a, const Mats& m) {
  if (env_choice("FERN_CUDA_GEMV_SB", {"chunk", "row"}, 1) == 0) return false;
  if (a.bits != 4 || a.gs != 64 || a.in % 2048 != 0) return false;
  for (int i = 0; i < kMaxMats; ++i)
    if ((reinterpret_cast<uintptr_t>(m.s[i]) & 3) != 0 || (reinterpret_cast<uintptr_t>(m.b[i]) & 3) != 0) return false;
  return true;
}

// Whether the table's matrices follow each other in memory (weight_group.h): matrix i's codes, scales and biases
// start where matrix i - 1's end, so row r of the concatenation is row r of matrix 0's view, and the input
// projections' kernel skips the per-row choice of matrix ahead of its loads (CONTIG). Measured on the H200
// (docs/notes/cuda-decode-v26-contig.md): 10.39 -> 10.08 us per launch, 612.2 -> 618.0 tok/s at 4K, 433.6 -> 436.6
// at 128K. FERN_CUDA_GEMV_CONTIG=0 reads such a table matrix by matrix all the same (read at every call, for
// comparisons).
bool mats_contiguous(const QW& a, const Mats& m) {
  const int64_t code_bytes = a.in * a.bits / 8, groups = a.in / a.gs;  // per row
  for (int i = 1; i < kMaxMats && m.start[i + 1] != INT_MAX; ++i) {  // matrix i exists: its end is set
    if (static_cast<const char*>(m.w[i]) != static_cast<const char*>(m.w[0]) + m.start[i] * code_bytes ||
        m.s[i] != m.s[0] + m.start[i] * groups || m.b[i] != m.b[0] + m.start[i] * groups)
      return false;
  }
  return true;
}
bool gemv_contig(const QW& a, const Mats& m) {
  return env_choice("FERN_CUDA_GEMV_CONTIG", {"0", "1"}, 1) == 1 && mats_contiguous(a, m);
}

// The input projections' GEMV (packed rows, the input norm, three blocks per SM, one region) against the normed row
// as 8-bit digits ("1", the default: linear_kernel's Q8) or in fp32 ("0"); read at every call, for comparisons.
// Measured on the H200 (docs/notes/cuda-decode-v29-digits.md): 9.94 -> 8.95 us per launch, +2.75% / +1.8% decode at
// 4K / 128K. (A scale per chunk, which would let every staging take the digits without a block reduction, measured
// slower for these and for out_proj and o_proj: the staging's extra work is on the critical path.)
bool gemv_q8() { return env_choice("FERN_CUDA_GEMV_Q8", {"0", "1"}, 1) == 1; }

template <int BITS, bool MULTI, bool ROUTE, int STAGE>
void launch_bits(const Ctx& c, const QW& a, const Mats& m, int rows, const float* x, const RouteTail& tail, int T,
                 const InNorm& nm) {
  constexpr int E = ChunkTraits<BITS>::kElems;
  const int CPR = static_cast<int>(a.in / E);
  int lpr = 32;
  while (lpr > 4 && CPR < 2 * lpr) lpr /= 2;
  const size_t smem = x_smem_bytes<BITS>(a.in, lpr);
  if (smem > 48 * 1024) raise_error("linear: input width " + std::to_string(a.in) + " too large for the GEMV kernel");
  // Chunk offsets are 32-bit (qdot.cuh).
  if (int64_t(rows) * CPR >= (int64_t(1) << 31)) raise_error("linear: matrix too large for 32-bit chunk offsets");
  // 512-thread blocks, one per SM (32 lanes per row, not the fused router; gemv_wide): half the blocks staging the
  // same row from L2. Measured on the H200 (docs/notes/cuda-decode-v6.md, run 2): 8192 x 2048 5.73 -> 5.26 us, but
  // 2048 x 4096 3.77 -> 4.11 (64 blocks for 132 SMs) and the whole 4K step 19 us slower when taken everywhere.
  const bool wide = !ROUTE && lpr == 32 &&
                    (STAGE >= kStageGatedNorm ? gated_norm_wide(c, rows) : gemv_wide(c, rows));
  const int nt = wide ? 2 * kThreads : kThreads;
  const int rows_per_block = (nt / 32) * (32 / lpr) * kRPI;
  const int64_t need = (rows + rows_per_block - 1) / rows_per_block;
  // At most two blocks per SM (one when wide; three for the larger 4-bit GEMVs, gemv_occupancy): every block is
  // resident in the first wave (so the next kernel can launch early under PDL) and each warp walks several row
  // groups, overlapping the next group's loads with this one's math. One 256-thread block per SM (half the weights
  // in flight) measured 10% slower for the whole 4K step (docs/notes/cuda-decode-v10-tc.md).
  const int occ = gemv_occupancy();  // read for every GEMV: an unknown value is an error whatever the shape
  const bool occ3 = BITS == 4 && !ROUTE && lpr == 32 && !wide && need > 2 * int64_t(c.sms) && occ == 3 &&
                    (STAGE != kStageNorm || a.in <= 4 * kThreads * 2);  // InputStage<.., LATE>::NV
  const int blocks = static_cast<int>(std::min<int64_t>(need, int64_t(c.sms) * (wide ? 1 : occ3 ? 3 : 2)));
  dim3 grid(blocks, T);
  const bool sb = gemv_sb(a, m) && BITS == 4 && !ROUTE && lpr == 32 && !wide;  // the switch read for every GEMV
  const bool q8 = gemv_q8();  // read for every GEMV too
  if constexpr (BITS == 4 && !ROUTE) {
    if (occ3) {
      if constexpr (MULTI && STAGE == kStageNorm) {
        if (sb && q8 && gemv_contig(a, m)) {
          launch(c, "linear_kernel", linear_kernel<BITS, 32, MULTI, ROUTE, STAGE, 2, kThreads, 3, true, true, true>,
                 grid, kThreads, smem, a, m, rows, x, tail, nm);
          return;
        }
      }
      if constexpr (MULTI) {
        if (sb && gemv_contig(a, m)) {
          launch(c, "linear_kernel", linear_kernel<BITS, 32, MULTI, ROUTE, STAGE, 2, kThreads, 3, true, true>, grid,
                 kThreads, smem, a, m, rows, x, tail, nm);
          return;
        }
      }
      if (sb)
        launch(c, "linear_kernel", linear_kernel<BITS, 32, MULTI, ROUTE, STAGE, 2, kThreads, 3, true>, grid, kThreads,
               smem, a, m, rows, x, tail, nm);
      else
        launch(c, "linear_kernel", linear_kernel<BITS, 32, MULTI, ROUTE, STAGE, 2, kThreads, 3>, grid, kThreads, smem,
               a, m, rows, x, tail, nm);
      return;
    }
  }
  if constexpr (!MULTI && !ROUTE && STAGE == kStagePlain) {
    if (lpr == 32 && !wide && gemv_depth() == 3) {
      launch(c, "linear_kernel", linear_kernel<BITS, 32, false, false, kStagePlain, 3, kThreads>, grid, kThreads, smem, a, m,
             rows, x, tail, nm);
      return;
    }
  }
  if (wide) {
    launch(c, "linear_kernel", linear_kernel<BITS, 32, MULTI, ROUTE, STAGE, 2, 2 * kThreads>, grid, 2 * kThreads, smem,
           a, m, rows, x, tail, nm);
    return;
  }
  if constexpr (BITS == 4 && !ROUTE) {
    if (sb) {  // (FERN_CUDA_GEMV_NB=3 on a plain GEMV took its own kernel above)
      launch(c, "linear_kernel", linear_kernel<BITS, 32, MULTI, ROUTE, STAGE, 2, kThreads, 1, true>, grid, kThreads,
             smem, a, m, rows, x, tail, nm);
      return;
    }
  }
  switch (lpr) {
    case 32: launch(c, "linear_kernel", linear_kernel<BITS, 32, MULTI, ROUTE, STAGE, 2, kThreads>, grid, kThreads, smem, a, m, rows, x, tail, nm); break;
    case 16: launch(c, "linear_kernel", linear_kernel<BITS, 16, MULTI, ROUTE, STAGE, 2, kThreads>, grid, kThreads, smem, a, m, rows, x, tail, nm); break;
    case 8: launch(c, "linear_kernel", linear_kernel<BITS, 8, MULTI, ROUTE, STAGE, 2, kThreads>, grid, kThreads, smem, a, m, rows, x, tail, nm); break;
    default: launch(c, "linear_kernel", linear_kernel<BITS, 4, MULTI, ROUTE, STAGE, 2, kThreads>, grid, kThreads, smem, a, m, rows, x, tail, nm); break;
  }
}

// Where the tensor-core GEMV (linear_tc_kernel) is taken for 4-bit matrices whose groups are a multiple of 64: by
// default from kTcRows rows (lm_head). Measured on the H200 (docs/notes/cuda-decode-v10-tc.md, bench_cuda_decode
// gemv, cold L2): lm_head 87.7 us against 92.6 on the CUDA cores (three item buffers), but the smaller matrices
// gain nothing (8192 x 2048 5.95 vs 6.31 cold, 5.91 vs 5.55 warm; 2048 x 4096 4.19 vs 3.85), and with it on every
// GEMV the 4K step ran 557.1 tok/s against 572.6: the decode GEMVs are not bound by their instruction count.
// FERN_CUDA_GEMV_TC=0 / 1 takes it for none / every eligible GEMV, =N > 1 from N rows (read at every call, for
// comparisons).
constexpr int kTcRows = 65536;
bool gemv_tc_wanted(int rows) { return rows_switch("FERN_CUDA_GEMV_TC", rows, rows >= kTcRows); }

// Item buffers per warp: 3 where warps own whole tiles (lm_head: 87.7 us against 93.9 with 2), 2 where they share
// a tile's K blocks (at most a few items per warp); FERN_CUDA_GEMV_TC_NB=2 / 3 forces it (read at every call).
int tc_depth(bool whole) {
  const int forced = env_choice("FERN_CUDA_GEMV_TC_NB", {"2", "3"}, -1);
  return forced >= 0 ? 2 + forced : whole ? 3 : 2;
}

template <bool MULTI, int STAGE>
bool launch_tc(const Ctx& c, const QW& a, const Mats& m, int rows, const float* x, int T, const InNorm& nm) {
  if (a.bits != 4 || a.gs % 64 != 0 || a.in % 64 != 0 || !gemv_tc_wanted(rows)) return false;
  const int K = static_cast<int>(a.in), KB = tc_blocks(K);
  if (int64_t(rows) * (K / 32) >= (int64_t(1) << 31)) return false;  // 32-bit chunk offsets (qdot.cuh)
  TcTiles tt{};
  int tiles = 0;
  for (int i = 0; i <= kMaxMats; ++i) {
    if (m.start[i] == INT_MAX) {
      tt.start[i] = INT_MAX;
      continue;
    }
    tt.start[i] = tiles;
    if (i < kMaxMats && m.start[i + 1] != INT_MAX) tiles += (m.start[i + 1] - m.start[i] + 15) / 16;
  }
  constexpr int NT = kThreads, W = NT / 32;
  tt.tiles = tiles;
  tt.tpb = (tiles + 2 * c.sms - 1) / (2 * c.sms);
  const int blocks = (tiles + tt.tpb - 1) / tt.tpb;
  const size_t smem = size_t(tc_smem_bytes(K)) + (tt.tpb < W ? size_t(tt.tpb) * KB * 16 * 4 : 0);
  if (smem > 48 * 1024) return false;
  const dim3 grid(blocks, T);
  if (tc_depth(tt.tpb >= W) == 3)
    launch(c, "linear_tc_kernel", linear_tc_kernel<MULTI, STAGE, 3, NT>, grid, NT, smem, a, m, rows, tt, x, nm);
  else
    launch(c, "linear_tc_kernel", linear_tc_kernel<MULTI, STAGE, 2, NT>, grid, NT, smem, a, m, rows, tt, x, nm);
  return true;
}

template <bool MULTI, bool ROUTE, int STAGE = kStagePlain>
void launch_any(const Ctx& c, const QW& a, const Mats& m, int rows, const float* x, const RouteTail& tail, int T,
                const InNorm& nm = InNorm{}) {
  if constexpr (!ROUTE) {
    if (launch_tc<MULTI, STAGE>(c, a, m, rows, x, T, nm)) return;
  }
  switch (a.bits) {
    case 4: launch_bits<4, MULTI, ROUTE, STAGE>(c, a, m, rows, x, tail, T, nm); break;
    case 8: launch_bits<8, MULTI, ROUTE, STAGE>(c, a, m, rows, x, tail, T, nm); break;
    default: launch_bits<16, MULTI, ROUTE, STAGE>(c, a, m, rows, x, tail, T, nm); break;
  }
}

// The fold's kernel (linear_kernel's FOLD form: 256 threads, packed rows, one row group per warp; route_fold_ok).
template <int STAGE>
void launch_fold(const Ctx& c, const QW& a, const Mats& m, const float* x, const RouteFold& f, const InNorm& nm) {
  constexpr int NT = kThreads;
  RouteTail tail;
  FoldArgs& g = tail.fold;
  g.R = static_cast<int>(f.router.out + 1);
  g.pc = static_cast<const uint4*>(f.packed);
  g.psb = reinterpret_cast<const uint32_t*>(static_cast<const char*>(f.packed) + f.router.in * g.R);
  g.nw = f.norm_w;
  g.resid = f.resid;
  g.pre = reinterpret_cast<unsigned long long*>(f.pre);
  g.stride = f.stride;
  const int rows = static_cast<int>(a.out);
  launch(c, "linear_kernel", linear_kernel<4, 32, false, false, STAGE, 2, NT, 1, true, false, false, true>,
         dim3(rows / kFoldRows<NT>, 1), NT, x_smem_bytes<4>(a.in, 32), a, m, rows, x, tail, nm);
}

// A table of n matrices (n <= kMaxMats) with their outputs; unused entries start at INT_MAX.
Mats make_mats(const QW* ws, float* const* ys, int n) {
  Mats m{};
  int r = 0;
  for (int i = 0; i < kMaxMats; ++i) {
    if (i < n) {
      m.w[i] = ws[i].w;
      m.s[i] = ws[i].s;
      m.b[i] = ws[i].b;
      m.y[i] = ys[i];
      m.start[i] = r;
      r += static_cast<int>(ws[i].out);
    } else {
      m.w[i] = ws[0].w;  // never selected (start INT_MAX); a valid pointer all the same
      m.s[i] = ws[0].s;
      m.b[i] = ws[0].b;
      m.y[i] = ys[0];
      m.start[i] = i == n ? r : INT_MAX;
    }
  }
  m.start[kMaxMats] = n == kMaxMats ? r : INT_MAX;
  return m;
}

}  // namespace

void linear(const Ctx& c, const QW& w, const float* x, float* y, int T) {
  if (linear_gemm_wins(w, T)) return linear_gemm(c, w, x, y, T);
  linear_gemv(c, w, x, y, T);
}

void linear_gemv(const Ctx& c, const QW& w, const float* x, float* y, int T) {
  if (T <= 0) return;
  FERN_CU_CHECK(w.out < (int64_t(1) << 31), "linear: too many output rows");
  launch_any<false, false>(c, w, make_mats(&w, &y, 1), static_cast<int>(w.out), x, RouteTail{}, T);
}

bool linear_multi_ok(const QW* ws, int n) {
  if (n < 1 || n > kMaxMats) return false;
  int64_t rows = 0;
  for (int i = 0; i < n; ++i) {
    if (ws[i].bits != ws[0].bits || ws[i].in != ws[0].in || ws[i].gs != ws[0].gs || ws[i].experts != 0) return false;
    rows += ws[i].out;
  }
  return rows < (int64_t(1) << 31);
}

bool linear_multi_contiguous(const QW* ws, int n) {
  if (!linear_multi_ok(ws, n) || ws[0].bits == 16) return false;
  std::vector<float*> ys(size_t(n), nullptr);
  return mats_contiguous(ws[0], make_mats(ws, ys.data(), n));
}

void linear_multi(const Ctx& c, const QW* ws, const float* x, float* const* ys, int n, int T) {
  FERN_CU_CHECK(linear_multi_ok(ws, n), "linear_multi: matrices of different formats or widths");
  if (T <= 0) return;
  bool any_gemm = false;
  for (int i = 0; i < n; ++i) any_gemm = any_gemm || linear_gemm_wins(ws[i], T);
  if (any_gemm) {
    // Prefill: one launch of the wgmma loop for all of them where it runs (x converted once; the small matrices,
    // e.g. the GDN b and a projections, ride along), else one launch per matrix on the kernel that suits its size.
    // The one launch measured on the H200: docs/notes/cuda-prefill-v19-multi.md.
    if (env_choice("FERN_GEMM_MULTI", {"0", "1"}, 1) == 1 && linear_gemm_multi(c, ws, x, ys, n, T)) return;
    for (int i = 0; i < n; ++i) linear(c, ws[i], x, ys[i], T);
    return;
  }
  int rows = 0;
  for (int i = 0; i < n; ++i) rows += static_cast<int>(ws[i].out);
  launch_any<true, false>(c, ws[0], make_mats(ws, ys, n), rows, x, RouteTail{}, T);
}

// The input norm's stage for rows of w.in values (the kernels keep kNormV float4s per thread), after the checks
// both norm entry points share; `who` names the caller in the error.
namespace {
InNorm input_norm(const QW& w, const float* norm_w, float eps, float* xn, const char* who) {
  FERN_CU_CHECK(w.in % 4 == 0 && w.in <= 4 * kThreads * kNormV && norm_w != nullptr,
                std::string(who) + ": width or norm weight");
  InNorm nm;
  nm.w = norm_w;
  nm.eps = eps;
  nm.xn = xn;
  return nm;
}
}  // namespace

void linear_multi_norm(const Ctx& c, const QW* ws, const float* x, const float* norm_w, float eps, float* xn,
                       float* const* ys, int n, int T) {
  FERN_CU_CHECK(linear_multi_ok(ws, n), "linear_multi_norm: matrices of different formats or widths");
  const InNorm nm = input_norm(ws[0], norm_w, eps, xn, "linear_multi_norm");
  if (T <= 0) return;
  int rows = 0;
  for (int i = 0; i < n; ++i) rows += static_cast<int>(ws[i].out);
  launch_any<true, false, kStageNorm>(c, ws[0], make_mats(ws, ys, n), rows, x, RouteTail{}, T, nm);
}

void linear_norm(const Ctx& c, const QW& w, const float* x, const float* norm_w, float eps, float* xn, float* y) {
  FERN_CU_CHECK(w.experts == 0, "linear_norm: an expert stack");
  const InNorm nm = input_norm(w, norm_w, eps, xn, "linear_norm");
  launch_any<false, false, kStageNorm>(c, w, make_mats(&w, &y, 1), static_cast<int>(w.out), x, RouteTail{}, 1, nm);
}

bool linear_gated_norm_ok(const QW& w, int head) {
  // head: a power of two whose float4s fit one warp; the row within the kNormV float4s per thread.
  return head >= 4 && head <= 128 && (head & (head - 1)) == 0 && w.in % head == 0 &&
         w.in <= 4 * kThreads * kNormV && w.experts == 0 && w.out < (int64_t(1) << 31);
}

// The gated norm's fixed-shape kernels (kStageGatedNorm128) for a 4-bit GDN out_proj of the real model with z read
// early, where the CUDA-core GEMV takes it (FERN_CUDA_GEMV_GN_LEAN=1, the default; 0 keeps the generic staging, for
// comparisons). Read at every call. Measured on the H200 with the lean GDN step before it
// (docs/notes/cuda-decode-v28-lean-regs.md): 4.53 -> 4.27 us per launch.
bool gated_norm_fixed(const QW& w, int head, bool early_z, int rows) {
  return w.bits == 4 && w.in == kGn128Width && head == kGn128Head && early_z && !gemv_tc_wanted(rows) &&
         env_choice("FERN_CUDA_GEMV_GN_LEAN", {"0", "1"}, 1) == 1;
}

namespace {
// route_fold_pack's copy: item i < H / 16 * R is chunk i / R of row i % R, the rest the rows' scale and bias words.
__global__ void fold_pack_kernel(QW r, QW g, uint4* pc, uint32_t* psb, int R, int H) {
  const int64_t n_code = int64_t(H / 16) * R, n_sb = int64_t(H / 64) * R;
  const int64_t step = gridDim.x * int64_t(blockDim.x);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n_code + n_sb; i += step) {
    if (i < n_code) {
      const int64_t c = i / R, e = i % R;
      const uint8_t* w = e < R - 1 ? static_cast<const uint8_t*>(r.w) + e * H : static_cast<const uint8_t*>(g.w);
      pc[i] = *reinterpret_cast<const uint4*>(w + 16 * c);
    } else {
      const int64_t j = i - n_code, gi = j / R, e = j % R;
      const int64_t o = (e < R - 1 ? e * (H / 64) : 0) + gi;
      psb[j] = uint32_t(e < R - 1 ? r.s[o] : g.s[o]) | (uint32_t(e < R - 1 ? r.b[o] : g.b[o]) << 16);
    }
  }
}
}  // namespace

size_t route_fold_pack_bytes(const QW& router) {
  return size_t(router.out + 1) * size_t(router.in) + size_t(router.out + 1) * size_t(router.in / 64) * 4;
}

bool route_fold_pack_ok(const QW& router, const QW& sgr) {
  auto aligned16 = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  return router.bits == 8 && router.gs == 64 && router.in % 64 == 0 && router.experts == 0 && sgr.bits == 8 &&
         sgr.gs == 64 && sgr.in == router.in && sgr.out == 1 && sgr.experts == 0 && aligned16(router.w) &&
         aligned16(sgr.w);
}

void route_fold_pack(const Ctx& c, const QW& router, const QW& sgr, void* dst) {
  FERN_CU_CHECK(route_fold_pack_ok(router, sgr) && (reinterpret_cast<uintptr_t>(dst) & 15) == 0,
                "route_fold_pack: an 8-bit router in groups of 64 with aligned rows");
  const int R = static_cast<int>(router.out + 1), H = static_cast<int>(router.in);
  uint4* pc = static_cast<uint4*>(dst);
  uint32_t* psb = reinterpret_cast<uint32_t*>(static_cast<char*>(dst) + size_t(H) * R);
  const int64_t items = int64_t(H / 16) * R + int64_t(H / 64) * R;
  launch(c, "fold_pack_kernel", fold_pack_kernel, int((items + 255) / 256), 256, 0, router, sgr, pc, psb, R, H);
}

bool route_fold_ok(const QW& w, const RouteFold& f) {
  auto aligned4 = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 3) == 0; };
  constexpr int NT = kThreads;
  return w.bits == 4 && w.gs == 64 && w.experts == 0 && w.in % 2048 == 0 && w.in <= 2 * 2048 &&  // nc <= NB = 2
         w.out % kFoldRows<NT> == 0 && w.out < (int64_t(1) << 24) && aligned4(w.s) && aligned4(w.b) &&
         f.router.out >= 1 && f.router.out + 1 <= 2 * NT && f.router.in == w.out &&
         route_fold_pack_ok(f.router, f.sgr) &&
         f.norm_w != nullptr && f.resid != nullptr && f.pre != nullptr && f.stride >= 1 && f.packed != nullptr &&
         (reinterpret_cast<uintptr_t>(f.packed) & 15) == 0;
}

void linear_fold(const Ctx& c, const QW& w, const float* x, float* y, const RouteFold& f) {
  FERN_CU_CHECK(route_fold_ok(w, f), "linear_fold: shapes or formats the fold does not take");
  launch_fold<kStagePlain>(c, w, make_mats(&w, &y, 1), x, f, InNorm{});
}

void linear_gated_norm(const Ctx& c, const QW& w, const float* y, const float* z, const float* norm_w, float eps,
                       int head, float* out, bool early_z, const RouteFold* fold) {
  FERN_CU_CHECK(linear_gated_norm_ok(w, head) && norm_w != nullptr && z != nullptr,
                "linear_gated_norm: width, head width or norm weight");
  InNorm nm;
  nm.w = norm_w;
  nm.eps = eps;
  nm.z = z;
  nm.head = head;
  nm.z_early = early_z ? 1 : 0;
  const Mats m = make_mats(&w, &out, 1);
  const int rows = static_cast<int>(w.out);
  if (fold != nullptr) {
    FERN_CU_CHECK(route_fold_ok(w, *fold), "linear_gated_norm: shapes or formats the fold does not take");
    if (gated_norm_fixed(w, head, early_z, rows))
      launch_fold<kStageGatedNorm128>(c, w, m, y, *fold, nm);
    else
      launch_fold<kStageGatedNorm>(c, w, m, y, *fold, nm);
    return;
  }
  if (gated_norm_fixed(w, head, early_z, rows)) {
    launch_bits<4, false, false, kStageGatedNorm128>(c, w, m, rows, y, RouteTail{}, 1, nm);
    return;
  }
  launch_any<false, false, kStageGatedNorm>(c, w, m, rows, y, RouteTail{}, 1, nm);
}

bool route_fused(const Ctx& c, const QW& router, const QW& shared_gate, const float* x, float* logits,
                 float* sg_logit, int32_t* ids, float* wts, float* sgate, int T, int topk) {
  if (T <= 0 || T > c.n_counters || shared_gate.out != 1 || shared_gate.bits != router.bits ||
      shared_gate.in != router.in || shared_gate.gs != router.gs)
    return false;
  RouteTail tail;
  tail.topk = topk;
  tail.ids = ids;
  tail.wts = wts;
  tail.sgate = sgate;
  tail.counters = c.counters;
  const QW ws[2] = {router, shared_gate};
  float* const ys[2] = {logits, sg_logit};
  launch_any<true, true>(c, router, make_mats(ws, ys, 2), static_cast<int>(router.out) + 1, x, tail, T);
  return true;
}

}  // namespace fern::cuda
