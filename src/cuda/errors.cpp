// Error helpers for the .cu files, and the validation of device weights for the kernels (this file is plain C++
// so that it can format messages with fmt).
#include <cstdint>

#include "core/error.h"
#include "cuda/cuda_check.h"
#include "cuda/qweight.h"

namespace fern::cuda {

void raise_error(const std::string& msg) { throw Error(msg); }
void raise_internal(const std::string& msg) { throw InternalError("CUDA backend: " + msg); }

void check(cudaError_t e, const char* what, const char* file, int line) {
  if (e != cudaSuccess) fail("CUDA error in {} ({}:{}): {}", what, file, line, cudaGetErrorString(e));
}

MoeQW make_moe_qw(const MoeWeights& w) {
  return {make_qw(w.router), make_qw(w.shared_expert_gate), make_qw(w.gate),        make_qw(w.up),
          make_qw(w.down),   make_qw(w.shared_gate),        make_qw(w.shared_up), make_qw(w.shared_down)};
}

QW make_qw(const LinearWeight& w) {
  FERN_CHECK(!w.empty(), "empty weight {}", w.name);
  FERN_CHECK(w.w.device == Device::Cuda, "weight {} is not on the GPU", w.name);
  QW q;
  q.w = w.w.data;
  q.out = w.out;
  q.in = w.in;
  q.experts = static_cast<int>(w.experts);
  if (w.kind == LinearWeight::Kind::Dense) {
    if (w.w.dtype != DType::BF16) fail("weight {}: dense weights must be BF16, got {}", w.name, dtype_name(w.w.dtype));
    if (w.in % 8 != 0) fail("weight {}: input width {} is not a multiple of 8", w.name, w.in);
    q.bits = 16;
    q.w_expert = w.expert_stride > 0 ? w.expert_stride : w.out * w.in;
  } else {
    if (w.bits != 4 && w.bits != 8) fail("weight {}: {}-bit affine weights are not supported", w.name, w.bits);
    const int elems = 128 / w.bits;
    // Power-of-two chunks per group: the kernels find a chunk's group with a shift (qdot.cuh).
    const int64_t cpg = w.group_size / elems;
    if (w.group_size <= 0 || w.group_size % elems != 0 || w.in % w.group_size != 0 || (cpg & (cpg - 1)) != 0)
      fail("weight {}: group size {} with input width {} is not supported", w.name, w.group_size, w.in);
    q.bits = w.bits;
    q.gs = w.group_size;
    q.s = static_cast<const uint16_t*>(w.scales.data);
    q.b = static_cast<const uint16_t*>(w.biases.data);
    q.w_expert = w.expert_stride > 0 ? w.expert_stride : w.out * w.in * w.bits / 32;
    q.sb_expert = w.out * (w.in / w.group_size);
  }
  // 16-byte loads need 16-byte aligned rows and experts.
  FERN_CHECK(reinterpret_cast<uintptr_t>(q.w) % 16 == 0, "weight {} is not 16-byte aligned", w.name);
  FERN_CHECK((q.w_expert * (q.bits == 16 ? 2 : 4)) % 16 == 0, "weight {}: expert stride not 16-byte aligned", w.name);
  return q;
}

}  // namespace fern::cuda
