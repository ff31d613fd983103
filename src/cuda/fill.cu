// Deterministic random fills on the GPU (a counter-based hash, so any element can be generated independently):
// used to build large random test and benchmark models straight into device memory without a host copy.
#include "cuda/cuda_util.cuh"
#include "cuda/fill.h"

namespace fern::cuda {
namespace {

__device__ __forceinline__ uint32_t hash32(uint64_t i, uint64_t seed) {
  uint64_t z = i * 0x9E3779B97F4A7C15ull + seed * 0xD1B54A32D192ED03ull + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return static_cast<uint32_t>((z ^ (z >> 31)) >> 16);
}

__device__ __forceinline__ float uniform(uint64_t i, uint64_t seed, float lo, float hi) {
  return lo + (hi - lo) * (float(hash32(i, seed) >> 8) * (1.0f / 16777216.0f));
}

__global__ void fill_u32_kernel(uint32_t* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = hash32(i, seed);
}

__global__ void fill_bf16_kernel(uint16_t* p, int64_t n, uint64_t seed, float lo, float hi, bool random_sign) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float v = uniform(i, seed, lo, hi);
    if (random_sign && (hash32(i, seed ^ 0x5555) & 1)) v = -v;
    p[i] = f32_to_bf16(v);
  }
}

__global__ void fill_f32_kernel(float* p, int64_t n, uint64_t seed, float lo, float hi) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = uniform(i, seed, lo, hi);
}

int blocks_for(int64_t n) { return static_cast<int>(std::min<int64_t>((n + 255) / 256, 4096)); }

}  // namespace

void fill_random_u32(cudaStream_t s, uint32_t* p, int64_t n, uint64_t seed) {
  if (n <= 0) return;
  fill_u32_kernel<<<blocks_for(n), 256, 0, s>>>(p, n, seed);
  FERN_CUDA_LAUNCH_CHECK("fill_u32_kernel");
}

void fill_random_bf16(cudaStream_t s, uint16_t* p, int64_t n, uint64_t seed, float lo, float hi, bool random_sign) {
  if (n <= 0) return;
  fill_bf16_kernel<<<blocks_for(n), 256, 0, s>>>(p, n, seed, lo, hi, random_sign);
  FERN_CUDA_LAUNCH_CHECK("fill_bf16_kernel");
}

void fill_random_f32(cudaStream_t s, float* p, int64_t n, uint64_t seed, float lo, float hi) {
  if (n <= 0) return;
  fill_f32_kernel<<<blocks_for(n), 256, 0, s>>>(p, n, seed, lo, hi);
  FERN_CUDA_LAUNCH_CHECK("fill_f32_kernel");
}

}  // namespace fern::cuda
