// Sparse MoE for T rows (MODEL.md 2.5), in three launches after the router GEMV:
//  1. moe_route:   router logits and shared-expert-gate logit (GEMV), then one block per token does softmax over
//                  the experts, top-k (lowest index on ties), renormalisation and sigmoid of the shared gate. The
//                  chosen ids and weights stay on the GPU.
//  2. moe_gate_up: one launch for the k selected experts plus the shared expert (grid.y = slot): each warp computes
//                  a gate row and the matching up row together and writes SiLU(g) * u, so the intermediate never
//                  needs a second pass.
//  3. moe_down:    one warp per output row reads that row of all k selected down matrices and of the shared down
//                  matrix and sums w_k * y_k + sigmoid(s) * shared, so the routed sum and the shared expert cost
//                  one launch and one write of the output.
// Inputs written by an earlier kernel are plain `const T*`, never `const T* __restrict__`: under PDL that kernel
// may still be running while this one is resident, and const + restrict would allow the non-coherent load path
// and its scheduling ahead of griddepcontrol.wait (qdot.cuh stage_x, docs/notes/cuda-decode-v6.md). Weights
// and the position counter (written only by advance_kernel, the last launch of a step) may stay restrict.
#include "cuda/kernels.h"
#include "cuda/launch.cuh"
#include "cuda/qdot.cuh"
#include "cuda/topk.cuh"

namespace fern::cuda {
namespace {

constexpr int kThreads = 256;

// ---- top-k (stand-alone; the fused router runs the same code in its tail, linear.cu) ----
__global__ void __launch_bounds__(32) topk_kernel(const float* logits, const float* sg_logit,
                                                  int E, int k, int32_t* __restrict__ ids, float* __restrict__ wts,
                                                  float* __restrict__ sgate) {
  pdl_wait();
  pdl_trigger();
  const int t = blockIdx.x;
  topk_warp(logits + int64_t(t) * E, sg_logit + t, E, k, ids + int64_t(t) * k, wts + int64_t(t) * k, sgate + t);
}

// Field-by-field select, so that the kernel parameters are not copied to the stack.
__device__ __forceinline__ QW pick(bool c, const QW& a, const QW& b) {
  QW r;
  r.w = c ? a.w : b.w;
  r.s = c ? a.s : b.s;
  r.b = c ? a.b : b.b;
  r.out = c ? a.out : b.out;
  r.in = c ? a.in : b.in;
  r.w_expert = c ? a.w_expert : b.w_expert;
  r.sb_expert = c ? a.sb_expert : b.sb_expert;
  r.bits = c ? a.bits : b.bits;
  r.gs = c ? a.gs : b.gs;
  r.experts = c ? a.experts : b.experts;
  return r;
}

// ---- gate/up + SiLU ----
// Per lane and pipeline step: 2 chunks of the gate row and of the up row.
struct PairBuf {
  uint4 w[2][2];
  float s[2][2], b[2][2];
};

template <int BITS, int LPR>
__global__ void __launch_bounds__(kThreads) gate_up_kernel(QW G, QW U, QW SG, QW SU, const float* x,
                                                           MoeScratch s, int topk) {
  extern __shared__ float4 smem[];
  constexpr int F4 = ChunkTraits<BITS>::kF4;
  constexpr int RS = 32 / LPR;  // rows per warp pass
  const int t = blockIdx.z, slot = blockIdx.y;
  const bool shared = slot == topk;
  // A routed slot needs the router's choice before it knows its expert; the shared expert's slot requests its
  // first rows before waiting on the previous kernel.
  int64_t e = 0;
  if (!shared) {
    pdl_wait();
    e = s.topk_ids[int64_t(t) * topk + slot];
  }
  const ChunkMat mg = chunk_mat<BITS>(pick(shared, SG, G), e);
  const ChunkMat mu = chunk_mat<BITS>(pick(shared, SU, U), e);
  const int K = static_cast<int>(G.in);
  const int CPR = mg.cpr;
  const int nc = (CPR + 2 * LPR - 1) / (2 * LPR);
  const int I = static_cast<int>(G.out), Is = static_cast<int>(SG.out);
  const int rows = shared ? Is : I;
  float* h = s.h + int64_t(t) * (int64_t(topk) * I + Is) + (shared ? int64_t(topk) * I : int64_t(slot) * I);

  const int lane = threadIdx.x & 31;
  const int sub = lane % LPR, rslot = lane / LPR;
  const int warps = gridDim.x * (kThreads / 32);
  const int gw = blockIdx.x * (kThreads / 32) + threadIdx.x / 32;
  const int ngroups = (rows + RS - 1) / RS;
  const int S = (gw < ngroups ? (ngroups - 1 - gw) / warps + 1 : 0) * nc;

  int lg = gw, lci = 0;  // row group and chunk pass of the next step to load
  auto load_step = [&](PairBuf& B) {
    const int i = lg * RS + rslot;
    const bool ok = i < rows;
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int c = sub + (lci * 2 + q) * LPR;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if (ok && c < CPR) {
          load_chunk<BITS>(r == 0 ? mg : mu, i, c, B.w[q][r], B.s[q][r], B.b[q][r]);
        } else {
          B.w[q][r] = make_uint4(0, 0, 0, 0);
          B.s[q][r] = B.b[q][r] = 0.0f;
        }
      }
    }
    if (++lci == nc) {
      lci = 0;
      lg += warps;
    }
  };

  PairBuf A, B;
  if (S > 0) load_step(A);
  if (shared) pdl_wait();
  float4* xs = smem;
  float* xc = reinterpret_cast<float*>(smem + x_slots<BITS, LPR>(K));
  stage_x<BITS, LPR>(x + int64_t(t) * K, K, xs, xc);
  pdl_trigger();
  const float4* xl = xs + sub;
  const float* xcl = xc + sub;

  float acc[2] = {0.0f, 0.0f};
  int cg = gw, cci = 0;
  auto step = [&](int st, const PairBuf& cur, PairBuf& nxt) {
    if (st + 1 < S) load_step(nxt);
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int j = cci * 2 + q;
      if (sub + j * LPR < CPR) {
        float d[2];
        chunk_dot<BITS, LPR, 2>(cur.w[q], xl + j * (F4 * LPR), d);
        const float xsum = BITS == 16 ? 0.0f : xcl[j * LPR];
#pragma unroll
        for (int r = 0; r < 2; ++r) acc[r] += apply_group<BITS>(d[r], cur.s[q][r], cur.b[q][r], xsum);
      }
    }
    if (++cci == nc) {
      cci = 0;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
#pragma unroll
        for (int o = LPR / 2; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
      }
      const int i = cg * RS + rslot;
      if (sub == 0 && i < rows) h[i] = silu(acc[0]) * acc[1];
      acc[0] = acc[1] = 0.0f;
      cg += warps;
    }
  };
  for (int st = 0; st < S; st += 2) {
    step(st, A, B);
    if (st + 1 < S) step(st + 1, B, A);
  }
}

// ---- down + routing weights + gated shared expert ----
// Item j of a row is chunk j of the concatenated [k routed experts | shared] intermediate; lane l takes items
// l, l + 32, ... Each slot's matrix view (expert base pointers, row strides) is built once per block in shared
// memory, so a load is one table read, one 32-bit multiply-add and the 16-byte load.
template <int BITS>
__global__ void __launch_bounds__(kThreads) down_kernel(QW D, QW SD, MoeScratch s, float* __restrict__ out,
                                                        int topk) {
  pdl_wait();
  pdl_trigger();
  extern __shared__ float4 smem[];
  __shared__ float fac[65];
  __shared__ ChunkMat mats[65];
  constexpr int E = ChunkTraits<BITS>::kElems, F4 = ChunkTraits<BITS>::kF4;
  constexpr int U = 8;  // chunks in flight per lane: a whole row of the real model (144 chunks) in one round
  const int t = blockIdx.y;
  const int I = static_cast<int>(D.in), Is = static_cast<int>(SD.in);
  const int nx = topk * I + Is;
  float4* xs = smem;
  float* xc = reinterpret_cast<float*>(smem + x_slots<BITS, 32>(nx));
  if (threadIdx.x <= topk) {
    const bool sh = int(threadIdx.x) == topk;
    fac[threadIdx.x] = sh ? s.sgate[t] : s.topk_w[int64_t(t) * topk + threadIdx.x];
    mats[threadIdx.x] = chunk_mat<BITS>(pick(sh, SD, D), sh ? 0 : s.topk_ids[int64_t(t) * topk + threadIdx.x]);
  }
  stage_x<BITS, 32>(s.h + int64_t(t) * nx, nx, xs, xc);  // ends with a barrier: fac and mats are visible
  const int cpr = I / E;
  const int routed_items = topk * cpr;
  const int items = routed_items + Is / E;
  const int H = static_cast<int>(D.out);

  const int lane = threadIdx.x & 31;
  const int warps = gridDim.x * (kThreads / 32);
  for (int n = blockIdx.x * (kThreads / 32) + threadIdx.x / 32; n < H; n += warps) {
    float acc = 0.0f;
    for (int j0 = lane; j0 < items; j0 += 32 * U) {
      uint4 wv[U];
      float sc[U], bi[U];
      int sl[U];
#pragma unroll
      for (int q = 0; q < U; ++q) {
        const int j = j0 + 32 * q;
        sl[q] = -1;
        wv[q] = make_uint4(0, 0, 0, 0);
        sc[q] = bi[q] = 0.0f;
        if (j < items) {
          sl[q] = j < routed_items ? j / cpr : topk;
          const int cc = j < routed_items ? j - sl[q] * cpr : j - routed_items;
          load_chunk<BITS>(mats[sl[q]], n, cc, wv[q], sc[q], bi[q]);
        }
      }
#pragma unroll
      for (int q = 0; q < U; ++q) {
        if (sl[q] >= 0) {
          const int j = j0 + 32 * q;
          const uint4 w1[1] = {wv[q]};
          float d[1];
          chunk_dot<BITS, 32, 1>(w1, xs + (j >> 5) * (F4 * 32) + lane, d);
          const float xsum = BITS == 16 ? 0.0f : xc[j];
          acc = fmaf(fac[sl[q]], apply_group<BITS>(d[0], sc[q], bi[q], xsum), acc);
        }
      }
    }
    acc = warp_sum(acc);
    if (lane == 0) out[int64_t(t) * H + n] = acc;
  }
}

template <int BITS>
void gate_up_bits(const Ctx& c, const QW& g, const QW& u, const QW& sg, const QW& su, const float* x,
                  const MoeScratch& s, int T, int topk) {
  constexpr int E = ChunkTraits<BITS>::kElems;
  const int CPR = static_cast<int>(g.in / E);
  int lpr = 32;
  while (lpr > 4 && CPR < 2 * lpr) lpr /= 2;
  const size_t smem = x_smem_bytes<BITS>(g.in, lpr);
  if (smem > 48 * 1024) raise_error("moe: hidden size too large for the gate/up kernel");
  const int64_t rows = std::max(g.out, sg.out);
  const int rows_per_block = (kThreads / 32) * (32 / lpr);
  const int64_t need = (rows + rows_per_block - 1) / rows_per_block;
  // Enough blocks to cover the GPU about twice over all slots and rows, each warp looping over a few rows.
  const int64_t want = std::max<int64_t>(1, (int64_t(c.sms) * 2 + (topk + 1) * T - 1) / ((topk + 1) * T));
  dim3 grid(static_cast<unsigned>(std::min(need, want)), topk + 1, T);
  switch (lpr) {
    case 32: launch(c, "gate_up_kernel", gate_up_kernel<BITS, 32>, grid, kThreads, smem, g, u, sg, su, x, s, topk); break;
    case 16: launch(c, "gate_up_kernel", gate_up_kernel<BITS, 16>, grid, kThreads, smem, g, u, sg, su, x, s, topk); break;
    case 8: launch(c, "gate_up_kernel", gate_up_kernel<BITS, 8>, grid, kThreads, smem, g, u, sg, su, x, s, topk); break;
    default: launch(c, "gate_up_kernel", gate_up_kernel<BITS, 4>, grid, kThreads, smem, g, u, sg, su, x, s, topk); break;
  }
  FERN_CUDA_LAUNCH_CHECK("gate_up_kernel");
}

template <int BITS>
void down_bits(const Ctx& c, const QW& d, const QW& sd, const MoeScratch& s, float* out, int T, int topk) {
  const int64_t nx = topk * d.in + sd.in;
  const size_t smem = x_smem_bytes<BITS>(nx, 32);
  if (smem > 48 * 1024) raise_error("moe: expert width too large for the down kernel");
  const int64_t rows_per_block = kThreads / 32;  // one output row per warp: 2048 rows fill 256 blocks
  const int64_t blocks = std::min<int64_t>((d.out + rows_per_block - 1) / rows_per_block, int64_t(c.sms) * 4);
  dim3 grid(static_cast<unsigned>(blocks), T);
  launch(c, "down_kernel", down_kernel<BITS>, grid, kThreads, smem, d, sd, s, out, topk);
  FERN_CUDA_LAUNCH_CHECK("down_kernel");
}

}  // namespace

void moe_route(const Ctx& c, const QW& router, const QW& shared_gate, const float* x, const MoeScratch& s, int T,
               int topk) {
  FERN_CU_CHECK(topk >= 1 && topk <= 32 && topk <= router.out, "moe: top-k out of range");
  if (router.out > 32 * kTopkMaxPerLane) raise_error("moe: more than 1024 experts are not supported");
  if (route_fused(c, router, shared_gate, x, s.router_logits, s.sgate_logit, s.topk_ids, s.topk_w, s.sgate, T, topk)) {
    FERN_CUDA_LAUNCH_CHECK("linear_kernel (fused router)");
    return;
  }
  linear(c, router, x, s.router_logits, T);
  linear(c, shared_gate, x, s.sgate_logit, T);
  const int E = static_cast<int>(router.out);
  launch(c, "topk_kernel", topk_kernel, T, 32, 0, s.router_logits, s.sgate_logit, E, topk, s.topk_ids,
                                                         s.topk_w, s.sgate);
  FERN_CUDA_LAUNCH_CHECK("topk_kernel");
}

void moe_gate_up(const Ctx& c, const QW& gate, const QW& up, const QW& sgate, const QW& sup, const float* x,
                 const MoeScratch& s, int T, int topk) {
  FERN_CU_CHECK(gate.bits == up.bits && gate.bits == sgate.bits && gate.bits == sup.bits,
                "moe: gate/up/shared weights must share one format");
  switch (gate.bits) {
    case 4: gate_up_bits<4>(c, gate, up, sgate, sup, x, s, T, topk); break;
    case 8: gate_up_bits<8>(c, gate, up, sgate, sup, x, s, T, topk); break;
    default: gate_up_bits<16>(c, gate, up, sgate, sup, x, s, T, topk); break;
  }
}

void moe_down(const Ctx& c, const QW& down, const QW& sdown, const MoeScratch& s, float* out, int T, int topk) {
  FERN_CU_CHECK(down.bits == sdown.bits, "moe: down and shared down must share one format");
  switch (down.bits) {
    case 4: down_bits<4>(c, down, sdown, s, out, T, topk); break;
    case 8: down_bits<8>(c, down, sdown, s, out, T, topk); break;
    default: down_bits<16>(c, down, sdown, s, out, T, topk); break;
  }
}

}  // namespace fern::cuda
