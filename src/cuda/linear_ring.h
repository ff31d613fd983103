// The lm_head-sized decode GEMV streamed through a shared-memory ring by bulk copies (linear_ring.cu). Internal to
// the CUDA backend: linear.cu takes it for one token row where linear_ring_ok holds and FERN_CUDA_HEAD_RING asks
// (opt-in: measured slower so far, docs/notes/cuda-decode-v37-head-ring.md).
#pragma once
#include "cuda/kernels.h"

namespace fern::cuda {

// Whether the ring kernel takes w on this device: 4-bit in groups of 64, K a multiple of 512, 16-byte aligned codes,
// scales and biases, sm_90+ (bulk copies), and three stages of one 16-row tile each in a block's shared memory.
bool linear_ring_ok(const Ctx& c, const QW& w);
// y = x W^T for one token row (x: [w.in] fp32, y: [w.out] fp32). Needs linear_ring_ok.
void linear_ring(const Ctx& c, const QW& w, const float* x, float* y);

}  // namespace fern::cuda
