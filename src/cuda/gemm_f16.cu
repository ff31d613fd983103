// The per-op conversion of F32 activation rows to the fp16 rows of gemm_f16.h: one warp per row, two passes (the
// row's largest magnitude, then the scaled conversion; the second pass re-reads the row from L1/L2).
#include <cuda_fp16.h>

#include "cuda/cuda_util.cuh"
#include "cuda/gemm_f16.h"
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
  for (int i = lane; i < n4; i += 32) {
    const float4 v = src[i];
    dst[2 * i] = __floats2half2_rn(v.x * down, v.y * down);
    dst[2 * i + 1] = __floats2half2_rn(v.z * down, v.w * down);
  }
  if (lane == 0) out.scale[row] = ldexpf(1.0f, e);
}

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

}  // namespace

size_t x16_bytes(int64_t rows, int64_t K) {
  return align256(size_t(rows) * size_t(K) * 2) + align256(size_t(rows) * 4);
}

X16 x16_carve(void* ws, int64_t rows, int64_t K) {
  X16 r;
  r.x = static_cast<uint16_t*>(ws);
  r.scale = reinterpret_cast<float*>(static_cast<char*>(ws) + align256(size_t(rows) * size_t(K) * 2));
  return r;
}

void to_x16(const Ctx& c, const float* x, int64_t rows, int64_t K, const X16& out) {
  FERN_CU_CHECK(K > 0 && K % 4 == 0 && K < (int64_t(1) << 30), "to_x16: width must be a positive multiple of 4");
  if (rows <= 0) return;
  const int64_t blocks = (rows + kWarps - 1) / kWarps;
  FERN_CU_CHECK(blocks < (int64_t(1) << 31), "to_x16: too many rows");
  launch(c, "to_x16_kernel", to_x16_kernel, static_cast<unsigned>(blocks), 32 * kWarps, 0, x, rows,
         static_cast<int>(K), out);
}

}  // namespace fern::cuda
