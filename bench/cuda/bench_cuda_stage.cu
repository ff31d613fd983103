// What a decode kernel pays before it can start on its weights, in a chain of PDL launches (the decode step is ~200
// such launches): the launch itself, and every block reading the same activation row from L2 (a GEMV's input, the
// MoE's input and h). docs/notes/cuda-decode-v5.md measured those row reads at ~2 us in the fused MoE kernel and
// suspected the L2 lines that all blocks request at once; docs/notes/cuda-decode-v10-tc.md asks the same of the GEMVs.
// Kernels (each a graph of 64 back-to-back launches with PDL, median of 7 replays, per launch):
//  - empty: wait for the predecessor, one store per block, trigger the successor;
//  - row: every block reads the K-float row through L2 into shared memory, adds it up, one store per block;
//  - multicast: blocks in clusters of C; rank 0 copies the row once (cp.async.bulk ... multicast::cluster) into the
//    shared memory of all C blocks, which wait on their own mbarrier.
// And what a cold burst of weight bytes costs by itself (the fused MoE's expert rows are one such burst of ~14 MB:
// docs/notes/cuda-decode-v15-topk.md measured ~7.3 us, ~2 TB/s): launches that each read B bytes never read by the
// launches around them (a graph of 64 reads 64 regions, at least 64 B, far past the 50 MB L2), waiting for the previous launch first and
// releasing the next one last, so that they do not overlap:
//  - burst ldg: every warp of 132 x 512 threads issues L 16-byte loads per lane (512-byte pieces, the warps
//    interleaved as the fused MoE's) before using any;
//  - burst bulk: one thread per block asks the copy engine for the block's share in 16 KB bulk copies into shared
//    memory (cp.async.bulk), the block waits on one mbarrier.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <type_traits>
#include <vector>

#include "bench_launch.h"
#include "bench_timing.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_util.cuh"
#include "cuda/ptx.cuh"

using namespace fern;
using namespace fern::cuda;

namespace {

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
    ptx::mbar_init(&bar, 1);
    ptx::mbar_init_fence();
  }
  // Every block's barrier exists before rank 0's copy may signal it.
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
  if (threadIdx.x == 0) ptx::mbar_arrive_expect_tx(&bar, bytes);
  pdl_wait();
  if (rank == 0 && threadIdx.x == 0) {
    const uint16_t mask = static_cast<uint16_t>((1u << nct) - 1);
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1], %2, [%3], "
        "%4;" ::"r"(ptx::smem_addr(xs)),
        "l"(x), "r"(bytes), "r"(ptx::smem_addr(&bar)), "h"(mask)
        : "memory");
  }
  ptx::mbar_wait(&bar, 0);
  pdl_trigger();
  float s = 0.0f;
  for (int f = threadIdx.x; f < K / 4; f += blockDim.x) s += xs[f].x + xs[f].y + xs[f].z + xs[f].w;
  s = block_sum(s, red);
  if (threadIdx.x == 0) out[blockIdx.x] = s;
  // No block leaves while a copy into its cluster may still be arriving elsewhere.
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

// The end of a burst kernel: the XOR of everything loaded decides a store that never happens (so that no load is
// dropped), then the block releases the next launch.
template <int L>
__device__ __forceinline__ void use_and_release(const uint4 (&v)[L], float* out) {
  uint32_t x = 0;
#pragma unroll
  for (int i = 0; i < L; ++i) x ^= v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
  if (x == 0x9e3779b9u) out[blockIdx.x] = 1.0f;
  __syncthreads();
  pdl_trigger();
}

// L loads per lane of a 512-byte piece each, all issued before any is used (weights: the no-allocate stream load of
// the decode kernels).
template <int L>
__global__ void __launch_bounds__(512) burst_ldg_kernel(const uint4* region, float* out) {
  pdl_wait();
  const int warps = gridDim.x * (blockDim.x / 32);
  const int w = (threadIdx.x >> 5) * gridDim.x + blockIdx.x;  // block index fastest, as in the fused MoE
  const int lane = threadIdx.x & 31;
  uint4 v[L];
#pragma unroll
  for (int i = 0; i < L; ++i) v[i] = ld_stream(region + (int64_t(i) * warps + w) * 32 + lane);
  use_and_release(v, out);
}

// The same burst split into `segs` segments, each at the start of a 2 MB page picked by a hash of (salt, segment)
// among `pages` pages of a pool: the fused MoE's expert rows come from ~80 arrays of 32-512 KB spread over the
// layer's 453 MB of experts (18 GB for the model), so each launch may also pay for address translations that a
// contiguous burst does not. The page choice is arithmetic, so that no dependent load precedes the burst; that
// arithmetic (a division and a modulo per load) is itself measured by the one-segment row against the plain burst
// (docs/notes/cuda-decode-v22-fastdiv.md: 5.94 against 4.59 us for 14 MB, while 80 scattered pages cost ~0.1 us).
template <int L>
__global__ void __launch_bounds__(512) burst_scatter_kernel(const char* pool, uint32_t pages, int per_seg,
                                                           uint32_t salt, float* out) {
  pdl_wait();
  const int warps = gridDim.x * (blockDim.x / 32);
  const int w = (threadIdx.x >> 5) * gridDim.x + blockIdx.x;
  const int lane = threadIdx.x & 31;
  uint4 v[L];
#pragma unroll
  for (int i = 0; i < L; ++i) {
    const int p = i * warps + w, seg = p / per_seg, off = p - seg * per_seg;
    const uint32_t page = (uint32_t(seg) * 2654435761u + salt * 40503u + (salt >> 3) * 977u) % pages;
    v[i] = ld_stream(reinterpret_cast<const uint4*>(pool + (int64_t(page) << 21) + int64_t(off) * 512) + lane);
  }
  use_and_release(v, out);
}

[[maybe_unused]] constexpr uint32_t kBulkPiece = 16 * 1024;

// The block's `bytes` (a multiple of kBulkPiece, at most the dynamic shared memory) by bulk copies on one mbarrier.
__global__ void burst_bulk_kernel(const char* region, uint32_t bytes, float* out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char buf[];
  __shared__ alignas(8) uint64_t bar;
  pdl_wait();
  if (threadIdx.x == 0) {
    ptx::mbar_init(&bar, 1);
    ptx::mbar_init_fence();
    ptx::mbar_arrive_expect_tx(&bar, bytes);
    const char* src = region + int64_t(blockIdx.x) * bytes;
    for (uint32_t off = 0; off < bytes; off += kBulkPiece) ptx::bulk_copy_g2s(buf + off, src + off, kBulkPiece, &bar);
  }
  __syncthreads();  // the barrier is initialised before anyone waits on it
  ptx::mbar_wait(&bar, 0);
  const uint32_t x = reinterpret_cast<const uint32_t*>(buf)[threadIdx.x] ^
                     reinterpret_cast<const uint32_t*>(buf + bytes - 4 * blockDim.x)[threadIdx.x];
  if (x == 0x9e3779b9u) out[blockIdx.x] = 1.0f;
  __syncthreads();
  pdl_trigger();
#endif
}

// Every launch here takes PDL (as the engine's), a cluster where asked.
template <typename... KArgs, typename... Args>
void launch_k(cudaStream_t s, void (*k)(KArgs...), int grid, int threads, size_t smem, int cluster, Args... args) {
  bench::launch_ex(s, k, grid, threads, smem, cluster, true, args...);
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
  // Cold bursts: launch i of the 64 reads region i of a buffer holding 64 of the largest burst.
  int major = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  constexpr int kWarpsPerBlock = 16, kMaxL = 16;
  const size_t piece = size_t(sms) * kWarpsPerBlock * 512;  // bytes per load per lane over the grid
  constexpr uint32_t kMaxBulk = 208 * 1024;  // bytes per block of the largest bulk burst
  const size_t max_burst = std::max(piece * kMaxL, size_t(kMaxBulk) * sms);  // the stride between regions
  char* pool = nullptr;
  FERN_CUDA_CHECK(cudaMalloc(&pool, max_burst * 64));
  FERN_CUDA_CHECK(cudaMemset(pool, 0x5a, max_burst * 64));
  std::printf("\n== cold bursts, one launch after another (us per launch, median of 7 graph replays of 64) ==\n");
  std::printf("%-34s %10s %8s %8s\n", "kernel", "MB", "us", "GB/s");
  const double empty_us =
      per_launch_us(s, [&] { launch_k(s, empty_kernel, sms, 512, 0, 1, out); });
  std::printf("%-34s %10s %8.2f %8s\n", "empty, 512 threads", "-", empty_us, "-");
  auto row = [&](const char* name, size_t bytes, double us) {
    std::printf("%-34s %10.2f %8.2f %8.0f\n", name, bytes / 1e6, us, bytes / 1e3 / us);
  };
  auto ldg = [&](auto lc) {
    constexpr int L = decltype(lc)::value;
    const size_t bytes = piece * L;
    int i = 0;
    const double us = per_launch_us(s, [&] {
      launch_k(s, burst_ldg_kernel<L>, sms, 32 * kWarpsPerBlock, 0, 1,
               reinterpret_cast<const uint4*>(pool + (i++ % 64) * max_burst), out);
    });
    row("burst ldg, 512 threads x 1 per SM", bytes, us);
  };
  ldg(std::integral_constant<int, 2>{});
  ldg(std::integral_constant<int, 4>{});
  ldg(std::integral_constant<int, 8>{});
  ldg(std::integral_constant<int, 13>{});
  ldg(std::integral_constant<int, 16>{});
  if (major >= 9) {
    FERN_CUDA_CHECK(cudaFuncSetAttribute(burst_bulk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxBulk));
    for (uint32_t per_block : {16u << 10, 32u << 10, 64u << 10, 112u << 10, kMaxBulk}) {
      const size_t bytes = size_t(per_block) * sms;
      int i = 0;
      const double us = per_launch_us(s, [&] {
        launch_k(s, burst_bulk_kernel, sms, 128, per_block, 1, pool + (i++ % 64) * max_burst, per_block, out);
      });
      row("burst bulk, 16 KB copies", bytes, us);
    }
  }
  FERN_CUDA_CHECK(cudaFree(pool));
  // Address translation: a 14 MB burst (L = 13) as one contiguous region or as segments on hashed 2 MB pages of a
  // 16 GB pool (the model's experts span 18 GB) or of a 1 GB one; each launch its own pages (salt).
  {
    constexpr int L = 13;
    const size_t big = size_t(16) << 30;
    char* tp = nullptr;
    if (cudaMalloc(&tp, big) == cudaSuccess) {
      FERN_CUDA_CHECK(cudaMemset(tp, 0x33, big));
      const int pieces = L * sms * kWarpsPerBlock;
      std::printf("\n== address translation: a %.1f MB burst in segments on hashed 2 MB pages ==\n",
                  pieces * 512 / 1e6);
      std::printf("%-34s %10s %8s %8s\n", "segments x KB, pool", "MB", "us", "GB/s");
      for (uint32_t pages : {8192u, 512u}) {
        for (int segs : {1, 9, 80, 160}) {
          const int per_seg = (pieces + segs - 1) / segs;
          if (size_t(per_seg) * 512 > (size_t(2) << 20) && segs > 1) continue;  // a segment within its page
          // One segment: a contiguous region starting on a hashed page (it runs over the pages after it).
          const uint32_t np = segs == 1 ? pages - 8 : pages;
          uint32_t salt = 0;
          const double us = per_launch_us(s, [&] {
            launch_k(s, burst_scatter_kernel<L>, sms, 32 * kWarpsPerBlock, 0, 1, tp, np, per_seg, ++salt, out);
          });
          char name[64];
          std::snprintf(name, sizeof name, "%3d x %4d KB, %s", segs, per_seg / 2, pages == 8192 ? "16 GB" : "1 GB");
          row(name, size_t(pieces) * 512, us);
        }
      }
      FERN_CUDA_CHECK(cudaFree(tp));
    } else {
      (void)cudaGetLastError();
      std::printf("\n(address translation rows skipped: no 16 GB free)\n");
    }
  }
  FERN_CUDA_CHECK(cudaGetLastError());
  FERN_CUDA_CHECK(cudaFree(x));
  FERN_CUDA_CHECK(cudaFree(out));
  return 0;
}
