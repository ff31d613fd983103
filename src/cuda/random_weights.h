// A random model of any configuration built directly in GPU memory (see fill.h for what the values are).
#pragma once
#include <memory>

#include "cuda/cuda_backend_impl.h"

namespace fern::cuda {

std::shared_ptr<ModelWeights> random_device_weights(CudaBackend& be, const ModelConfig& cfg, uint64_t seed);

}  // namespace fern::cuda
