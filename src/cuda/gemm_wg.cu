// The activation split of the wgmma prefill GEMMs (gemm_wg.h: bf16 hi and lo rows, one warp per row) and the
// device probe.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "core/env.h"
#include "cuda/cuda_util.cuh"
#include "cuda/gemm_wg.h"
#include "cuda/launch.cuh"
#include "cuda/wgmma.cuh"

namespace fern::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kNormThreads = 256;  // rmsnorm_xbf_q4_kernel: elementwise.cu's rmsnorm block, for the same sums

// Four values as bf16 hi (round to nearest) and lo = bf16(v - hi), in their order (to_xbf's rows).
__device__ __forceinline__ void plain_split(float4 v, __nv_bfloat162* dh, __nv_bfloat162* dl) {
  const __nv_bfloat162 h0 = __floats2bfloat162_rn(v.x, v.y), h1 = __floats2bfloat162_rn(v.z, v.w);
  const float2 f0 = __bfloat1622float2(h0), f1 = __bfloat1622float2(h1);
  dh[0] = h0;
  dh[1] = h1;
  dl[0] = __floats2bfloat162_rn(v.x - f0.x, v.y - f0.y);
  dl[1] = __floats2bfloat162_rn(v.z - f1.x, v.w - f1.y);
}

// x is a plain pointer (written by the previous kernel: a const __restrict__ load could move above the PDL wait).
__global__ void __launch_bounds__(32 * kWarps) to_xbf_kernel(const float* x, int64_t rows, int K,
                                                             uint16_t* __restrict__ hi, uint16_t* __restrict__ lo) {
  pdl_wait();
  pdl_trigger();
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  const float4* src = reinterpret_cast<const float4*>(x + row * K);
  __nv_bfloat162* dh = reinterpret_cast<__nv_bfloat162*>(hi + row * K);
  __nv_bfloat162* dl = reinterpret_cast<__nv_bfloat162*>(lo + row * K);
  for (int i = lane; i < K / 4; i += 32) plain_split(src[i], dh + 2 * i, dl + 2 * i);
}

// The exact-code loop's rows (gemm_tile_q4.cuh): hi and lo of each 8-wide chunk stored in the K order 0 4 1 5 2 6 3 7
// (the order its unpacked codes come in), and the sum of hi + lo over each 64-wide group. A lane takes one chunk,
// the 8 lanes of a group add up with shuffles. K a multiple of 64, so a warp's 32 chunks are 4 whole groups.
// H (q4h): one fp16 row instead (round to nearest, finite values past the range saturate), the sums of the rounded
// values (what the MMA multiplies), lo untouched.
// bsum (q4b, else nullptr): each sum also as bf16 hi + lo at [(g / 16) 32 + g % 16] and 16 further (X16::bsum),
// zeros in the rest of the bk-wide row.
struct Q4Rows {
  uint16_t* hi;
  uint16_t* lo;
  float* sums;
  uint16_t* bsum;
  int bk;
};

// Chunk c of row `row` from its 8 values v (valid: c < chunks; the whole warp calls it, for the shuffles).
template <bool H>
__device__ __forceinline__ void q4_chunk(const float (&v)[8], bool valid, int64_t row, int K, int c,
                                         const Q4Rows& o) {
  float sum = 0.0f;
  if (valid) {
    uint32_t h[4], l[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // pair j: elements j and j + 4
      if constexpr (H) {
        asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;" : "=r"(h[j]) : "f"(v[j + 4]), "f"(v[j]));  // j in the low half
        const float2 hf = __half22float2(*reinterpret_cast<const __half2*>(&h[j]));
        sum += hf.x + hf.y;
      } else {
        const __nv_bfloat162 hp = __floats2bfloat162_rn(v[j], v[j + 4]);
        const float2 hf = __bfloat1622float2(hp);
        const __nv_bfloat162 lp = __floats2bfloat162_rn(v[j] - hf.x, v[j + 4] - hf.y);
        const float2 lf = __bfloat1622float2(lp);
        sum += (hf.x + lf.x) + (hf.y + lf.y);
        h[j] = *reinterpret_cast<const uint32_t*>(&hp);
        l[j] = *reinterpret_cast<const uint32_t*>(&lp);
      }
    }
    reinterpret_cast<uint4*>(o.hi + row * K)[c] = make_uint4(h[0], h[1], h[2], h[3]);
    if constexpr (!H) reinterpret_cast<uint4*>(o.lo + row * K)[c] = make_uint4(l[0], l[1], l[2], l[3]);
  }
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  sum += __shfl_xor_sync(0xffffffffu, sum, 2);
  sum += __shfl_xor_sync(0xffffffffu, sum, 4);
  if (valid && (threadIdx.x & 7) == 0) {
    const int g = c / 8;
    o.sums[row * (K / 64) + g] = sum;
    if (o.bsum != nullptr) {
      const __nv_bfloat16 hs = __float2bfloat16_rn(sum);
      const __nv_bfloat16 ls = __float2bfloat16_rn(sum - __bfloat162float(hs));
      uint16_t* d = o.bsum + row * o.bk + (g / 16) * 32 + g % 16;
      d[0] = *reinterpret_cast<const uint16_t*>(&hs);
      d[16] = *reinterpret_cast<const uint16_t*>(&ls);
    }
  }
}

// Chunk c (< chunks, else only the warp's shuffles) of 8 values at src[2 c], src[2 c + 1], converted by q4_chunk as
// chunk `dst` of row `row` (the whole warp calls it).
template <bool H>
__device__ __forceinline__ void q4_chunk_from(const float4* src, int c, int chunks, int64_t row, int K, int dst,
                                              const Q4Rows& o) {
  float v[8] = {};
  if (c < chunks) {
    const float4 a = src[2 * c], b = src[2 * c + 1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  }
  q4_chunk<H>(v, c < chunks, row, K, dst, o);
}

// The bsum row's padding: groups past the last one in their 16-group block, and whole blocks past it (i from
// `first`, step `step`).
__device__ __forceinline__ void q4_bsum_pad(int64_t row, int K, const Q4Rows& o, int first, int step) {
  if (o.bsum == nullptr) return;
  const int groups = K / 64;
  for (int i = first; i < o.bk; i += step)
    if ((i / 32) * 16 + i % 16 >= groups) o.bsum[row * o.bk + i] = 0;
}

template <bool H>
__global__ void __launch_bounds__(32 * kWarps) to_xbf_q4_kernel(const float* x, int64_t rows, int K, Q4Rows o) {
  pdl_wait();
  pdl_trigger();
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int chunks = K / 8;
  const float4* src = reinterpret_cast<const float4*>(x + row * K);
  for (int c0 = 0; c0 < chunks; c0 += 32) q4_chunk_from<H>(src, c0 + lane, chunks, row, K, c0 + lane, o);
  q4_bsum_pad(row, K, o, lane, 32);
}

// rmsnorm (optionally of resid + delta, written back to resid) straight into the exact-code loop's rows: one block
// per row. The norm runs exactly as rmsnorm_vec_kernel<VPT> (elementwise.cu; both through cuda_util.cuh's
// norm_weights_load, norm_row_load and norm_apply), the normed row goes through shared memory to the chunk
// layout, and each chunk is converted as to_xbf_q4 converts it: the same bits as rmsnorm, then to_xbf_q4, without
// the fp32 row's write and re-read and one launch. xn (may be null) receives the normed row as well, and phi / plo
// (may be null) its plain bf16 hi / lo rows (as to_xbf writes them, for a GEMM on the other loops).
template <bool H, int VPT>
__global__ void __launch_bounds__(kNormThreads) rmsnorm_xbf_q4_kernel(const float* x, float* resid,
                                                                      const float* delta,
                                                                      const float* __restrict__ w, float eps,
                                                                      float* xn, int K, Q4Rows o, uint16_t* phi,
                                                                      uint16_t* plo) {
  __shared__ float red[32];
  __shared__ __align__(16) float row_s[4 * kNormThreads * VPT];
  const int n4 = K / 4;
  const int64_t r = blockIdx.x;
  float4 wv[VPT], xv[VPT];
  norm_weights_load<VPT, kNormThreads>(w, K, wv);
  pdl_wait();
  pdl_trigger();
  const float inv = norm_row_load<VPT, kNormThreads>(x, resid, delta, r, K, eps, xv, red);
#pragma unroll
  for (int v = 0; v < VPT; ++v) {
    const int i = threadIdx.x + v * kNormThreads;
    if (i < n4) {
      const float4 ov = norm_apply(xv[v], inv, wv[v]);
      reinterpret_cast<float4*>(row_s)[i] = ov;
      if (xn != nullptr) reinterpret_cast<float4*>(xn + r * K)[i] = ov;
      if (phi != nullptr)
        plain_split(ov, reinterpret_cast<__nv_bfloat162*>(phi + r * K) + 2 * i,
                    reinterpret_cast<__nv_bfloat162*>(plo + r * K) + 2 * i);
    }
  }
  __syncthreads();
  const int lane = threadIdx.x & 31, chunks = K / 8;
  for (int c0 = (threadIdx.x >> 5) * 32; c0 < chunks; c0 += kNormThreads)  // warp-uniform bound: whole groups
    q4_chunk_from<H>(reinterpret_cast<const float4*>(row_s), c0 + lane, chunks, r, K, c0 + lane, o);
  q4_bsum_pad(r, K, o, threadIdx.x, kNormThreads);
}

// The GDN core's gated norm (gdn_gated_norm_kernel's arithmetic, through cuda_util.cuh's gated_norm_head: the same
// bits) straight into the exact-code loop's rows of the output projection's input, as rmsnorm_xbf_q4_kernel does for
// the input norms: block (row, heads h0 .. h0 + kGnHeads - 1) normalises one head per warp into shared memory, then
// converts its stretch of the row chunk by chunk as to_xbf_q4 would (Dv a multiple of 64: a stretch is whole groups).
// The fp32 normed rows are never written nor read back.
constexpr int kGnHeads = 8;
constexpr int kGnPer = 8;  // elements per lane and head: Dv <= 256, as gdn_gated_norm_kernel
template <bool H>
__global__ void __launch_bounds__(32 * kGnHeads) gated_norm_xbf_q4_kernel(const float* y, const float* z,
                                                                          const float* __restrict__ w, float eps,
                                                                          int Hv, int Dv, Q4Rows o) {
  __shared__ __align__(16) float row_s[kGnHeads * 32 * kGnPer];
  pdl_wait();
  pdl_trigger();
  const int64_t r = blockIdx.x;
  const int h0 = blockIdx.y * kGnHeads, nh = min(kGnHeads, Hv - h0);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, K = Hv * Dv;
  if (warp < nh) {
    const int64_t off = r * K + int64_t(h0 + warp) * Dv;
    float v[kGnPer];
    gated_norm_head(y + off, z + off, w, Dv, eps, lane, v);
#pragma unroll
    for (int m = 0; m < kGnPer; ++m)
      if (lane + 32 * m < Dv) row_s[warp * Dv + lane + 32 * m] = v[m];
  }
  __syncthreads();
  const int first = h0 * Dv / 8, chunks = nh * Dv / 8;  // this block's chunks of the row
  for (int c0 = warp * 32; c0 < chunks; c0 += 32 * kGnHeads)  // warp-uniform bound: whole groups
    q4_chunk_from<H>(reinterpret_cast<const float4*>(row_s), c0 + lane, chunks, r, K, first + c0 + lane, o);
  if (blockIdx.y == 0) q4_bsum_pad(r, K, o, threadIdx.x, 32 * kGnHeads);
}

// Writes 1 where the code was compiled with the wgmma instructions (sm_90a), 0 elsewhere.
__global__ void wg_probe_kernel(int* out) { *out = FERN_HAS_WGMMA; }

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

}  // namespace

bool gemm_wg_supported() {
  static std::mutex mu;
  static std::vector<int> known;  // per device: -1 unknown, 0 no, 1 yes
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  std::lock_guard<std::mutex> lock(mu);
  if (static_cast<int>(known.size()) <= dev) known.resize(dev + 1, -1);
  if (known[dev] >= 0) return known[dev] == 1;
  int major = 0, minor = 0;
  bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
            cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess && major == 9 &&
            minor == 0;
  if (ok) {
    int* d = nullptr;
    int h = 0;
    ok = cudaMalloc(&d, sizeof(int)) == cudaSuccess;
    if (ok) {
      wg_probe_kernel<<<1, 1>>>(d);
      ok = cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess && h == 1;
      cudaFree(d);
    }
    (void)cudaGetLastError();  // a missing kernel image is an answer ("no"), not an error for later calls
  }
  known[dev] = ok ? 1 : 0;
  return ok;
}

int gemm_wg_stages() {
  const int i = env_choice("FERN_GEMM_WG_STAGES", {"2", "4"}, -1);
  return i < 0 ? 0 : i == 0 ? 2 : 4;
}

int items_per_block(const char* env, int64_t blocks, int most, int sms) {
  if (const long forced = env_int(env, 1, 64, 0); forced > 0) return static_cast<int>(forced);
  int n = 1;
  while (2 * n <= most && blocks / (2 * n) >= 3 * int64_t(sms)) n *= 2;
  return n;
}

WgPipe gemm_wg_pipe() {
  constexpr WgPipe kPipes[] = {WgPipe::Q4, WgPipe::Q4h, WgPipe::Q4b, WgPipe::Ws, WgPipe::Sync};
  return kPipes[env_choice("FERN_GEMM_WG_PIPE", {"q4", "q4h", "q4b", "ws", "sync"}, 2)];
}

bool gemm_q4_ok(const QW& w) {
  return w.bits == 4 && w.gs > 0 && w.gs % 64 == 0 && w.in > 0 && w.in % 64 == 0 && w.in % w.gs == 0;
}

size_t xbf_bytes(int64_t rows, int64_t K) {
  return 2 * align256(size_t(rows) * size_t(K) * 2) + align256(size_t(rows) * size_t(K / 64) * 4) +
         align256(size_t(rows) * size_t(q4b_sum_width(K)) * 2);
}

X16 xbf_carve(void* ws, int64_t rows, int64_t K, bool q4, bool half, bool bias_mma) {
  // The exact-code loop's producers address x with 32-bit element offsets (gemm_tile_q4.cuh copy_x_chunks).
  FERN_CU_CHECK(rows >= 0 && K > 0 && rows * K < (int64_t(1) << 32), "xbf_carve: x of 2^32 elements or more");
  char* p = static_cast<char*>(ws);
  X16 r;
  const size_t bytes = align256(size_t(rows) * size_t(K) * 2);
  r.x = reinterpret_cast<uint16_t*>(p);
  r.lo = q4 && half ? nullptr : reinterpret_cast<uint16_t*>(p + bytes);
  if (q4) {
    r.sums = reinterpret_cast<float*>(p + 2 * bytes);
    r.ks = K / 64;
    r.q4 = true;
    // The bias tile covers widths up to 4096 (every width of the model); wider rows take the q4 form.
    if (bias_mma && !half && K / 64 <= 64) {
      r.bsum = reinterpret_cast<uint16_t*>(p + 2 * bytes + align256(size_t(rows) * size_t(K / 64) * 4));
      r.bk = q4b_sum_width(K);
    }
  }
  return r;
}

void to_xbf(const Ctx& c, const float* x, int64_t rows, int64_t K, const X16& out) {
  FERN_CU_CHECK(K > 0 && K % 4 == 0 && K < (int64_t(1) << 30), "to_xbf: width must be a positive multiple of 4");
  if (rows <= 0) return;
  const int64_t blocks = (rows + kWarps - 1) / kWarps;
  FERN_CU_CHECK(blocks < (int64_t(1) << 31), "to_xbf: too many rows");
  launch(c, "to_xbf_kernel", to_xbf_kernel, static_cast<unsigned>(blocks), 32 * kWarps, 0, x, rows,
         static_cast<int>(K), out.x, out.lo);
}

namespace {
Q4Rows q4_rows(const X16& out) { return Q4Rows{out.x, out.lo, out.sums, out.bsum, static_cast<int>(out.bk)}; }
void check_q4_rows(int64_t K, const X16& out, const char* who) {
  FERN_CU_CHECK(K > 0 && K % 64 == 0 && K < (int64_t(1) << 30) && out.q4 && out.sums != nullptr && out.ks == K / 64,
                std::string(who) + ": width must be a positive multiple of 64, rows carved for the exact-code loop");
  FERN_CU_CHECK(!out.q4b() || out.bk == q4b_sum_width(K),
                std::string(who) + ": the sums' pieces carved for another width");
}
}  // namespace

void to_xbf_q4(const Ctx& c, const float* x, int64_t rows, int64_t K, const X16& out) {
  check_q4_rows(K, out, "to_xbf_q4");
  if (rows <= 0) return;
  const int64_t blocks = (rows + kWarps - 1) / kWarps;
  FERN_CU_CHECK(blocks < (int64_t(1) << 31), "to_xbf_q4: too many rows");
  launch(c, "to_xbf_q4_kernel", out.q4h() ? to_xbf_q4_kernel<true> : to_xbf_q4_kernel<false>,
         static_cast<unsigned>(blocks), 32 * kWarps, 0, x, rows, static_cast<int>(K), q4_rows(out));
}

bool rmsnorm_xbf_q4_ok(int64_t K) { return K > 0 && K % 64 == 0 && K <= 16 * kNormThreads; }

void rmsnorm_xbf_q4(const Ctx& c, const float* x, float* resid, const float* delta, const float* w, float eps,
                    float* xn, int64_t rows, int64_t K, const X16& out, const X16* plain) {
  check_q4_rows(K, out, "rmsnorm_xbf_q4");
  FERN_CU_CHECK(plain == nullptr || (!plain->q4 && plain->x != nullptr && plain->lo != nullptr),
                "rmsnorm_xbf_q4: plain rows carved for the exact-code loop");
  uint16_t* phi = plain ? plain->x : nullptr;
  uint16_t* plo = plain ? plain->lo : nullptr;
  FERN_CU_CHECK(rmsnorm_xbf_q4_ok(K), "rmsnorm_xbf_q4: width past 4,096");
  FERN_CU_CHECK(rows < (int64_t(1) << 31), "rmsnorm_xbf_q4: too many rows");
  FERN_CU_CHECK((resid == nullptr) == (x != nullptr) && (resid == nullptr || delta != nullptr) && w != nullptr,
                "rmsnorm_xbf_q4: give x, or resid and delta");
  FERN_CU_CHECK(aligned16(x) && aligned16(resid) && aligned16(delta) && aligned16(w) && aligned16(xn),
                "rmsnorm_xbf_q4: rows not 16-byte aligned");
  if (rows <= 0) return;
  const int n4 = static_cast<int>(K / 4);
  const bool h = out.q4h();
  const unsigned grid = static_cast<unsigned>(rows);
  const int k = static_cast<int>(K);
  // The float4s per thread as rmsnorm_vec_kernel's launcher picks them (elementwise.cu launch_norm).
  auto run = [&](auto vpt) {
    constexpr int V = decltype(vpt)::value;
    launch(c, "rmsnorm_xbf_q4_kernel", h ? rmsnorm_xbf_q4_kernel<true, V> : rmsnorm_xbf_q4_kernel<false, V>, grid,
           kNormThreads, 0, x, resid, delta, w, eps, xn, k, q4_rows(out), phi, plo);
  };
  if (n4 <= kNormThreads)
    run(std::integral_constant<int, 1>{});
  else if (n4 <= 2 * kNormThreads)
    run(std::integral_constant<int, 2>{});
  else
    run(std::integral_constant<int, 4>{});
}

bool gated_norm_xbf_q4_ok(int Hv, int Dv) { return Hv > 0 && Dv > 0 && Dv % 64 == 0 && Dv <= 32 * kGnPer; }

void gated_norm_xbf_q4(const Ctx& c, const float* y, const float* z, const float* w, float eps, int Hv, int Dv,
                       int64_t rows, const X16& out) {
  FERN_CU_CHECK(gated_norm_xbf_q4_ok(Hv, Dv), "gated_norm_xbf_q4: head width not a multiple of 64 up to 256");
  const int64_t K = int64_t(Hv) * Dv;
  check_q4_rows(K, out, "gated_norm_xbf_q4");
  FERN_CU_CHECK(y != nullptr && z != nullptr && w != nullptr, "gated_norm_xbf_q4: no rows or no norm weight");
  FERN_CU_CHECK(rows < (int64_t(1) << 31), "gated_norm_xbf_q4: too many rows");
  if (rows <= 0) return;
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>((Hv + kGnHeads - 1) / kGnHeads));
  launch(c, "gated_norm_xbf_q4_kernel", out.q4h() ? gated_norm_xbf_q4_kernel<true> : gated_norm_xbf_q4_kernel<false>,
         grid, 32 * kGnHeads, 0, y, z, w, eps, Hv, Dv, q4_rows(out));
}

}  // namespace fern::cuda
