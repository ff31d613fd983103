// Gated DeltaNet prefill (MODEL.md 2.4 steps 3-9) over T rows in three launches:
//  1. gdn_conv_prep_kernel: causal conv + SiLU of every channel of every row, the carried conv state read for the
//     first kernel-1 rows and then replaced by the chunk's last kernel-1 inputs, q and k l2-normalised (q also
//     scaled by Dk^-1/2), all into the scratch xc [T, conv_dim]. Fully parallel over 64-row tiles and heads.
//  2. gdn_scan_kernel: the delta rule, sequential over the T rows. Block (value head h, 32 value columns), 32*P/NC
//     threads = 32 columns x P slices of the key dimension, NC columns per thread (default P = 8, NC = 2); each
//     thread holds R = Dk/P elements of each of its state columns S[:, j] in registers for the whole call (the
//     state is read once and written once). Rows
//     of q, k, v are staged through shared memory 16 at a time with cp.async, one batch ahead. One pass over the
//     registers per row does the decay and rank-1 update, o_j = S[:, j] . q_t and S[:, j] . k_{t+1}, which is what
//     the next row needs for m = S^T k (times its decay), so a row costs one pass and one P-lane shuffle reduction.
//  3. gdn_gated_norm (gdn.cu, shared with decode): gated RMSNorm with z, one warp per (row, value head), in place.
// With GdnForm::Chunked, gdn_prefill runs the chunked WY form (gdn_chunked.cu, two launches) in place of kernel 2.
#include <algorithm>

#include "cuda/cuda_util.cuh"
#include "cuda/gdn_prefill.h"
#include "cuda/launch.cuh"
#include "cuda/ptx.cuh"

namespace fern::cuda {
namespace {

constexpr int kMaxHeadDim = 256;  // largest Dk / Dv of a head the pre-pass takes (gdn_gated_norm: the same)
constexpr int kMaxKernel = 8;     // largest conv kernel

__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// ---- 1. conv + SiLU + l2 norms ----
// Grid (64-row tiles, 2*Hk + Hv segments): segment s < Hk is q head s, then the Hk k heads, then the Hv v heads.
// 2 * max(Dk, Dv) threads: thread = (row group rg of 8 rows, channel quad cq of the segment's D / 4), so a thread
// loads its 8 + KS - 1 input rows of 4 channels as float4 (the 3-row halo of a group is mostly an L1 hit: the group
// above loaded it) and keeps them in registers; a q/k row's sum of squares is a butterfly over the D / 4 lanes of the
// row group (Dk <= 128: at most a warp), so no shared memory and no barrier. Version 1 (16-row tiles, 128 threads,
// one channel and scalar loads per thread, the tile staged in shared memory) took 416 us per 8,192-row call at the
// real shape, ~3x its bytes at the copy bandwidth (docs/notes/cuda-prefill-v17-glue.md).
constexpr int kConvRows = 64;   // rows per block
constexpr int kConvRowsPerThread = 8;
constexpr int kConvGroups = kConvRows / kConvRowsPerThread;

__device__ __forceinline__ float4 f4_at(const float* p) { return *reinterpret_cast<const float4*>(p); }

template <int KS>
__global__ void __launch_bounds__(2 * kMaxHeadDim) gdn_conv_prep_kernel(GdnShape sh, int T,
                                                                        const float* __restrict__ mixed,
                                                                        const float* __restrict__ conv_w,
                                                                        float* __restrict__ conv_state,
                                                                        float* __restrict__ xc) {
  constexpr int R = kConvRowsPerThread, NX = R + KS - 1;
  const int seg = blockIdx.y, t0 = blockIdx.x * kConvRows;
  const int64_t C = sh.conv_dim, key_dim = int64_t(sh.Hk) * sh.Dk;
  int64_t base;
  int D;
  float scale = 1.0f;
  if (seg < sh.Hk) {
    base = int64_t(seg) * sh.Dk;
    D = sh.Dk;
    scale = rsqrtf(float(sh.Dk));
  } else if (seg < 2 * sh.Hk) {
    base = key_dim + int64_t(seg - sh.Hk) * sh.Dk;
    D = sh.Dk;
  } else {
    base = 2 * key_dim + int64_t(seg - 2 * sh.Hk) * sh.Dv;
    D = sh.Dv;
  }
  const bool l2 = seg < 2 * sh.Hk;
  const int nq = D / 4, rg = threadIdx.x / nq, cq = threadIdx.x - rg * nq;
  if (rg >= kConvGroups) return;  // whole warps (8 nq is a multiple of 32): the shuffles below see full warps
  const int64_t ch = base + 4 * cq;
  const int r0 = t0 + R * rg;  // this thread's first output row
  float4 w[KS];                // tap j of channels ch .. ch + 3 (weights: read before the PDL wait)
#pragma unroll
  for (int j = 0; j < KS; ++j)
    w[j] = make_float4(conv_w[ch * KS + j], conv_w[(ch + 1) * KS + j], conv_w[(ch + 2) * KS + j],
                       conv_w[(ch + 3) * KS + j]);
  pdl_wait();
  pdl_trigger();

  // x[i] is input row r0 - (KS - 1) + i; negative rows come from the carried conv state (first tile only).
  float4 x[NX];
#pragma unroll
  for (int i = 0; i < NX; ++i) {
    const int p = r0 - (KS - 1) + i;
    x[i] = p >= T ? make_float4(0.f, 0.f, 0.f, 0.f)
                  : f4_at(p >= 0 ? mixed + int64_t(p) * C + ch : conv_state + int64_t(KS - 1 + p) * C + ch);
  }
  if (blockIdx.x == 0 && rg == 0) {
    // The new conv state: the last KS - 1 inputs of [old state; mixed]. Only this thread reads or writes these
    // entries (other threads' inputs start at row >= R - KS + 1 >= 0), and it reads every old value before writing.
    float4 next[KS - 1];
#pragma unroll
    for (int r = 0; r < KS - 1; ++r) {
      const int p = T - (KS - 1) + r;
      next[r] = f4_at(p >= 0 ? mixed + int64_t(p) * C + ch : conv_state + int64_t(KS - 1 + p) * C + ch);
    }
#pragma unroll
    for (int r = 0; r < KS - 1; ++r) *reinterpret_cast<float4*>(conv_state + int64_t(r) * C + ch) = next[r];
  }
  // Output row r0 + r: taps in order 0 .. KS - 1 (the oldest input first, as the CPU reference).
  float4 y[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int j = 0; j < KS; ++j) {
      acc.x = fmaf(w[j].x, x[r + j].x, acc.x);
      acc.y = fmaf(w[j].y, x[r + j].y, acc.y);
      acc.z = fmaf(w[j].z, x[r + j].z, acc.z);
      acc.w = fmaf(w[j].w, x[r + j].w, acc.w);
    }
    y[r] = make_float4(silu(acc.x), silu(acc.y), silu(acc.z), silu(acc.w));
  }
  if (l2) {  // uniform over the block; the row group's nq lanes (a power of two, <= 32) are adjacent in one warp
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float ss = (y[r].x * y[r].x + y[r].y * y[r].y) + (y[r].z * y[r].z + y[r].w * y[r].w);
      for (int o = nq / 2; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      const float inv = rsqrtf(ss + 1e-6f) * scale;  // eps inside the root, on the sum (MODEL.md 2.2)
      y[r] = make_float4(y[r].x * inv, y[r].y * inv, y[r].z * inv, y[r].w * inv);
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
    if (r0 + r < T) *reinterpret_cast<float4*>(xc + int64_t(r0 + r) * C + ch) = y[r];
}

// ---- 2. the delta-rule scan ----
constexpr int kScanCols = 32;  // value columns per block
constexpr int kStage = 16;     // rows per cp.async batch
// The variant the backend runs (Dk >= 32; Dk = 16 takes Slices4): the fastest of the three at every measured T
// (64 .. 4096; 1.25-1.5x the 4-slice scan).
constexpr GdnScan kDefaultScan = GdnScan::Slices8Cols2;

using ptx::cp_async16;

// Grid (Hv, Dv/32), 32*P/NC threads: the block's 32 state columns x P slices of the key dimension, NC columns per
// thread. Thread: slice sl = lane / L (rows sl*R .. sl*R+R-1, Dk = P*R), column group cg = lane % L, with L = 32/P
// lanes per slice in a warp; its columns are warp*L*NC + c*L + cg (c < NC) of the block. The lanes of one slice
// are adjacent and read the same q/k addresses (so shared memory may pack two lanes' returns), and with NC = 2 each
// q/k value read serves two columns. Per row a column's P partial sums are added with log2(P) shuffles (lanes L,
// 2L, ... apart). In shared memory each staged q/k row is stored as the P slices' R floats, each followed by 4 pad
// floats, so the P distinct float4 addresses of one read fall in different banks.
// Measured (H200, T = 2048, docs/notes/cuda-prefill-v2-gdn.md): 4 slices 0.83 ms (the same as with the slices
// interleaved lane by lane), 8 slices 0.68 ms (0.99 interleaved), 8 slices x 2 columns 0.56 ms = 0.27 us per row,
// ~520 cycles for ~175 instructions per warp: one warp per scheduler, so the per-row dependency chain (shuffle
// sums -> u -> update and dot products -> shuffle sums) sets the pace, not issue or bandwidth.
template <int P, int R, int NC>
__global__ void __launch_bounds__(32 * P / NC) gdn_scan_kernel(GdnShape sh, int T, const float* __restrict__ xc,
                                                               const float* __restrict__ bgate,
                                                               const float* __restrict__ agate,
                                                               const float* __restrict__ A_log,
                                                               const float* __restrict__ dt_bias,
                                                               float* __restrict__ state, float* __restrict__ y) {
  static_assert((P == 4 || P == 8) && (NC == 1 || NC == 2) && R % 4 == 0 && R <= 32);
  constexpr int kThreads = 32 * P / NC;
  constexpr int L = 32 / P;
  constexpr int KP = P * (R + 4);  // padded row
  constexpr int G = R / 4;         // float4s per slice
  constexpr int F = P * G;         // float4s per row (Dk / 4)
  constexpr int A = 4 / NC;        // partial accumulators per column for each dot product
  __shared__ __align__(16) float ks[2][kStage + 1][KP];  // k rows t0 .. t0+kStage (one ahead, for S . k_{t+1})
  __shared__ __align__(16) float qs[2][kStage][KP];
  __shared__ __align__(16) float vs[2][kStage][kScanCols];
  __shared__ float decs[2][kStage], betas[2][kStage];

  const int h = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int sl = lane / L, cg = lane % L;
  const int Dk = P * R, Dv = sh.Dv, Hv = sh.Hv;
  int jj[NC], j[NC];
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    jj[c] = warp * L * NC + c * L + cg;
    j[c] = blockIdx.y * kScanCols + jj[c];
  }
  const int64_t C = sh.conv_dim, key_dim = int64_t(sh.Hk) * Dk;
  const int kh = h / (Hv / sh.Hk);
  const float* qsrc = xc + int64_t(kh) * Dk;
  const float* ksrc = xc + key_dim + int64_t(kh) * Dk;
  const float* vsrc = xc + 2 * key_dim + int64_t(h) * Dv + blockIdx.y * kScanCols;
  const float neg_A = -expf(A_log[h]), dtb = dt_bias[h];  // weights: may be read before the PDL wait
  pdl_wait();
  pdl_trigger();

  auto stage = [&](int st, int buf) {
    const int t0 = st * kStage;
    for (int idx = tid; idx < (kStage + 1) * F; idx += kThreads) {
      const int r = idx / F, g = idx % F, t = t0 + r;
      float* dst = &ks[buf][r][(g / G) * (R + 4) + (g % G) * 4];
      if (t < T) cp_async16(dst, ksrc + int64_t(t) * C + 4 * g);
      else *reinterpret_cast<float4*>(dst) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    for (int idx = tid; idx < kStage * F; idx += kThreads) {
      const int r = idx / F, g = idx % F, t = t0 + r;
      float* dst = &qs[buf][r][(g / G) * (R + 4) + (g % G) * 4];
      if (t < T) cp_async16(dst, qsrc + int64_t(t) * C + 4 * g);
      else *reinterpret_cast<float4*>(dst) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    for (int idx = tid; idx < kStage * (kScanCols / 4); idx += kThreads) {
      const int r = idx / (kScanCols / 4), g = idx % (kScanCols / 4), t = t0 + r;
      float* dst = &vs[buf][r][4 * g];
      if (t < T) cp_async16(dst, vsrc + int64_t(t) * C + 4 * g);
      else *reinterpret_cast<float4*>(dst) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    if (tid < kStage) {
      // Gates: beta = sigmoid(b), decay = exp(g) with g = -exp(A_log) softplus(a + dt_bias). Rows past T: no-ops.
      const int t = t0 + tid;
      float beta = 0.0f, dec = 1.0f;
      if (t < T) {
        beta = 1.0f / (1.0f + expf(-bgate[int64_t(t) * Hv + h]));
        dec = expf(neg_A * softplus(agate[int64_t(t) * Hv + h] + dtb));
      }
      decs[buf][tid] = dec;
      betas[buf][tid] = beta;
    }
  };
  auto slice_sum = [](float v) {
#pragma unroll
    for (int o = L; o < 32; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
  };

  float* S = state + int64_t(h) * Dk * Dv;
  float s[NC][R];
#pragma unroll
  for (int c = 0; c < NC; ++c)
#pragma unroll
    for (int ii = 0; ii < R; ++ii) s[c][ii] = S[int64_t(sl * R + ii) * Dv + j[c]];

  const int nst = (T + kStage - 1) / kStage;
  stage(0, 0);
  ptx::cp_commit();
  float mdot[NC];  // S^T k of the coming row, before that row's decay, summed over the P slices
  for (int st = 0; st < nst; ++st) {
    const int buf = st & 1;
    if (st + 1 < nst) stage(st + 1, buf ^ 1);
    ptx::cp_commit();  // possibly empty: keeps "all but the newest group" = this batch
    ptx::cp_wait<1>();
    __syncthreads();
    const float* kb = &ks[buf][0][sl * (R + 4)];
    const float* qb = &qs[buf][0][sl * (R + 4)];
    if (st == 0) {
#pragma unroll
      for (int c = 0; c < NC; ++c) {
        float acc = 0.0f;
#pragma unroll
        for (int ii = 0; ii < R; ++ii) acc = fmaf(s[c][ii], kb[ii], acc);
        mdot[c] = slice_sum(acc);
      }
    }
    const int rows = min(kStage, T - st * kStage);
    for (int r = 0; r < rows; ++r) {
      const float dec = decs[buf][r], beta = betas[buf][r];
      // m = (dec S)^T k_t = dec (S^T k_t); u = beta (v - m); S <- dec S + k_t u^T; o = S^T q_t.
      float u[NC], o[NC][A], n[NC][A];
#pragma unroll
      for (int c = 0; c < NC; ++c) {
        u[c] = beta * (vs[buf][r][jj[c]] - dec * mdot[c]);
#pragma unroll
        for (int e = 0; e < A; ++e) o[c][e] = n[c][e] = 0.0f;
      }
      const float* kr = kb + r * KP;
      const float* kn = kr + KP;
      const float* qr = qb + r * KP;
#pragma unroll
      for (int ii = 0; ii < R; ii += 4) {
        const float4 k4 = *reinterpret_cast<const float4*>(kr + ii);
        const float4 q4 = *reinterpret_cast<const float4*>(qr + ii);
        const float4 n4 = *reinterpret_cast<const float4*>(kn + ii);
        const float kv[4] = {k4.x, k4.y, k4.z, k4.w}, qv[4] = {q4.x, q4.y, q4.z, q4.w};
        const float nv[4] = {n4.x, n4.y, n4.z, n4.w};
#pragma unroll
        for (int c = 0; c < NC; ++c) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float& x = s[c][ii + e];
            x = fmaf(kv[e], u[c], x * dec);
            o[c][e % A] = fmaf(x, qv[e], o[c][e % A]);
            n[c][e % A] = fmaf(x, nv[e], n[c][e % A]);
          }
        }
      }
      const int64_t yrow = (int64_t(st * kStage + r) * Hv + h) * Dv;
#pragma unroll
      for (int c = 0; c < NC; ++c) {
        float ov = o[c][0], mn = n[c][0];
#pragma unroll
        for (int e = 1; e < A; ++e) {
          ov += o[c][e];
          mn += n[c][e];
        }
        ov = slice_sum(ov);
        mdot[c] = slice_sum(mn);
        if (sl == 0) y[yrow + j[c]] = ov;  // raw; normalised by kernel 3
      }
    }
    __syncthreads();  // this buffer is refilled by the batch staged in the next iteration
  }
#pragma unroll
  for (int c = 0; c < NC; ++c)
#pragma unroll
    for (int ii = 0; ii < R; ++ii) S[int64_t(sl * R + ii) * Dv + j[c]] = s[c][ii];
}

template <int P, int R, int NC>
void launch_scan(const Ctx& c, const GdnShape& sh, int T, const float* xc, const float* b, const float* a,
                 const float* A_log, const float* dt_bias, float* state, float* y) {
  launch(c, "gdn_scan_kernel", gdn_scan_kernel<P, R, NC>, dim3(sh.Hv, sh.Dv / kScanCols), 32 * P / NC, 0, sh, T, xc,
         b, a, A_log, dt_bias, state, y);
  FERN_CUDA_LAUNCH_CHECK("gdn_scan_kernel");
}

// The variant (slices, columns per thread) for Dk = P * R; R must be a multiple of 4 up to 32.
template <int P, int NC>
void launch_scan_dk(const Ctx& c, const GdnShape& sh, int T, const float* xc, const float* b, const float* a,
                    const float* A_log, const float* dt_bias, float* state, float* y) {
  switch (sh.Dk / P) {
    case 32: if constexpr (P == 4) launch_scan<P, 32, NC>(c, sh, T, xc, b, a, A_log, dt_bias, state, y); break;
    case 16: launch_scan<P, 16, NC>(c, sh, T, xc, b, a, A_log, dt_bias, state, y); break;
    case 8: launch_scan<P, 8, NC>(c, sh, T, xc, b, a, A_log, dt_bias, state, y); break;
    case 4: launch_scan<P, 4, NC>(c, sh, T, xc, b, a, A_log, dt_bias, state, y); break;
    default: break;
  }
}

}  // namespace

bool gdn_prefill_ok(const GdnShape& sh) {
  const bool dk = sh.Dk == 16 || sh.Dk == 32 || sh.Dk == 64 || sh.Dk == 128;
  return dk && sh.Dv >= kScanCols && sh.Dv % kScanCols == 0 && sh.Dv <= kMaxHeadDim && sh.Hk > 0 &&
         sh.Hv >= sh.Hk && sh.Hv % sh.Hk == 0 && sh.kernel >= 2 && sh.kernel <= kMaxKernel &&
         sh.conv_dim == 2 * sh.Hk * sh.Dk + sh.Hv * sh.Dv;
}

int64_t gdn_prefill_scratch_floats(const GdnShape& sh, int T, GdnForm form) {
  // conv_dim is a multiple of 4 (gdn_prefill_ok), so the chunked workspace after xc stays 16-byte aligned.
  return int64_t(T) * sh.conv_dim + (form == GdnForm::Chunked ? gdn_chunked_ws_floats(sh, T) : 0);
}

void gdn_prefill_conv(const Ctx& c, const GdnShape& sh, int T, const float* mixed, const float* conv_w,
                      float* conv_state, float* xc) {
  FERN_CU_CHECK(gdn_prefill_ok(sh), "gdn_prefill: unsupported head shape");
  FERN_CU_CHECK(T >= 1, "gdn_prefill: no rows");
  FERN_CU_CHECK(aligned16(mixed) && aligned16(conv_state) && aligned16(xc),
                "gdn_prefill: rows or conv state not 16-byte aligned");
  const dim3 grid((T + kConvRows - 1) / kConvRows, 2 * sh.Hk + sh.Hv);
  const int threads = 2 * std::max(sh.Dk, sh.Dv);  // 8 row groups x D / 4 channel quads of the widest segment
  const auto go = [&](auto kernel) {
    launch(c, "gdn_conv_prep_kernel", kernel, grid, threads, 0, sh, T, mixed, conv_w, conv_state, xc);
  };
  switch (sh.kernel) {
    case 2: go(gdn_conv_prep_kernel<2>); break;
    case 3: go(gdn_conv_prep_kernel<3>); break;
    case 4: go(gdn_conv_prep_kernel<4>); break;
    case 5: go(gdn_conv_prep_kernel<5>); break;
    case 6: go(gdn_conv_prep_kernel<6>); break;
    case 7: go(gdn_conv_prep_kernel<7>); break;
    default: go(gdn_conv_prep_kernel<8>); break;
  }
  FERN_CUDA_LAUNCH_CHECK("gdn_conv_prep_kernel");
}

bool gdn_scan_ok(const GdnShape& sh, GdnScan v) {
  if (!gdn_prefill_ok(sh)) return false;
  switch (v) {
    case GdnScan::Default: return true;
    case GdnScan::Slices4: return true;                       // R = Dk/4 in {4, 8, 16, 32}
    case GdnScan::Slices8: case GdnScan::Slices8Cols2: return sh.Dk >= 32;  // R = Dk/8 in {4, 8, 16}
  }
  return false;
}

void gdn_prefill_scan(const Ctx& c, const GdnShape& sh, int T, const float* xc, const float* b, const float* a,
                      const float* A_log, const float* dt_bias, float* state, float* y, GdnScan variant) {
  FERN_CU_CHECK(gdn_scan_ok(sh, variant), "gdn_prefill_scan: unsupported head shape for this variant");
  FERN_CU_CHECK(T >= 1 && aligned16(xc), "gdn_prefill: no rows or unaligned scratch");
  if (variant == GdnScan::Default) variant = sh.Dk >= 32 ? kDefaultScan : GdnScan::Slices4;
  switch (variant) {
    case GdnScan::Slices8: launch_scan_dk<8, 1>(c, sh, T, xc, b, a, A_log, dt_bias, state, y); break;
    case GdnScan::Slices8Cols2: launch_scan_dk<8, 2>(c, sh, T, xc, b, a, A_log, dt_bias, state, y); break;
    default: launch_scan_dk<4, 1>(c, sh, T, xc, b, a, A_log, dt_bias, state, y); break;
  }
}

void gdn_prefill_norm(const Ctx& c, const GdnShape& sh, int T, const float* z, const float* norm_w, float* y) {
  FERN_CU_CHECK(gdn_prefill_ok(sh), "gdn_prefill: unsupported head shape");
  gdn_gated_norm(c, sh, T, z, norm_w, y);  // the decode step's kernel (gdn.cu), over every (row, value head)
}

void gdn_prefill(const Ctx& c, const GdnShape& sh, int T, const float* mixed, const float* z, const float* b,
                 const float* a, const float* conv_w, const float* A_log, const float* dt_bias, const float* norm_w,
                 float* conv_state, float* state, float* y, float* xc, GdnForm form) {
  gdn_prefill_conv(c, sh, T, mixed, conv_w, conv_state, xc);
  if (form == GdnForm::Chunked) {
    FERN_CU_CHECK(gdn_chunked_ok(sh), "gdn_prefill: the chunked form does not take this head shape");
    gdn_prefill_chunked(c, sh, T, xc, b, a, A_log, dt_bias, state, y, xc + int64_t(T) * sh.conv_dim);
  } else {
    gdn_prefill_scan(c, sh, T, xc, b, a, A_log, dt_bias, state, y);
  }
  if (norm_w != nullptr) gdn_prefill_norm(c, sh, T, z, norm_w, y);
}

}  // namespace fern::cuda
