// Engine: a loaded model on one backend, running one sequence at a time. It owns the device copy of the
// weights, does chunked prefill (scratch bounded by the chunk size, not the prompt) and single-token decode,
// and hands logits to the host for sampling.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "engine/sampler.h"
#include "model/forward.h"

namespace fern {

struct EngineOptions {
  int64_t prefill_chunk = 0;      // tokens per forward call in prefill (0 = the backend's prefill_chunk_hint)
  int64_t max_context = 0;        // 0 = the model's max_position_embeddings
  // Decode steps recorded once per state and replayed (CUDA graphs) where the backend can record them: the host
  // then issues one launch per token instead of the step's few hundred. FERN_DECODE_GRAPH=0 turns it off.
  bool decode_graph = true;
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
  // One decode step: feeds `token`, writes its logits. With recorded steps (EngineOptions::decode_graph), the first
  // decode of a state runs eagerly and records the step; the following ones replay the record.
  void decode(SequenceState& st, int32_t token, std::vector<float>& logits);
  // Whether decode() replays recorded steps on this backend (false after a recording failed).
  bool decode_graph() const { return graph_; }
  // Decode steps replayed from a record / recordings made (for tests and the benchmark's notes).
  int64_t replayed_steps() const { return replayed_; }
  int64_t recorded_steps() const { return recorded_; }
  // ---- decode with the next token picked by the engine ----
  // A request's tokens drawn from one stream (pick_uniform(seed, 0), (seed, 1), ...) by Sampler::sample_at's rule:
  // picked by the backend where the logits are when it can (no logits copied to the host), on the host otherwise.
  // can_pick: parameters this serves (top-k <= 64, at most 1,024 logit-bias entries); the rest goes through
  // decode() and a Sampler. The penalties count the tokens fed through decode_pick (and the prompt, for the
  // repetition penalty), as a Sampler that accept()s every token fed back.
  static bool can_pick(const SamplingParams& p);
  // Starts a request's picks (the seed from p.seed, else random); end_pick() ends them (decode() works either way).
  void begin_pick(const SamplingParams& p, std::span<const int32_t> prompt = {});
  void end_pick();
  // The next token from logits the host already holds (the prefill's): the next draw, on the host.
  int32_t pick_host(std::vector<float>& logits);
  // One decode step that feeds `token` and returns the token picked from its logits. `logits` is scratch: filled
  // only when the host had to pick (see Backend::picked).
  int32_t decode_pick(SequenceState& st, int32_t token, std::vector<float>& logits);
  // Picks the backend made / left to the host since construction (for tests and the benchmark's notes).
  int64_t device_picks() const { return device_picks_; }
  int64_t host_picks() const { return host_picks_; }

  // Teacher-forced logits for every position of `tokens` (F32 [T, vocab] row-major), chunked.
  void logits_all(SequenceState& st, std::span<const int32_t> tokens, std::vector<float>& logits);

 private:
  void run_chunk(SequenceState& st, std::span<const int32_t> tokens, bool all_logits, float* out);
  void logits_to_host(Tensor dev_logits, float* out);
  // Runs one step that feeds `token` (recorded or eager), leaving its logits in step_logits_.
  void step(SequenceState& st, int32_t token);
  std::unique_ptr<Backend> backend_;
  std::shared_ptr<const ModelWeights> host_weights_;
  std::shared_ptr<const ModelWeights> weights_;
  EngineOptions opt_;
  int64_t max_context_ = 0;
  // Recorded decode steps: the token slot and logits the record reads and writes (alloc()ed once).
  bool graph_ = false;
  Tensor step_ids_, step_logits_;
  int32_t slot_token_ = -1;  // what step_ids_ holds (-1: unknown)
  int64_t replayed_ = 0, recorded_ = 0;
  // The request's picks: its parameters (for the host's picks), draws made, and whether the backend picks.
  std::unique_ptr<Sampler> pick_sampler_;
  PickParams pick_;
  std::vector<int32_t> pick_prompt_, fed_;  // for the penalties: the prompt, the tokens fed through decode_pick
  bool picking_ = false, device_pick_ = false;
  int64_t device_picks_ = 0, host_picks_ = 0;
};

}  // namespace fern
