// Binding a device-resident LinearWeight to the kernels' plain descriptor (host C++ only).
#pragma once
#include "cuda/kernels.h"
#include "model/weights.h"

namespace fern::cuda {

// Validates the weight for the kernels (throws fern::Error naming the weight).
QW make_qw(const LinearWeight& w);
// make_qw of each of a MoE block's weights, in MoeQW's order.
MoeQW make_moe_qw(const MoeWeights& w);

}  // namespace fern::cuda
