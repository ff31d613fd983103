// Division of non-negative 31-bit integers by a divisor fixed at launch, as one wide multiply and a shift.
//
// Why: a `/` by a runtime int is ~20 instructions of SASS, and a decode kernel pays it before the loads that depend
// on it: bench_cuda_stage measured a 14 MB burst whose addresses took a division and a modulo per load at 5.9 us
// against 4.6 us for the same burst with shifts and adds (docs/notes/cuda-decode-v22-fastdiv.md). The fused MoE
// (moe_fused.cu) divides task and item indices by the experts' width and chunk count before its row loads.
//
// The method (round-up reciprocal; Hacker's Delight 10-8 for N-bit dividends, here N = 31): with l = ceil(log2 d)
// and m = ceil(2^(31 + l) / d) = (2^(31 + l) + e) / d, 0 <= e < d, n m / 2^(31 + l) = n / d + e n / (d 2^(31 + l)),
// and the second term is below 2^-l <= 1 / d for n < 2^31, so the floor is floor(n / d). d > 2^(l - 1) keeps m
// below 2^32; the product needs 63 bits: one 32 x 32 -> 64 multiply.
#pragma once

#include <cuda_runtime.h>  // __host__ __device__ in host-only translation units too

#include <cstdint>

namespace fern::cuda {

struct FastDiv {
  uint32_t d = 1;   // the divisor
  uint32_t m = 0;   // ceil(2^(31 + l) / d)
  uint32_t sh = 0;  // 31 + l

  FastDiv() = default;
  // A divisor outside [1, 2^31) leaves the object invalid (ok() false; no exception: this header is compiled by nvcc,
  // which cannot take core/error.h's fmt), for the caller to refuse.
  explicit FastDiv(int64_t divisor) {
    if (divisor < 1 || divisor >= (int64_t(1) << 31)) return;
    d = static_cast<uint32_t>(divisor);
    uint32_t l = 0;
    while ((uint64_t(1) << l) < d) ++l;
    const uint64_t p = uint64_t(1) << (31 + l);
    m = static_cast<uint32_t>((p + d - 1) / d);
    sh = 31 + l;
  }

  bool ok() const { return m != 0; }
  // floor(n / d) for 0 <= n < 2^31.
  __host__ __device__ int div(int n) const {
    return static_cast<int>((uint64_t(static_cast<uint32_t>(n)) * m) >> sh);
  }
  // n mod d for 0 <= n < 2^31.
  __host__ __device__ int mod(int n) const { return n - div(n) * static_cast<int>(d); }
};

}  // namespace fern::cuda
