// Small vectorizable helpers shared by the CPU kernels. `omp simd reduction` lets the compiler reassociate the
// sums (several partial accumulators) without -ffast-math; the order is fixed at compile time, so results are
// deterministic and do not depend on the thread count.
#pragma once
#include <cstdint>

namespace fern::cpu {

inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// y += a * x
inline void axpy(float* y, float a, const float* x, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

inline double sum_squares(const float* x, int64_t n) {
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += double(x[i]) * double(x[i]);
  return s;
}

}  // namespace fern::cpu
