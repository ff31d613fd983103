// Deterministic random fills of device memory, and a random model of any configuration built directly on the GPU
// (MLX layout: 4-bit group 64, router and shared-expert gate 8-bit). The values are random but not those of
// `fern synth`; they are for benchmarks and tests that need the real sizes without a 19.5 GB host copy.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace fern::cuda {

void fill_random_u32(cudaStream_t s, uint32_t* p, int64_t n, uint64_t seed);
// Uniform in [lo, hi), negated with probability 1/2 when random_sign.
void fill_random_bf16(cudaStream_t s, uint16_t* p, int64_t n, uint64_t seed, float lo, float hi, bool random_sign);
void fill_random_f32(cudaStream_t s, float* p, int64_t n, uint64_t seed, float lo, float hi);

}  // namespace fern::cuda
