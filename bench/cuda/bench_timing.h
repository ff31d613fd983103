// Timing for the CUDA micro-benchmarks: one untimed call (warm-up, and any lazy allocation), then `reps` calls each
// bracketed by CUDA events on `stream` (the stream the timed work is enqueued on: the legacy default stream for a
// default cuda::Ctx, the backend's stream for CudaBackend ops); the median in milliseconds.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "cuda/cuda_check.h"

namespace fern::bench {

inline double median_ms(cudaStream_t stream, const std::function<void()>& f, int reps = 7) {
  cudaEvent_t a, b;
  FERN_CUDA_CHECK(cudaEventCreate(&a));
  FERN_CUDA_CHECK(cudaEventCreate(&b));
  f();
  FERN_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    FERN_CUDA_CHECK(cudaEventRecord(a, stream));
    f();
    FERN_CUDA_CHECK(cudaEventRecord(b, stream));
    FERN_CUDA_CHECK(cudaEventSynchronize(b));
    float m = 0;
    FERN_CUDA_CHECK(cudaEventElapsedTime(&m, a, b));
    ms.push_back(m);
  }
  std::sort(ms.begin(), ms.end());
  FERN_CUDA_CHECK(cudaEventDestroy(a));
  FERN_CUDA_CHECK(cudaEventDestroy(b));
  return ms[ms.size() / 2];
}

}  // namespace fern::bench
