// What one token costs: bytes read from memory in a decode step and FLOPs, from the loaded weights and the
// config (MODEL.md section 6). Used by `fern bench` to put every tok/s next to its roofline.
#pragma once
#include <cstddef>
#include <cstdint>

#include "model/weights.h"

namespace fern {

struct DecodeCost {
  double weight_bytes = 0;   // weights touched by one token (top-k experts only, lm_head, one embedding row)
  double state_bytes = 0;    // Gated DeltaNet recurrent state read + written, conv state
  double kv_bytes = 0;       // KV cache read at this context (at the given bytes per element)
  double total() const { return weight_bytes + state_bytes + kv_bytes; }
};

// kv_elem_bytes: bytes per cached K or V element on the backend (4 on the CPU, 2 on CUDA).
DecodeCost decode_cost(const ModelWeights& w, int64_t context, int kv_elem_bytes);
// FLOPs of a prefill of n tokens from an empty state (linear layers without lm_head, plus causal attention).
double prefill_flops(const ModelConfig& cfg, const ModelWeights& w, int64_t n);

}  // namespace fern
