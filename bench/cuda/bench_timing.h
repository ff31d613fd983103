// Timing for the CUDA micro-benchmarks: one untimed call (warm-up, and any lazy allocation), then `reps` calls each
// bracketed by CUDA events on `stream` (the stream the timed work is enqueued on: the legacy default stream for a
// default cuda::Ctx, the backend's stream for CudaBackend ops); the median in milliseconds.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "cuda/cuda_check.h"

namespace fern::bench {

// The row counts a micro-benchmark times: `defaults`, or the comma-separated list in FERN_BENCH_TS (profiling one
// shape with Nsight Compute without counting the launches of the others, e.g. FERN_BENCH_TS=8192). An entry that is
// not a positive whole number ends the program with a message: a typo must not silently time the defaults.
inline std::vector<int> bench_rows(std::vector<int> defaults) {
  const char* env = std::getenv("FERN_BENCH_TS");
  if (env == nullptr || env[0] == '\0') return defaults;
  std::vector<int> rows;
  const std::string list(env);
  for (size_t pos = 0; pos <= list.size();) {
    const size_t comma = std::min(list.find(',', pos), list.size());
    const std::string item = list.substr(pos, comma - pos);
    char* end = nullptr;
    const long t = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || t < 1 || t > (1L << 20)) {
      std::fprintf(stderr, "FERN_BENCH_TS=%s: '%s' is not a row count (1 .. 1048576, comma-separated)\n", env,
                   item.c_str());
      std::exit(2);
    }
    rows.push_back(int(t));
    pos = comma + 1;
  }
  return rows;
}

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

// `body` captured once into a CUDA graph on `stream` (before_end, if given, runs inside the capture after it: e.g. a
// backend joining its side streams), then the median milliseconds of the graph's replays (median_ms).
inline double graph_median_ms(cudaStream_t stream, const std::function<void()>& body, int reps = 7,
                              const std::function<void()>& before_end = {}) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  FERN_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  body();
  if (before_end) before_end();
  FERN_CUDA_CHECK(cudaStreamEndCapture(stream, &g));
  FERN_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
  const double ms = median_ms(stream, [&] { FERN_CUDA_CHECK(cudaGraphLaunch(ge, stream)); }, reps);
  FERN_CUDA_CHECK(cudaGraphExecDestroy(ge));
  FERN_CUDA_CHECK(cudaGraphDestroy(g));
  return ms;
}

}  // namespace fern::bench
