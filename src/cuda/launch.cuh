// Kernel launch through cudaLaunchKernelEx, with the programmatic-dependent-launch attribute when the context
// asks for it (the kernels themselves call pdl_wait()/pdl_trigger(), cuda_util.cuh).
#pragma once
#include <cuda_runtime.h>

#include "cuda/cuda_check.h"
#include "cuda/kernels.h"

namespace fern::cuda {

template <typename... KArgs, typename... Args>
void launch(const Ctx& c, const char* name, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
            Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = c.stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = c.pdl ? 1 : 0;
  check(cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...), name, __FILE__, __LINE__);
}

// Lets `Kernel` use `bytes` of dynamic shared memory (above 48 KB it must be asked for), once per process: the
// attribute stays set, so later launches skip the call. The first call's `bytes` is the limit.
template <auto Kernel>
void allow_dynamic_smem(size_t bytes) {
  static const bool once = [bytes] {
    FERN_CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
    return true;
  }();
  (void)once;
}

}  // namespace fern::cuda
