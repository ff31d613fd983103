// What a decode kernel pays before it can start on its weights, in a chain of PDL launches (the decode step is ~200
// such launches): the launch itself, and every block reading the same activation row from L2 (a GEMV's input, the
// MoE's input and h). docs/notes/cuda-decode-v5.md measured those row reads at ~2 us in the fused MoE kernel and
// suspected the L2 lines that all blocks request at once; docs/notes/cuda-decode-v10-tc.md asks the same of the GEMVs.
// Kernels (each a graph of 64 back-to-back launches with PDL, median of 7 replays, per launch):
//  - empty: wait for the predecessor, one store per block, trigger the successor;
//  - row: every block reads the K-float row through L2 into shared memory, adds it up, one store per block;
//  - multicast: blocks in clusters of C; rank 0 copies the row once (cp.async.bulk ... multicast::cluster) into the
//    shared memory of all C blocks, which wait on their own mbarrier.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "bench_timing.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_util.cuh"

using namespace fern;
using namespace fern::cuda;

namespace {

[[maybe_unused]] __device__ __forceinline__ uint32_t saddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__global__ void empty_kernel(float* out) {
  pdl_wait();
  if (threadIdx.x == 0) out[blockIdx.x] = float(blockIdx.x);
  pdl_trigger();
}

__global__ void row_kernel(const float* x, int K, float* out) {
  extern __shared__ float4 xs[];
  __shared__ float red[32];
  pdl_wait();
  const float4* x4 = reinterpret_cast<const float4*>(x);
  for (int f = threadIdx.x; f < K / 4; f += blockDim.x) xs[f] = __ldcg(x4 + f);
  __syncthreads();
  pdl_trigger();
  float s = 0.0f;
  for (int f = threadIdx.x; f < K / 4; f += blockDim.x) s += xs[f].x + xs[f].y + xs[f].z + xs[f].w;
  s = block_sum(s, red);
  if (threadIdx.x == 0) out[blockIdx.x] = s;
}

__global__ void multicast_kernel(const float* x, int K, float* out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // clusters and bulk copies: sm_90+ (main() skips it below)
  extern __shared__ float4 xs[];
  __shared__ float red[32];
  __shared__ alignas(8) uint64_t bar;
  uint32_t rank, nct;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(nct));
  const uint32_t bytes = uint32_t(K) * 4;
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(saddr(&bar)));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  // Every block's barrier exists before rank 0's copy may signal it.
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
  if (threadIdx.x == 0)
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(saddr(&bar)), "r"(bytes) : "memory");
  pdl_wait();
  if (rank == 0 && threadIdx.x == 0) {
    const uint16_t mask = static_cast<uint16_t>((1u << nct) - 1);
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1], %2, [%3], "
        "%4;" ::"r"(saddr(xs)),
        "l"(x), "r"(bytes), "r"(saddr(&bar)), "h"(mask)
        : "memory");
  }
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\nselp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(saddr(&bar))
        : "memory");
  }
  pdl_trigger();
  float s = 0.0f;
  for (int f = threadIdx.x; f < K / 4; f += blockDim.x) s += xs[f].x + xs[f].y + xs[f].z + xs[f].w;
  s = block_sum(s, red);
  if (threadIdx.x == 0) out[blockIdx.x] = s;
  // No block leaves while a copy into its cluster may still be arriving elsewhere.
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

template <typename... KArgs, typename... Args>
void launch_k(cudaStream_t s, void (*k)(KArgs...), int grid, int threads, size_t smem, int cluster, Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  int n = 1;
  if (cluster > 1) {
    attr[1].id = cudaLaunchAttributeClusterDimension;
    attr[1].val.clusterDim.x = cluster;
    attr[1].val.clusterDim.y = 1;
    attr[1].val.clusterDim.z = 1;
    n = 2;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  FERN_CUDA_CHECK(cudaLaunchKernelEx(&cfg, k, static_cast<KArgs>(args)...));
}

template <typename F>
double per_launch_us(cudaStream_t s, F body, int launches = 64, int reps = 7) {
  body();
  FERN_CUDA_CHECK(cudaStreamSynchronize(s));
  return bench::graph_median_ms(s, [&] {
    for (int i = 0; i < launches; ++i) body();
  }, reps) * 1e3 / launches;
}

}  // namespace

int main() {
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    std::printf("no CUDA device\n");
    return 0;
  }
  cudaStream_t s;
  FERN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float *x = nullptr, *out = nullptr;
  FERN_CUDA_CHECK(cudaMalloc(&x, 8192 * 4));
  FERN_CUDA_CHECK(cudaMalloc(&out, 4096 * 4));
  std::vector<float> hx(8192);
  for (int i = 0; i < 8192; ++i) hx[i] = float((i * 37) % 101) / 101.0f - 0.5f;
  FERN_CUDA_CHECK(cudaMemcpy(x, hx.data(), 8192 * 4, cudaMemcpyHostToDevice));
  std::printf("== per-launch cost in a PDL chain of 64 launches (us, median of 7 graph replays), %d SMs ==\n", sms);
  std::printf("%-34s %8s %8s %8s\n", "kernel", "blocks", "K", "us");
  for (int threads : {256, 512}) {
    for (int blocks : {sms, 2 * sms}) {
      if (threads == 512 && blocks > sms) continue;
      std::printf("%-34s %8d %8s %8.2f\n", threads == 256 ? "empty, 256 threads" : "empty, 512 threads", blocks, "-",
                  per_launch_us(s, [&] { launch_k(s, empty_kernel, blocks, threads, 0, 1, out); }));
    }
  }
  for (int K : {2048, 4096}) {
    for (int blocks : {sms, 2 * sms, 4 * sms}) {
      std::printf("%-34s %8d %8d %8.2f\n", "row through L2, 256 threads", blocks, K,
                  per_launch_us(s, [&] { launch_k(s, row_kernel, blocks, 256, size_t(K) * 4, 1, x, K, out); }));
    }
    int major = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    for (int cl : {2, 4, 8}) {
      if (major < 9) break;
      const int blocks = (2 * sms) / cl * cl;
      char name[64];
      std::snprintf(name, sizeof name, "multicast, clusters of %d", cl);
      std::printf("%-34s %8d %8d %8.2f\n", name, blocks, K,
                  per_launch_us(s, [&] { launch_k(s, multicast_kernel, blocks, 256, size_t(K) * 4, cl, x, K, out); }));
    }
  }
  FERN_CUDA_CHECK(cudaGetLastError());
  FERN_CUDA_CHECK(cudaFree(x));
  FERN_CUDA_CHECK(cudaFree(out));
  return 0;
}
