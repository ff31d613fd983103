// Small vectorizable helpers shared by the CPU kernels. `omp simd reduction` lets the compiler reassociate the
// sums (several partial accumulators) without -ffast-math; the order is fixed at compile time, so results are
// deterministic and do not depend on the thread count.
#pragma once
#include <cstdint>

// Hot kernels are compiled twice, for x86-64-v3 (AVX2 with FMA: the `avx2` target alone has no FMA) and for the
// baseline, and the loader picks one at start-up (GCC function multiversioning), so the build needs no -march flag.
// Their helpers must be inlined to get the x86-64-v3 code too.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define FERN_CPU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define FERN_CPU_CLONES
#endif
#define FERN_CPU_INLINE inline __attribute__((always_inline))

namespace fern::cpu {

// Multiply-adds below which a parallel region costs more than it saves (tens of microseconds of arithmetic): each
// region ends in a barrier that waits for every thread to be scheduled, which on a loaded machine takes long.
constexpr int64_t kParallelWork = int64_t(1) << 18;

FERN_CPU_INLINE float dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// y += a * x
FERN_CPU_INLINE void axpy(float* y, float a, const float* x, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

FERN_CPU_INLINE double sum_squares(const float* x, int64_t n) {
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += double(x[i]) * double(x[i]);
  return s;
}

}  // namespace fern::cpu
