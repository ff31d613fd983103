// Engine: a loaded model on one backend, running one sequence at a time. It owns the device copy of the
// weights, does chunked prefill (scratch bounded by the chunk size, not the prompt) and single-token decode,
// and hands logits to the host for sampling.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "model/forward.h"

namespace fern {

struct EngineOptions {
  int64_t prefill_chunk = 0;      // tokens per forward call in prefill (0 = the backend's prefill_chunk_hint)
  int64_t max_context = 0;        // 0 = the model's max_position_embeddings
};

class Engine {
 public:
  Engine(std::unique_ptr<Backend> backend, std::shared_ptr<const ModelWeights> host_weights, EngineOptions opt = {});
  ~Engine();

  const ModelConfig& config() const { return weights_->config; }
  Backend& backend() { return *backend_; }
  const ModelWeights& weights() const { return *weights_; }
  int64_t max_context() const { return max_context_; }
  int64_t prefill_chunk() const { return opt_.prefill_chunk; }
  // Changes the prefill chunk for later calls (>= 1; 0 = the backend's hint). Throws fern::Error.
  void set_prefill_chunk(int64_t tokens);

  std::unique_ptr<SequenceState> new_state(int64_t capacity = 0);  // 0 = max_context()
  // Feeds `tokens` from state.pos in chunks; writes the last token's logits (F32, vocab) into `logits`.
  // Returns false (state then holds a consistent prefix) if `cancelled` returned true between chunks.
  bool prefill(SequenceState& st, std::span<const int32_t> tokens, std::vector<float>& logits,
               const std::function<bool()>& cancelled = {});
  // One decode step: feeds `token`, writes its logits.
  void decode(SequenceState& st, int32_t token, std::vector<float>& logits);
  // Teacher-forced logits for every position of `tokens` (F32 [T, vocab] row-major), chunked.
  void logits_all(SequenceState& st, std::span<const int32_t> tokens, std::vector<float>& logits);

 private:
  void run_chunk(SequenceState& st, std::span<const int32_t> tokens, bool all_logits, float* out);
  std::unique_ptr<Backend> backend_;
  std::shared_ptr<const ModelWeights> host_weights_;
  std::shared_ptr<const ModelWeights> weights_;
  EngineOptions opt_;
  int64_t max_context_ = 0;
};

}  // namespace fern
