// The delta rule of the Gated DeltaNet prefill in its chunked (WY) form (MODEL.md 2.4, chunks of C = 64 rows, the
// tail padded with zero rows), on the tensor cores. It replaces the register-resident scan (gdn_prefill.cu, kernel
// 2) between the same conv pre-pass and gated norm; it reads the pre-pass output xc [T, conv_dim] and writes the
// raw outputs into y. Two launches:
//  A. gdn_chunk_prep_kernel, grid (chunk, value head), fully parallel: the gates, the in-chunk cumulative log decay
//     Gamma (in double, as the CPU reference: a sum of log decays reaches hundreds within a chunk and the fp32
//     difference of two such sums would put ~1e-5 into every decay factor), G = K K^T and Q K^T on the tensor
//     cores, A = strictly-lower(diag(beta) G * decay), P = (Q K^T) * decay (diagonal included), then the forward
//     substitutions (I + A) U = diag(beta) V and (I + A) W = diag(beta exp(Gamma)) K in fp32 on the CUDA cores
//     (one thread per column of U or W: no barriers between the 64 rows). U, W, P, exp(Gamma) and
//     exp(Gamma_last - Gamma) go to the workspace.
//  B. gdn_chunk_state_kernel<DK>, grid (value head, 32 state columns), sequential over the chunks with the block's
//     [DK, 32] state slice in shared memory (fp32): per chunk V' = U - W S, O = diag(exp Gamma) Q S + P V' (written
//     to y), S <- exp(Gamma_last) S + K^T diag(exp(Gamma_last - Gamma)) V'. Columns of the state are independent in
//     the delta rule, so the four column slices of a head never talk to each other.
// Every product runs as 3xTF32 on mma.sync m16n8k8: each fp32 operand is split into a tf32 high part and a tf32
// remainder, and hi*hi + hi*lo + lo*hi is accumulated in fp32 (the dropped lo*lo term is ~2^-22 relative), so the
// result stays at fp32-like accuracy; one tf32 product (10-bit mantissa) would put ~1e-3 relative error into the
// state every chunk. The cross terms accumulate into a second register set (two independent mma chains per tile).
#include "cuda/cuda_util.cuh"
#include "cuda/gdn_prefill.h"
#include "cuda/launch.cuh"
#include "cuda/ptx.cuh"

namespace fern::cuda {
namespace {

constexpr int kC = kGdnChunk;  // rows per chunk
constexpr int kThreads = 256;  // 8 warps in both kernels
constexpr int kCols = 32;      // state columns per block of the state kernel
constexpr int kPs = kC + 4;    // padded row of 64-wide tiles: a stride = 4 (mod 32) makes fragment reads conflict-free
constexpr int kVs = kCols + 8; // padded row of 32-wide tiles: a stride = 8 (mod 32) for B-fragment reads

// Workspace floats per (chunk, value head): W [C, Dk], U [C, Dv], P [C, C], exp(Gamma) [C], exp(Gamma_L - Gamma) [C].
__host__ __device__ inline int64_t block_floats(int Dk, int Dv) { return int64_t(kC) * (Dk + Dv + kC + 2); }

__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// x = hi + lo as two tf32 values, in four integer/float instructions: hi rounded to nearest (ties away) by adding
// half an ulp of the tf32 mantissa to the bits and clearing the 13 low ones, lo = x - hi (exact) truncated the same
// way (its dropped bits are ~2^-22 of x, the size of the lo*lo term 3xTF32 leaves out). `cvt.rna.tf32.f32` is not
// a hardware conversion on sm_80/sm_90: it compiles to ~4-5 instructions with an Inf/NaN check, so the two
// conversions per element were ~60% of the state kernel's instructions (Nsight Compute, notes cuda-prefill-v17-glue.md).
// Inf/NaN inputs give NaN either way; finite values near FLT_MAX could round up to Inf (the GDN operands are
// normalised keys and queries, decay factors <= 1 and their products: far below).
__device__ __forceinline__ void split_tf32(float x, uint32_t& hi, uint32_t& lo) {
  hi = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
  lo = __float_as_uint(x - __uint_as_float(hi)) & 0xffffe000u;
}

// d += a b for one m16n8k8 tile, tf32 operands, fp32 accumulators.
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Fragments, split into tf32 high and low parts. Lane: g = lane / 4, t = lane % 4. A (16 x 8): elements (g, t),
// (g + 8, t), (g, t + 4), (g + 8, t + 4); B (8 x 8): (t, g), (t + 4, g); C (16 x 8): (g, 2t), (g, 2t + 1),
// (g + 8, 2t), (g + 8, 2t + 1).
struct FragA {
  uint32_t hi[4], lo[4];
};
struct FragB {
  uint32_t hi[2], lo[2];
};
__device__ __forceinline__ FragA split_a(float v0, float v1, float v2, float v3) {
  FragA f;
  split_tf32(v0, f.hi[0], f.lo[0]);
  split_tf32(v1, f.hi[1], f.lo[1]);
  split_tf32(v2, f.hi[2], f.lo[2]);
  split_tf32(v3, f.hi[3], f.lo[3]);
  return f;
}
// A element (m, k) at p[m * ld + k].
__device__ __forceinline__ FragA frag_a(const float* p, int ld, int g, int t) {
  return split_a(p[g * ld + t], p[(g + 8) * ld + t], p[g * ld + t + 4], p[(g + 8) * ld + t + 4]);
}
// A element (m, k) at p[k * ld + m] (the transpose of a row-major store).
__device__ __forceinline__ FragA frag_a_t(const float* p, int ld, int g, int t) {
  return split_a(p[t * ld + g], p[t * ld + g + 8], p[(t + 4) * ld + g], p[(t + 4) * ld + g + 8]);
}
__device__ __forceinline__ FragB split_b(float v0, float v1) {
  FragB f;
  split_tf32(v0, f.hi[0], f.lo[0]);
  split_tf32(v1, f.hi[1], f.lo[1]);
  return f;
}
// B element (k, n) at p[k * ld + n].
__device__ __forceinline__ FragB frag_b(const float* p, int ld, int g, int t) {
  return split_b(p[t * ld + g], p[(t + 4) * ld + g]);
}
// B element (k, n) at p[n * ld + k] (B = M^T of a row-major M).
__device__ __forceinline__ FragB frag_b_t(const float* p, int ld, int g, int t) {
  return split_b(p[g * ld + t], p[g * ld + t + 4]);
}
// d + e += a b in 3xTF32: the main product into d, the two cross terms into e.
__device__ __forceinline__ void mma3(float (&d)[4], float (&e)[4], const FragA& a, const FragB& b) {
  mma_tf32(d, a.hi, b.hi[0], b.hi[1]);
  mma_tf32(e, a.hi, b.lo[0], b.lo[1]);
  mma_tf32(e, a.lo, b.hi[0], b.hi[1]);
}

// ---- A. per (chunk, value head): gates, decays, A, P, U and W ----
// Dynamic shared memory: the Q rows of the chunk [C][Dk + 4], whose room then takes A [C][kPs] (Q is read only by
// the Q K^T products, before A is written); the K rows [C][Dk + 4]; the V rows [C][Dv] (requested with K and Q, so
// that their latency passes under the products instead of stalling the substitution's first reads).
__host__ __device__ inline int prep_qa_floats(int Dk) { return kC * (Dk + 4) > kC * kPs ? kC * (Dk + 4) : kC * kPs; }
size_t prep_smem_bytes(int Dk, int Dv) {
  return (size_t(prep_qa_floats(Dk)) + size_t(kC) * (Dk + 4) + size_t(kC) * Dv) * sizeof(float);
}

// The lower-triangle 16 x 8 tiles of G = K K^T and Q K^T (tiles wholly above the diagonal are zero in both masked
// matrices): row tile mt has 2 mt + 2 of them, 20 in all. Warp w takes row tile mt(w), n-tiles nt0(w) ..
// nt0(w) + cnt(w) - 1: at most 3 per warp. (A warp per half row tile took 0 to 4 of them, and the slowest set the
// barrier after the products: Nsight Compute found 8% of the kernel's stall samples at it.) Nibble w of each word.
constexpr uint32_t kTileMt = 0x33322110u, kTileNt0 = 0x63030200u, kTileCnt = 0x23333222u;
constexpr int kMaxTiles = 3;
static_assert(kC == 64 && kThreads == 256, "the tile tables cover 64-row chunks with 8 warps");

__global__ void __launch_bounds__(kThreads) gdn_chunk_prep_kernel(GdnShape sh, int T, const float* __restrict__ xc,
                                                                  const float* __restrict__ bgate,
                                                                  const float* __restrict__ agate,
                                                                  const float* __restrict__ A_log,
                                                                  const float* __restrict__ dt_bias,
                                                                  float* __restrict__ ws) {
  extern __shared__ __align__(16) float dyn[];
  __shared__ double gam[kC];
  __shared__ float beta[kC], egam[kC];
  const int Dk = sh.Dk, Dv = sh.Dv, Hv = sh.Hv, ldk = Dk + 4;
  float* Qs = dyn;
  float(*As)[kPs] = reinterpret_cast<float(*)[kPs]>(dyn);  // over Q once the products are done; strictly lower part
  float* Ks = dyn + prep_qa_floats(Dk);
  float* Vs = Ks + kC * ldk;
  const int chunk = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int t0 = chunk * kC, rows = min(kC, T - t0);
  const int64_t C = sh.conv_dim, key_dim = int64_t(sh.Hk) * Dk;
  const int kh = h / (Hv / sh.Hk);
  const float* qsrc = xc + int64_t(kh) * Dk;
  const float* ksrc = xc + key_dim + int64_t(kh) * Dk;
  const float* vsrc = xc + 2 * key_dim + int64_t(h) * Dv;
  const float neg_A = -expf(A_log[h]), dtb = dt_bias[h];  // weights: may be read before the PDL wait
  pdl_wait();
  pdl_trigger();

  const int F = Dk / 4;
  for (int idx = tid; idx < kC * F; idx += kThreads) {
    const int r = idx / F, c4 = idx % F;
    const bool ok = r < rows;  // padded rows: zeros
    const int64_t off = int64_t(ok ? t0 + r : 0) * C + 4 * c4;
    ptx::cp_async16(Ks + r * ldk + 4 * c4, ksrc + off, ok);
    ptx::cp_async16(Qs + r * ldk + 4 * c4, qsrc + off, ok);
  }
  const int FV = Dv / 4;
  for (int idx = tid; idx < kC * FV; idx += kThreads) {
    const int r = idx / FV, c4 = idx % FV;
    const bool ok = r < rows;
    ptx::cp_async16(Vs + r * Dv + 4 * c4, vsrc + int64_t(ok ? t0 + r : 0) * C + 4 * c4, ok);
  }
  ptx::cp_commit();
  if (warp == 0) {
    // Gates of rows 2 lane and 2 lane + 1 (padded rows: g = 0, beta = 0), then Gamma by a shuffle scan in double.
    float gl[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int r = 2 * lane + e;
      float gv = 0.0f, bv = 0.0f;
      if (r < rows) {
        const int64_t i = int64_t(t0 + r) * Hv + h;
        bv = 1.0f / (1.0f + expf(-bgate[i]));
        gv = neg_A * softplus(agate[i] + dtb);
      }
      gl[e] = gv;
      beta[r] = bv;
    }
    double incl = double(gl[0]) + double(gl[1]);
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const double n = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += n;
    }
    double excl = __shfl_up_sync(0xffffffffu, incl, 1);
    if (lane == 0) excl = 0.0;
    gam[2 * lane] = excl + gl[0];
    gam[2 * lane + 1] = excl + gl[0] + gl[1];
  }
  ptx::cp_wait<0>();
  __syncthreads();

  float* wsb = ws + (int64_t(chunk) * Hv + h) * block_floats(Dk, Dv);
  float* W = wsb;
  float* U = W + kC * Dk;
  float* P = U + kC * Dv;
  float* gq = P + kC * kC;
  float* gk = gq + kC;
  if (tid < kC) {
    const float e = static_cast<float>(exp(gam[tid]));
    egam[tid] = e;
    gq[tid] = e;
    gk[tid] = static_cast<float>(exp(gam[kC - 1] - gam[tid]));  // padded rows have g = 0: Gamma_last is the last real row's
  }

  // G = K K^T and Q K^T, this warp's tiles (kTileMt above).
  {
    const int mt = (kTileMt >> (4 * warp)) & 15, nt0 = (kTileNt0 >> (4 * warp)) & 15;
    const int cnt = (kTileCnt >> (4 * warp)) & 15, m0 = 16 * mt;
    float dG[kMaxTiles][4] = {}, eG[kMaxTiles][4] = {}, dP[kMaxTiles][4] = {}, eP[kMaxTiles][4] = {};
    for (int k0 = 0; k0 < Dk; k0 += 8) {
      const FragA ak = frag_a(Ks + m0 * ldk + k0, ldk, g, t);
      const FragA aq = frag_a(Qs + m0 * ldk + k0, ldk, g, t);
#pragma unroll
      for (int j = 0; j < kMaxTiles; ++j) {
        if (j >= cnt) continue;  // warp-uniform
        const int n0 = (nt0 + j) * 8;
        const FragB bk = frag_b_t(Ks + n0 * ldk + k0, ldk, g, t);
        mma3(dG[j], eG[j], ak, bk);
        mma3(dP[j], eP[j], aq, bk);
      }
    }
    __syncthreads();  // every warp is done with Q: A goes into its room
#pragma unroll
    for (int j = 0; j < kMaxTiles; ++j) {
      if (j >= cnt) continue;
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int r = m0 + g + 8 * hr, s = (nt0 + j) * 8 + 2 * t;
        float pv[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int ss = s + e;
          const float kk = dG[j][2 * hr + e] + eG[j][2 * hr + e], qk = dP[j][2 * hr + e] + eP[j][2 * hr + e];
          const float dec = ss <= r ? static_cast<float>(exp(gam[r] - gam[ss])) : 0.0f;  // exponent <= 0
          As[r][ss] = ss < r ? beta[r] * kk * dec : 0.0f;
          pv[e] = qk * dec;
        }
        *reinterpret_cast<float2*>(P + r * kC + s) = make_float2(pv[0], pv[1]);
      }
    }
    // P's tiles above the diagonal: zeros (the state kernel multiplies the whole of P).
    for (int idx = tid; idx < kC * kC / 4; idx += kThreads) {
      const int r = idx / (kC / 4), s = 4 * (idx % (kC / 4));
      if (s >= 16 * (r / 16) + 16) *reinterpret_cast<float4*>(P + r * kC + s) = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  __syncthreads();

  // Forward substitution, one column per thread: x_r = b_r - sum_{s<r} A[r, s] x_s, with b = beta v (U) or
  // beta exp(Gamma) k (W). Rows past T have b = 0 and A = 0, so x = 0 there.
  for (int col = tid; col < Dv + Dk; col += kThreads) {
    float x[kC];
    if (col < Dv) {
#pragma unroll
      for (int r = 0; r < kC; ++r) x[r] = beta[r] * Vs[r * Dv + col];  // padded rows: beta 0, V zero-filled
    } else {
      const int i = col - Dv;
#pragma unroll
      for (int r = 0; r < kC; ++r) x[r] = (beta[r] * egam[r]) * Ks[r * ldk + i];
    }
#pragma unroll
    for (int r = 1; r < kC; ++r) {
      float acc = x[r];
#pragma unroll
      for (int s = 0; s < r; ++s) acc = fmaf(-As[r][s], x[s], acc);
      x[r] = acc;
    }
    if (col < Dv) {
#pragma unroll
      for (int r = 0; r < kC; ++r) U[r * Dv + col] = x[r];
    } else {
#pragma unroll
      for (int r = 0; r < kC; ++r) W[r * Dk + (col - Dv)] = x[r];
    }
  }
}

// ---- B. per (value head, 32 state columns): the inter-chunk recurrence ----
template <int DK>
constexpr size_t state_smem_floats() {
  // W, Q [C][DK + 4]; K double-buffered [2][C][DK + 4]; P double-buffered [2][C][C + 4]; U, V' [C][kVs];
  // S [DK][kVs]; exp(Gamma) [C]; exp(Gamma_L - Gamma) [2][C].
  return size_t(4) * kC * (DK + 4) + size_t(2) * kC * kPs + size_t(2) * kC * kVs + size_t(DK) * kVs + 3 * kC;
}

template <int DK>
__global__ void __launch_bounds__(kThreads) gdn_chunk_state_kernel(GdnShape sh, int T, const float* __restrict__ xc,
                                                                   const float* __restrict__ ws,
                                                                   float* __restrict__ state,
                                                                   float* __restrict__ y) {
  constexpr int LD = DK + 4;
  constexpr int MT3 = DK / 16, NT3 = DK / 32;  // state update: DK/16 row tiles x 4 column tiles over 8 warps
  static_assert(DK == 32 || DK == 64 || DK == 128);
  extern __shared__ __align__(16) float smem[];
  float* Ws = smem;
  float* Qs = Ws + kC * LD;
  float* Ks = Qs + kC * LD;   // [2][C][LD]
  float* Ps = Ks + 2 * kC * LD;  // [2][C][kPs]
  float* Us = Ps + 2 * kC * kPs;
  float* Vs = Us + kC * kVs;
  float* Ss = Vs + kC * kVs;  // [DK][kVs]
  float* gqs = Ss + DK * kVs;
  float* gks = gqs + kC;      // [2][C]

  const int h = blockIdx.x, col0 = blockIdx.y * kCols, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int Dv = sh.Dv, Hv = sh.Hv;
  const int64_t C = sh.conv_dim, key_dim = int64_t(sh.Hk) * DK, BS = block_floats(DK, Dv);
  const int kh = h / (Hv / sh.Hk);
  const float* qsrc = xc + int64_t(kh) * DK;
  const float* ksrc = xc + key_dim + int64_t(kh) * DK;
  const int nch = (T + kC - 1) / kC;
  pdl_wait();
  pdl_trigger();

  // W, Q, U, exp(Gamma) of chunk ch (the single-buffered set: read only by phase 1).
  auto load_wq = [&](int ch) {
    const float* wsb = ws + (int64_t(ch) * Hv + h) * BS;
    const int t0 = ch * kC, rows = min(kC, T - t0);
    for (int idx = tid; idx < kC * (DK / 4); idx += kThreads) {
      const int r = idx / (DK / 4), c4 = idx % (DK / 4);
      ptx::cp_async16(Ws + r * LD + 4 * c4, wsb + r * DK + 4 * c4);
      const bool ok = r < rows;
      ptx::cp_async16(Qs + r * LD + 4 * c4, qsrc + int64_t(ok ? t0 + r : 0) * C + 4 * c4, ok);
    }
    for (int idx = tid; idx < kC * (kCols / 4); idx += kThreads) {
      const int r = idx / (kCols / 4), c4 = idx % (kCols / 4);
      ptx::cp_async16(Us + r * kVs + 4 * c4, wsb + kC * DK + r * Dv + col0 + 4 * c4);
    }
    if (tid < kC / 4) ptx::cp_async16(gqs + 4 * tid, wsb + kC * (DK + Dv + kC) + 4 * tid);
  };
  // K, P, exp(Gamma_L - Gamma) of chunk ch into buffer buf (read by phases 2 and 3).
  auto load_kp = [&](int ch, int buf) {
    const float* wsb = ws + (int64_t(ch) * Hv + h) * BS;
    const int t0 = ch * kC, rows = min(kC, T - t0);
    float* kd = Ks + buf * kC * LD;
    float* pd = Ps + buf * kC * kPs;
    for (int idx = tid; idx < kC * (DK / 4); idx += kThreads) {
      const int r = idx / (DK / 4), c4 = idx % (DK / 4);
      const bool ok = r < rows;
      ptx::cp_async16(kd + r * LD + 4 * c4, ksrc + int64_t(ok ? t0 + r : 0) * C + 4 * c4, ok);
    }
    for (int idx = tid; idx < kC * (kC / 4); idx += kThreads) {
      const int r = idx / (kC / 4), c4 = idx % (kC / 4);
      ptx::cp_async16(pd + r * kPs + 4 * c4, wsb + kC * (DK + Dv) + r * kC + 4 * c4);
    }
    if (tid < kC / 4) ptx::cp_async16(gks + buf * kC + 4 * tid, wsb + kC * (DK + Dv + kC + 1) + 4 * tid);
  };

  float* S = state + int64_t(h) * DK * Dv + col0;
  for (int idx = tid; idx < DK * (kCols / 4); idx += kThreads) {
    const int i = idx / (kCols / 4), c4 = idx % (kCols / 4);
    *reinterpret_cast<float4*>(Ss + i * kVs + 4 * c4) = *reinterpret_cast<const float4*>(S + int64_t(i) * Dv + 4 * c4);
  }
  load_wq(0);
  load_kp(0, 0);
  ptx::cp_commit();

  const int m0 = (warp & 3) * 16, n1 = (warp >> 2) * 16;      // phases 1, 2: rows m0.., columns n1, n1 + 8
  const int i0 = (warp % MT3) * 16, n3 = (warp / MT3) * NT3 * 8;  // phase 3: key rows i0.., columns n3..
  for (int ch = 0; ch < nch; ++ch) {
    const int buf = ch & 1, t0 = ch * kC, rows = min(kC, T - t0);
    ptx::cp_wait<0>();
    __syncthreads();
    if (ch + 1 < nch) load_kp(ch + 1, buf ^ 1);
    ptx::cp_commit();

    // Phase 1: W S and Q S over the key dimension, sharing the S fragments.
    float dW[2][4] = {}, eW[2][4] = {}, dQ[2][4] = {}, eQ[2][4] = {};
#pragma unroll 4
    for (int k0 = 0; k0 < DK; k0 += 8) {
      const FragA aw = frag_a(Ws + m0 * LD + k0, LD, g, t);
      const FragA aq = frag_a(Qs + m0 * LD + k0, LD, g, t);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const FragB bs = frag_b(Ss + k0 * kVs + n1 + 8 * j, kVs, g, t);
        mma3(dW[j], eW[j], aw, bs);
        mma3(dQ[j], eQ[j], aq, bs);
      }
    }
    const float eL = gqs[kC - 1];
    float dO[2][4], eO[2][4] = {};
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = m0 + g + 8 * (e >> 1), n = n1 + 8 * j + 2 * t + (e & 1);
        Vs[r * kVs + n] = Us[r * kVs + n] - (dW[j][e] + eW[j][e]);  // V' = U - W S
        dO[j][e] = (dQ[j][e] + eQ[j][e]) * gqs[r];                  // diag(exp Gamma) Q S
      }
    __syncthreads();
    if (ch + 1 < nch) load_wq(ch + 1);  // W, Q, U, exp(Gamma) are free now
    ptx::cp_commit();

    // Phase 2: O += P V', rows of this chunk written raw (the gated norm follows).
    const float* pb = Ps + buf * kC * kPs;
#pragma unroll 2
    for (int k0 = 0; k0 < kC; k0 += 8) {
      const FragA ap = frag_a(pb + m0 * kPs + k0, kPs, g, t);
#pragma unroll
      for (int j = 0; j < 2; ++j) mma3(dO[j], eO[j], ap, frag_b(Vs + k0 * kVs + n1 + 8 * j, kVs, g, t));
    }
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int r = m0 + g + 8 * hr;
        if (r < rows) {
          const int n = n1 + 8 * j + 2 * t;
          *reinterpret_cast<float2*>(y + (int64_t(t0 + r) * Hv + h) * Dv + col0 + n) =
              make_float2(dO[j][2 * hr] + eO[j][2 * hr], dO[j][2 * hr + 1] + eO[j][2 * hr + 1]);
        }
      }

    // Phase 3: S <- exp(Gamma_L) S + K^T diag(exp(Gamma_L - Gamma)) V' (this warp's tiles of S only).
    const float* kb = Ks + buf * kC * LD;
    const float* gkb = gks + buf * kC;
    float dS[NT3][4], eS[NT3][4] = {};
#pragma unroll
    for (int j = 0; j < NT3; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        dS[j][e] = eL * Ss[(i0 + g + 8 * (e >> 1)) * kVs + n3 + 8 * j + 2 * t + (e & 1)];
#pragma unroll 2
    for (int k0 = 0; k0 < kC; k0 += 8) {
      const FragA ak = frag_a_t(kb + k0 * LD + i0, LD, g, t);
      const float s0 = gkb[k0 + t], s1 = gkb[k0 + t + 4];
#pragma unroll
      for (int j = 0; j < NT3; ++j) {
        const float* vp = Vs + k0 * kVs + n3 + 8 * j;
        mma3(dS[j], eS[j], ak, split_b(s0 * vp[t * kVs + g], s1 * vp[(t + 4) * kVs + g]));
      }
    }
#pragma unroll
    for (int j = 0; j < NT3; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        Ss[(i0 + g + 8 * (e >> 1)) * kVs + n3 + 8 * j + 2 * t + (e & 1)] = dS[j][e] + eS[j][e];
  }
  ptx::cp_wait<0>();
  __syncthreads();
  for (int idx = tid; idx < DK * (kCols / 4); idx += kThreads) {
    const int i = idx / (kCols / 4), c4 = idx % (kCols / 4);
    *reinterpret_cast<float4*>(S + int64_t(i) * Dv + 4 * c4) = *reinterpret_cast<const float4*>(Ss + i * kVs + 4 * c4);
  }
}

template <int DK>
void launch_state(const Ctx& c, const GdnShape& sh, int T, const float* xc, const float* ws, float* state, float* y) {
  constexpr size_t smem = state_smem_floats<DK>() * sizeof(float);
  static_assert(smem <= 227 * 1024, "state kernel shared memory");
  allow_dynamic_smem<gdn_chunk_state_kernel<DK>>(smem);
  launch(c, "gdn_chunk_state_kernel", gdn_chunk_state_kernel<DK>, dim3(sh.Hv, sh.Dv / kCols), kThreads, smem, sh, T,
         xc, ws, state, y);
  FERN_CUDA_LAUNCH_CHECK("gdn_chunk_state_kernel");
}

}  // namespace

bool gdn_chunked_ok(const GdnShape& sh) {
  return gdn_prefill_ok(sh) && (sh.Dk == 32 || sh.Dk == 64 || sh.Dk == 128);
}

int64_t gdn_chunked_ws_floats(const GdnShape& sh, int T) {
  return int64_t((T + kC - 1) / kC) * sh.Hv * block_floats(sh.Dk, sh.Dv);
}

void gdn_chunked_prep(const Ctx& c, const GdnShape& sh, int T, const float* xc, const float* b, const float* a,
                      const float* A_log, const float* dt_bias, float* ws) {
  FERN_CU_CHECK(gdn_chunked_ok(sh), "gdn_chunked: unsupported head shape");
  FERN_CU_CHECK(T >= 1 && aligned16(xc) && aligned16(ws), "gdn_chunked: no rows or unaligned scratch");
  const size_t smem = prep_smem_bytes(sh.Dk, sh.Dv);
  allow_dynamic_smem<gdn_chunk_prep_kernel>(prep_smem_bytes(128, 256));  // the largest Dk and Dv the kernel takes
  launch(c, "gdn_chunk_prep_kernel", gdn_chunk_prep_kernel, dim3((T + kC - 1) / kC, sh.Hv), kThreads, smem, sh, T, xc,
         b, a, A_log, dt_bias, ws);
  FERN_CUDA_LAUNCH_CHECK("gdn_chunk_prep_kernel");
}

void gdn_chunked_state(const Ctx& c, const GdnShape& sh, int T, const float* xc, const float* ws, float* state,
                       float* y) {
  FERN_CU_CHECK(gdn_chunked_ok(sh), "gdn_chunked: unsupported head shape");
  switch (sh.Dk) {
    case 32: launch_state<32>(c, sh, T, xc, ws, state, y); break;
    case 64: launch_state<64>(c, sh, T, xc, ws, state, y); break;
    default: launch_state<128>(c, sh, T, xc, ws, state, y); break;
  }
}

void gdn_prefill_chunked(const Ctx& c, const GdnShape& sh, int T, const float* xc, const float* b, const float* a,
                         const float* A_log, const float* dt_bias, float* state, float* y, float* ws) {
  gdn_chunked_prep(c, sh, T, xc, b, a, A_log, dt_bias, ws);
  gdn_chunked_state(c, sh, T, xc, ws, state, y);
}

}  // namespace fern::cuda
