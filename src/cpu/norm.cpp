// RMSNorm and the scalar activations shared by the other op families.
#include <cmath>

#include "cpu/cpu_ops.h"
#include "cpu/simd.h"

namespace fern::cpu {

float silu(float x) { return x / (1.0f + std::exp(-x)); }
float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

void rmsnorm(float* out, const float* x, const float* w, int64_t R, int64_t D, float eps, int nt) {
#pragma omp parallel for num_threads(nt) schedule(static) if (R > 1)
  for (int64_t r = 0; r < R; ++r) {
    const float* xr = x + r * D;
    float* o = out + r * D;
    // The mean of squares in double, then one fp32 rsqrt factor, as fp32 frameworks do up to their rounding.
    const float inv = static_cast<float>(1.0 / std::sqrt(sum_squares(xr, D) / double(D) + double(eps)));
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) o[d] = xr[d] * inv * w[d];
  }
}

}  // namespace fern::cpu
