// The generation loop for one sequence: restore the longest cached prefix, prefill the rest (chunked, cancellable),
// then sample/decode until an eos token, a stop string, max_tokens or the context limit. Text is streamed through
// a callback in whole UTF-8 characters with stop strings held back. Owns the working sequence state (allocated
// once at full capacity and reused) and, when given, stores snapshots in a SessionCache.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/json_constraint.h"
#include "engine/sampler.h"
#include "engine/session_cache.h"
#include "engine/token_logprobs.h"
#include "tokenizer/tokenizer.h"

namespace fern {

enum class FinishReason { Stop, Length, Cancelled };
const char* finish_reason_name(FinishReason r);

struct GenerateRequest {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 0;          // 0 = up to the context limit
  SamplingParams sampling;
  std::vector<std::string> stop;   // stop strings (not included in the output)
  bool ignore_eos = false;
  std::string cache_key;           // session (prompt_cache_key); empty = any snapshot may match
  // Prompt positions where a snapshot is stored on the way (message boundaries: the end of the last message, the
  // end of the "<|im_start|>assistant\n" header, the end of the prompt). Ignored without a cache.
  std::vector<int64_t> snapshot_at;
  // After a reply that ends with <|im_end|>, feed "<|im_end|>\n" and store a snapshot of the whole conversation
  // (a chat's next turn starts with exactly these tokens when the template keeps the reply verbatim).
  bool snapshot_reply = false;
  // Test-only (server flag --test-forced-output): these tokens are emitted instead of sampled ones; the model still
  // runs every step. Generation ends after them (they normally end with an eos id).
  std::vector<int32_t> forced;
  // With forced tokens: continue by sampling after them (a forced prefix, e.g. "<tool_call>\n<function=" for
  // tool_choice "required") instead of ending.
  bool forced_is_prefix = false;
  // -1: no log-probabilities. 0..20: each output token's log-probability and that many of the most likely
  // alternatives (token_logprobs.h), reported through on_logprob and in the result. The eos token that ends the
  // generation gets none (it has no text).
  int top_logprobs = -1;
  // Structured output: the reply is a JSON value of this schema (tokens that would break it are never sampled;
  // the eos token only once the value is whole). Forced tokens are not checked.
  std::shared_ptr<const JsonSchema> json_schema;
  bool json_allows_tool_call = false;  // the reply may instead be a tool call ("<tool_call>...", unconstrained)
};

struct GenerateResult {
  FinishReason finish = FinishReason::Stop;
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;       // prompt tokens restored from a snapshot (not prefilled)
  int64_t completion_tokens = 0;   // tokens sampled (the eos token included)
  std::vector<int32_t> output;     // sampled tokens (eos included)
  std::vector<TokenLogprob> logprobs;  // with top_logprobs >= 0: one per output token but a final eos
  std::string text;                // everything passed to on_text
  std::string stop_sequence;       // the stop string that ended the reply (empty when none did)
  double prefill_seconds = 0, decode_seconds = 0, ttft_seconds = 0;
};

struct GeneratorOptions {
  std::vector<int32_t> eos_ids;    // stop generation on any of these
  bool reuse_working_state = true; // continue from the previous sequence when it is a prefix (off with no cache)
};

class Generator {
 public:
  // cache may be null (no snapshots, no reuse).
  Generator(Engine& engine, const Tokenizer& tok, SessionCache* cache, GeneratorOptions opt);
  ~Generator();

  // on_text gets the next piece of output text (never half of a UTF-8 character, never part of a stop string).
  // `cancelled` is polled between prefill chunks and before every decode step. Throws fern::Error on bad input
  // (prompt empty or not shorter than the context) and on model failures (NaN logits).
  // on_logprob (with req.top_logprobs >= 0) gets each token's entry before the token's text goes to on_text.
  GenerateResult generate(const GenerateRequest& req, const std::function<void(const std::string&)>& on_text,
                          const std::function<bool()>& cancelled = {},
                          const std::function<void(const TokenLogprob&)>& on_logprob = {});

  // Drops the working state's contents (the next request starts from a snapshot or from scratch).
  void reset();
  Engine& engine() { return engine_; }
  const Tokenizer& tokenizer() const { return tok_; }
  SessionCache* cache() { return cache_; }
  const std::vector<int32_t>& eos_ids() const { return opt_.eos_ids; }

 private:
  GenerateResult generate_impl(const GenerateRequest& req, const std::function<void(const std::string&)>& on_text,
                               const std::function<bool()>& cancelled,
                               const std::function<void(const TokenLogprob&)>& on_logprob);
  // Brings the working state to tokens[0, n) with n >= `keep` tokens shared; returns how many are already in it.
  int64_t start_from_prefix(const GenerateRequest& req);
  bool is_eos(int32_t t) const;

  Engine& engine_;
  const Tokenizer& tok_;
  SessionCache* cache_;
  GeneratorOptions opt_;
  std::unique_ptr<SequenceState> st_;
  std::vector<int32_t> st_tokens_;  // tokens the working state holds
  std::string st_key_;              // the session key of the request that left them
  // Picks a token that keeps the constrained reply valid: a plain draw first, and when it would break the JSON,
  // another draw from the logits with every such token masked. -1 when no token may come next.
  int32_t sample_constrained(Sampler& sampler, const JsonMatcher& m);

  std::vector<float> logits_;
  std::vector<float> raw_logits_;   // structured output: the logits before the first draw changed them
  LogprobCalculator logprobs_;
  std::unique_ptr<class ConstrainedVocab> vocab_;  // built at the first structured request
  int32_t im_end_ = -1, newline_ = -1;
};

// Snapshot positions for a rendered chat prompt: before the generation prompt's "<|im_start|>" (the end of the
// last message), after its "<|im_start|>assistant\n" header (where the next turn's copy of this reply starts when
// the template drops the thinking), and the end of the prompt.
std::vector<int64_t> chat_snapshot_points(std::span<const int32_t> prompt, const Tokenizer& tok);

// The eos ids to stop on: the model config's (config.json / generation_config.json) plus the tokenizer's
// <|im_end|> and <|endoftext|>, deduplicated.
std::vector<int32_t> default_eos_ids(const ModelConfig& cfg, const Tokenizer& tok);

}  // namespace fern
