// cudaLaunchKernelEx with the two attributes the CUDA micro-benchmarks vary: programmatic dependent launch (the
// engine's launches all take it) and a cluster of `cluster` blocks along x (> 1; sm_90+).
#pragma once
#include <cuda_runtime.h>

#include "cuda/cuda_check.h"

namespace fern::bench {

template <typename... KArgs, typename... Args>
void launch_ex(cudaStream_t s, void (*k)(KArgs...), int grid, int threads, size_t smem, int cluster, bool pdl,
               Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[2];
  int n = 0;
  if (pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (cluster > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = static_cast<unsigned>(cluster);
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  FERN_CUDA_CHECK(cudaLaunchKernelEx(&cfg, k, static_cast<KArgs>(args)...));
}

}  // namespace fern::bench
