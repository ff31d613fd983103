#include "engine/engine.h"

#include <algorithm>
#include <random>

#include "core/bf16.h"
#include "core/env.h"
#include "core/log.h"

namespace fern {

Engine::Engine(std::unique_ptr<Backend> backend, std::shared_ptr<const ModelWeights> host_weights,
               EngineOptions opt)
    : backend_(std::move(backend)), host_weights_(std::move(host_weights)), opt_(opt) {
  weights_ = backend_->upload(host_weights_);
  max_context_ = opt_.max_context > 0 ? opt_.max_context : weights_->config.max_position_embeddings;
  set_prefill_chunk(opt_.prefill_chunk);
  graph_ = env_choice("FERN_DECODE_GRAPH", {"0", "1"}, opt_.decode_graph ? 1 : 0) == 1 &&
           backend_->can_record_steps();
}

void Engine::set_prefill_chunk(int64_t tokens) {
  FERN_CHECK(tokens >= 0, "prefill chunk {}: expected a positive number of tokens (0 = the backend's choice)", tokens);
  opt_.prefill_chunk = tokens > 0 ? tokens : backend_->prefill_chunk_hint();
}

Engine::~Engine() = default;

std::unique_ptr<SequenceState> Engine::new_state(int64_t capacity) {
  auto st = backend_->new_state(config(), capacity > 0 ? capacity : max_context_);
  backend_->reset_state(*st);
  return st;
}

void Engine::run_chunk(SequenceState& st, std::span<const int32_t> tokens, bool all_logits, float* out) {
  const int64_t T = static_cast<int64_t>(tokens.size());
  const int64_t V = config().vocab_size;
  const int64_t rows = all_logits ? T : 1;
  // ids and logits are staged through the backend's scratch arena, reset here once per forward call.
  std::vector<int32_t> ids(tokens.begin(), tokens.end());
  Tensor host_ids(ids.data(), DType::I32, {T});
  backend_->begin_forward();
  Tensor dev_ids = backend_->scratch(DType::I32, {T});
  Tensor dev_logits = backend_->scratch(backend_->act_dtype(), {rows, V});
  backend_->copy(dev_ids, host_ids);
  ForwardOptions fo;
  fo.all_logits = all_logits;
  forward(*backend_, *weights_, st, dev_ids, dev_logits, fo);
  logits_to_host(dev_logits, out);
}

void Engine::logits_to_host(Tensor dev_logits, float* out) {
  const int64_t rows = dev_logits.dim(0), V = dev_logits.dim(1);
  if (backend_->act_dtype() == DType::F32) {
    backend_->copy(Tensor(out, DType::F32, {rows, V}), dev_logits);
  } else {
    FERN_CHECK(backend_->act_dtype() == DType::BF16, "act dtype {}", dtype_name(backend_->act_dtype()));
    std::vector<uint16_t> tmp(static_cast<size_t>(rows * V));
    backend_->copy(Tensor(tmp.data(), DType::BF16, {rows, V}), dev_logits);
    for (size_t i = 0; i < tmp.size(); ++i) out[i] = bf16_to_f32(tmp[i]);
  }
}

// The step reads its token from step_ids_ and writes step_logits_, both at fixed addresses, then picks the next
// token into step_ids_ where the backend picks (Backend::pick does nothing otherwise). With recorded steps the host
// writes the token, replays and reads the result; the first decode of a state (or of another state than the
// record's) runs the step eagerly, which also sizes the scratch the record uses, and then records it; a failed
// recording leaves eager steps for the rest of the engine's life.
void Engine::step(SequenceState& st, int32_t token) {
  if (step_ids_.empty()) {
    step_ids_ = backend_->alloc(DType::I32, {1});
    step_logits_ = backend_->alloc(backend_->act_dtype(), {1, config().vocab_size});
  }
  // A token the backend picked is in the slot already: no copy (on CUDA a pageable copy waits for the stream).
  if (token != slot_token_) backend_->copy(step_ids_, Tensor(&token, DType::I32, {1}));
  slot_token_ = token;
  if (graph_ && backend_->holds_step_for(st)) {
    backend_->replay(st);
    ++replayed_;
    return;
  }
  SequenceState* s = &st;
  auto run = [this, s] {
    backend_->begin_forward();
    forward(*backend_, *weights_, *s, step_ids_, step_logits_);
    backend_->pick(step_ids_, step_logits_);
  };
  run();
  if (!graph_) return;
  try {
    backend_->capture_step(st, run);
    ++recorded_;
  } catch (const Error& e) {
    graph_ = false;
    log::warn("decode steps run eagerly from now on: recording one failed ({})", e.what());
  }
}

void Engine::decode(SequenceState& st, int32_t token, std::vector<float>& logits) {
  logits.resize(static_cast<size_t>(config().vocab_size));
  if (device_pick_) {  // a step of a picking request whose logits the caller wants: the backend does not pick
    backend_->clear_pick();
    device_pick_ = false;
  }
  if (!graph_) {
    run_chunk(st, std::span<const int32_t>(&token, 1), false, logits.data());
    return;
  }
  step(st, token);
  logits_to_host(step_logits_, logits.data());
}

bool Engine::can_pick(const SamplingParams& p) {
  return p.top_k <= kPickMaxTopK && p.logit_bias.size() <= size_t(kPickMaxBias);
}

void Engine::begin_pick(const SamplingParams& p, std::span<const int32_t> prompt) {
  FERN_CHECK(can_pick(p), "begin_pick with parameters it does not serve");
  SamplingParams sp = p;
  if (!sp.seed) sp.seed = std::random_device{}() * 0x100000001ull ^ std::random_device{}();
  pick_sampler_ = std::make_unique<Sampler>(sp);
  pick_sampler_->set_prompt(prompt);
  // Only the repetition penalty looks at the prompt (as in Sampler::set_prompt).
  pick_prompt_.clear();
  if (p.repetition_penalty != 1.0f) pick_prompt_.assign(prompt.begin(), prompt.end());
  fed_.clear();
  pick_ = pick_params(sp, config().vocab_size);
  picking_ = true;
  device_pick_ = false;
}

void Engine::end_pick() {
  if (device_pick_) backend_->clear_pick();
  device_pick_ = picking_ = false;
  pick_sampler_.reset();
  pick_prompt_.clear();
  fed_.clear();
}

int32_t Engine::pick_host(std::vector<float>& logits) {
  FERN_CHECK(picking_, "pick_host outside begin_pick / end_pick");
  ++host_picks_;
  return pick_sampler_->sample_at(logits, pick_uniform(pick_.seed, pick_.draw++));
}

int32_t Engine::decode_pick(SequenceState& st, int32_t token, std::vector<float>& logits) {
  FERN_CHECK(picking_, "decode_pick outside begin_pick / end_pick");
  const auto& sp = pick_sampler_->params();
  if (!device_pick_ && backend_->can_pick(pick_, sp.logit_bias.size(), config().vocab_size)) {
    // From the next draw on; the token fed now is counted by the pick of its step, as it is below.
    backend_->set_pick(pick_, sp.logit_bias, pick_prompt_, fed_);
    device_pick_ = true;
  }
  pick_sampler_->accept(token);
  fed_.push_back(token);
  if (!device_pick_) {
    decode(st, token, logits);
    return pick_host(logits);
  }
  step(st, token);
  slot_token_ = -1;  // unknown until the pick is read (an error in between leaves it so)
  const int32_t t = backend_->picked();
  slot_token_ = t >= 0 ? t : token;
  if (t >= 0) {
    ++pick_.draw;  // the backend's draw counter moved with it
    ++device_picks_;
    return t;
  }
  // NaN logits (the host's pick fails with the error) or a nucleus past the device's candidates: the same draw on the
  // host, from the same logits.
  logits.resize(static_cast<size_t>(config().vocab_size));
  logits_to_host(step_logits_, logits.data());
  return pick_host(logits);
}

bool Engine::prefill(SequenceState& st, std::span<const int32_t> tokens, std::vector<float>& logits,
                     const std::function<bool()>& cancelled) {
  FERN_CHECK(!tokens.empty(), "prefill of no tokens");
  logits.resize(static_cast<size_t>(config().vocab_size));
  for (size_t off = 0; off < tokens.size();) {
    if (cancelled && cancelled()) return false;
    size_t n = std::min(tokens.size() - off, static_cast<size_t>(opt_.prefill_chunk));
    run_chunk(st, tokens.subspan(off, n), false, logits.data());
    off += n;
  }
  return true;
}

void Engine::logits_all(SequenceState& st, std::span<const int32_t> tokens, std::vector<float>& logits) {
  const size_t V = static_cast<size_t>(config().vocab_size);
  logits.resize(tokens.size() * V);
  for (size_t off = 0; off < tokens.size();) {
    size_t n = std::min(tokens.size() - off, static_cast<size_t>(opt_.prefill_chunk));
    run_chunk(st, tokens.subspan(off, n), true, logits.data() + off * V);
    off += n;
  }
}

}  // namespace fern
