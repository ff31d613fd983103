// The forward pass of Qwen3.5/3.6-35B-A3B (MODEL.md section 2), written once over the Backend op table.
#pragma once
#include <functional>

#include "ops/backend.h"

namespace fern {

struct ForwardOptions {
  // Rows of logits to produce: false = only the last token's (prefill, decode), true = every token's (eval).
  bool all_logits = false;
  // Optional hook that sees named intermediate activations ("L7.attn_out", ...) for debugging and diffing.
  std::function<void(const std::string& name, Tensor t)> dump;
};

// Runs tokens ids [T] (I32, on the backend's device) through the model from state.pos, updates the state
// (state.pos += T) and writes logits [1 or T, vocab] (act dtype) into `logits`. The caller calls
// be.begin_forward() first (and takes ids/logits from that arena if it likes); forward only adds scratch.
void forward(Backend& be, const ModelWeights& w, SequenceState& state, Tensor ids, Tensor logits,
             const ForwardOptions& opt = {});

}  // namespace fern
