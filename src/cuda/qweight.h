// Binding a device-resident LinearWeight to the kernels' plain descriptor (host C++ only).
#pragma once
#include "cuda/kernels.h"
#include "model/weights.h"

namespace fern::cuda {

// Validates the weight for the kernels (throws fern::Error naming the weight).
QW make_qw(const LinearWeight& w);

}  // namespace fern::cuda
