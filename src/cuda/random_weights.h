// A random model of any configuration built directly in GPU memory (see fill.h for what the values are).
#pragma once
#include <memory>
#include <string>

#include "cuda/cuda_backend_impl.h"

namespace fern::cuda {

std::shared_ptr<ModelWeights> random_device_weights(CudaBackend& be, const ModelConfig& cfg, uint64_t seed);

// One random affine weight (4 or 8 bit, group 64) in GPU memory: codes uniform, scales +-U(0.5, 1.5) * 1.7 /
// (qmax sqrt(in)) so that a row's dot with a unit-size input has about unit size, small biases. `seed` advances.
LinearWeight random_device_affine(CudaBackend& be, const std::string& name, int64_t experts, int64_t out, int64_t in,
                                  int bits, uint64_t& seed);

}  // namespace fern::cuda
