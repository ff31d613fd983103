// The per-op conversion of F32 activation rows to the fp16 rows of gemm_f16.h: one warp per row, two passes (the
// row's largest magnitude, then the scaled conversion; the second pass re-reads the row from L1/L2). Also the
// FERN_GEMM switch.
#include <cuda_fp16.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "core/env.h"
#include "cuda/cuda_util.cuh"
#include "cuda/gemm_f16.h"
#include "cuda/gemm_wg.h"
#include "cuda/launch.cuh"

namespace fern::cuda {
namespace {

constexpr int kWarps = 8;

__global__ void __launch_bounds__(32 * kWarps) to_x16_kernel(const float* __restrict__ x, int64_t rows, int K,
                                                             X16 out) {
  pdl_wait();
  pdl_trigger();
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  const float4* src = reinterpret_cast<const float4*>(x + row * K);
  const int n4 = K / 4;
  float m = 0.0f;
  for (int i = lane; i < n4; i += 32) {
    const float4 v = src[i];
    m = fmaxf(m, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
  }
  m = warp_max(m);
  // m = f 2^ex with f in [0.5, 1): 2^-(ex - 14) brings the row's maximum into [2^13, 2^14). A zero row keeps
  // e = 0; infinities and NaN (propagated anyway) too. The exponent is clamped so that 2^+-e stays a normal float.
  int ex = 0;
  if (m > 0.0f && m <= 3.0e38f) frexpf(m, &ex);
  const int e = m > 0.0f && m <= 3.0e38f ? max(-100, min(100, ex - 14)) : 0;
  const float down = ldexpf(1.0f, -e);
  __half2* dst = reinterpret_cast<__half2*>(out.x + row * K);
  if (out.lo == nullptr) {
    for (int i = lane; i < n4; i += 32) {
      const float4 v = src[i];
      dst[2 * i] = __floats2half2_rn(v.x * down, v.y * down);
      dst[2 * i + 1] = __floats2half2_rn(v.z * down, v.w * down);
    }
  } else {
    // hi, lo = fp16(x' - hi), and per 16-wide segment (4 float4s: 4 neighbouring lanes) the fp32 sum of x'.
    __half2* dlo = reinterpret_cast<__half2*>(out.lo + row * K);
    float* sums = out.sums + row * out.ks;
    for (int i0 = 0; i0 < n4; i0 += 32) {  // n4 is a multiple of 4: a segment's lanes are all in or all out
      const int i = i0 + lane;
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (i < n4) v = src[i];
      v.x *= down, v.y *= down, v.z *= down, v.w *= down;
      float sum = (v.x + v.y) + (v.z + v.w);
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      if (i < n4) {
        const __half2 h0 = __floats2half2_rn(v.x, v.y), h1 = __floats2half2_rn(v.z, v.w);
        dst[2 * i] = h0;
        dst[2 * i + 1] = h1;
        const float2 f0 = __half22float2(h0), f1 = __half22float2(h1);
        dlo[2 * i] = __floats2half2_rn(v.x - f0.x, v.y - f0.y);
        dlo[2 * i + 1] = __floats2half2_rn(v.z - f1.x, v.w - f1.y);
        if ((lane & 3) == 0) sums[i / 4] = sum;
      }
    }
    for (int j = K / 16 + lane; j < out.ks; j += 32) sums[j] = 0.0f;
  }
  if (lane == 0) out.scale[row] = ldexpf(1.0f, e);
}

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

int64_t sum_stride(int64_t K) { return 4 * ((K + 63) / 64); }

}  // namespace

size_t x16_bytes(int64_t rows, int64_t K, bool precise) {
  const size_t half_rows = align256(size_t(rows) * size_t(K) * 2), scales = align256(size_t(rows) * 4);
  if (!precise) return half_rows + scales;
  return 2 * half_rows + scales + align256(size_t(rows) * size_t(sum_stride(K)) * 4);
}

X16 x16_carve(void* ws, int64_t rows, int64_t K, bool precise) {
  char* p = static_cast<char*>(ws);
  const size_t half_rows = align256(size_t(rows) * size_t(K) * 2), scales = align256(size_t(rows) * 4);
  X16 r;
  r.x = reinterpret_cast<uint16_t*>(p);
  r.scale = reinterpret_cast<float*>(p + half_rows);
  if (precise) {
    r.lo = reinterpret_cast<uint16_t*>(p + half_rows + scales);
    r.sums = reinterpret_cast<float*>(p + 2 * half_rows + scales);
    r.ks = sum_stride(K);
  }
  return r;
}

GemmMode gemm_mode() {
  switch (env_choice("FERN_GEMM", {"split", "fp16", "fp16x2", "wg"}, -1)) {
    case 0: return GemmMode::Split;
    case 1: return GemmMode::Fp16;
    case 2: return GemmMode::Fp16x2;
    case 3:
      if (!gemm_wg_supported())
        raise_error("FERN_GEMM=wg: needs a compute-capability 9.0 GPU and a build with sm_90a (FERN_CUDA_ARCHS)");
      return GemmMode::Wg;
    default: return gemm_wg_supported() ? GemmMode::Wg : GemmMode::Split;
  }
}

void to_x16(const Ctx& c, const float* x, int64_t rows, int64_t K, const X16& out) {
  FERN_CU_CHECK(K > 0 && K % (out.lo != nullptr ? 16 : 4) == 0 && K < (int64_t(1) << 30),
                "to_x16: width must be a positive multiple of 4 (16 for the precise form)");
  if (rows <= 0) return;
  const int64_t blocks = (rows + kWarps - 1) / kWarps;
  FERN_CU_CHECK(blocks < (int64_t(1) << 31), "to_x16: too many rows");
  launch(c, "to_x16_kernel", to_x16_kernel, static_cast<unsigned>(blocks), 32 * kWarps, 0, x, rows,
         static_cast<int>(K), out);
}

}  // namespace fern::cuda
