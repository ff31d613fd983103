// bfloat16 <-> float conversion (round to nearest even, NaN kept quiet), usable from host and device code.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FERN_HD __host__ __device__ inline
#else
#define FERN_HD inline
#endif

namespace fern {

FERN_HD float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

FERN_HD uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Rounds a float to the nearest bf16 value and back (what "cast to bf16" means in HF's dtype flow).
FERN_HD float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

}  // namespace fern
