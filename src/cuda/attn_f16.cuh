// Operand packing shared by the prefill attention kernels (attn_prefill.cu, attn_prefill_wg.cu): fp32 pairs to one
// register of two 16-bit values, and bf16 cache rows to fp16.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace fern::cuda {

// Two floats as one register of 16-bit operands (.x, the low half, = lo). fp16: one cvt with .satfinite (finite
// values past the range become +-65504, NaN stays NaN; sm_80+), cheaper than clamping each value first.
template <bool F16>
__device__ __forceinline__ uint32_t pack16(float lo, float hi) {
  if constexpr (F16) {
    uint32_t r;
    asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));  // first source -> upper half
    return r;
  } else {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

// Eight bf16 values (one 16-byte chunk) to fp16: the bf16 -> fp32 step is exact, then pack16 rounds.
__device__ __forceinline__ uint4 bf16x8_to_f16(uint4 v) {
  uint32_t* w = reinterpret_cast<uint32_t*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) w[i] = pack16<true>(__uint_as_float(w[i] << 16), __uint_as_float(w[i] & 0xffff0000u));
  return v;
}

}  // namespace fern::cuda
