// Kernel launch through cudaLaunchKernelEx, with the programmatic-dependent-launch attribute when the context
// asks for it (the kernels themselves call pdl_wait()/pdl_trigger(), cuda_util.cuh).
#pragma once
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <string>

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

// FERN_CUDA_SPREAD (default 0; docs/notes/cuda-decode-v19-spread.md): the decode launches with at most one block's
// work per SM ask for enough dynamic shared memory that a second block of the same kernel cannot fit an SM: "gdn" the
// GDN step (128 blocks), "gemv" the 4-bit GEMVs of 32 lanes per row with one block's work per SM (out_proj, o_proj),
// "1" both. Under PDL such a kernel is launched while the one before still runs, and its blocks take the first
// slots that free up, up to three to an SM (the sixteenth session measured a fused GDN step + out_proj at 16.6 us
// packed that way and 13.1 us spread, docs/notes/cuda-decode-v18-gdn-out.md). A padded block leaves room beside it
// for an unpadded block of another kernel, not for a padded one. Read at every launch, for comparisons; any other
// value is an error.
constexpr size_t kSpreadSmem = 116 * 1024;  // over half of an SM's 228 KB: one block per SM
enum SpreadClass : int { kSpreadGdn = 1, kSpreadGemv = 2 };

inline bool spread_wanted(SpreadClass cls) {
  const char* e = std::getenv("FERN_CUDA_SPREAD");
  if (e == nullptr || std::strcmp(e, "0") == 0) return false;
  if (std::strcmp(e, "1") == 0) return true;
  if (std::strcmp(e, "gdn") == 0) return cls == kSpreadGdn;
  if (std::strcmp(e, "gemv") == 0) return cls == kSpreadGemv;
  raise_error(std::string("FERN_CUDA_SPREAD=") + e + ": expected 0, 1, gdn or gemv");
}

// The dynamic shared memory to launch `Kernel` with: `smem`, or, when its class is spread and the grid has at most
// one block per SM, kSpreadSmem (the kernel uses only its first `smem` bytes).
template <auto Kernel>
size_t spread_smem(const Ctx& c, SpreadClass cls, int64_t blocks, size_t smem) {
  if (!spread_wanted(cls) || blocks > c.sms || smem >= kSpreadSmem) return smem;
  allow_dynamic_smem<Kernel>(kSpreadSmem);
  return kSpreadSmem;
}

}  // namespace fern::cuda
